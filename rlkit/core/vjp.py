"""One vector-Jacobian product rule per differentiable op, all in this one table.

A rule takes ``(g, out, *inputs, **attrs)``: the gradient flowing into the op's output, the
output itself, the op's inputs and the attributes its op function recorded. It returns one
gradient per input (None where no gradient flows; slice_rows' a :class:`RowBlock`). A gradient
may keep the output's broadcast shape: the backward walker sums it back to the input's shape,
once, for every op.

The ops that have a rule are those marked ``grad`` in native/ops.def (``ops.DIFFERENTIABLE``);
tests/test_op_table.py fails when a ``grad`` op has no rule or a ``no_grad`` op has one.
"""

from __future__ import annotations

from rlkit.core import ops


class RowBlock:
    """slice_rows' gradient: ``g`` as the rows [start, start + g's rows) of a tensor of ``rows``
    rows, zero elsewhere. The backward walker keeps the blocks of one tensor at their own size and
    concatenates them once, with zeros between (a packed op's outputs are such slices: padding
    each block to the whole and adding them would write the whole once per block and read it
    back); :meth:`dense` is the rule's plain form."""

    __slots__ = ("g", "start", "rows")

    def __init__(self, g, start: int, rows: int):
        self.g, self.start, self.rows = g, start, rows

    @property
    def stop(self) -> int:
        """One past the block's last row."""
        return self.start + self.g.shape[0]

    def dense(self):
        """The gradient of the whole tensor: g padded with zero rows."""
        return ops.pad_rows(self.g, self.start, self.rows - self.stop)


def _matmul(g, out, a, b, transpose_a, transpose_b):
    # C = op(A) op(B): each case keeps the products in the layout the gemm reads directly.
    if not transpose_a and not transpose_b:
        return ops.matmul(g, b, transpose_b=True), ops.matmul(a, g, transpose_a=True)
    if transpose_a and not transpose_b:
        return ops.matmul(b, g, transpose_b=True), ops.matmul(a, g)
    if not transpose_a and transpose_b:
        return ops.matmul(g, b), ops.matmul(g, a, transpose_a=True)
    return ops.matmul(b, g, transpose_a=True, transpose_b=True), ops.matmul(g, a, transpose_a=True, transpose_b=True)


def _rwkv_wkv7(g, out, r, w, k, v, a, b, state):
    # one helper op gives every gradient, packed: r, w, k, v, a, b (each like r), then state
    grads = ops.apply("rwkv_wkv7_back", (g, r, w, k, v, a, b, state))  # [S*H, 6T + S*n_seqs]
    return tuple(ops._unpack_columns(grads, [(r.numel, r.shape)] * 6 + [(state.numel, state.shape)]))


def _wkv7_chunk_terms(g, out, r, k, v, a, b, log_decay, chunk, n_seqs):
    # one helper op gives every gradient, packed in the inputs' order; it reads the forward's W and U
    grads = ops.apply("wkv7_chunk_terms_back", (g, r, k, v, a, b, log_decay, out), ints=(chunk, n_seqs))  # a column
    return tuple(ops._unpack_columns(grads, [(r.numel, r.shape)] * 6))


def _wkv7_chunk_states(g, out, W, U, B, K, V, decay, Z0):
    # one helper op gives every gradient, packed in the inputs' order; it reads the forward's states
    grads = ops.apply("wkv7_chunk_states_back", (g, W, U, B, K, V, decay, Z0, out))  # a column
    return tuple(ops._unpack_columns(grads, [(t.numel, t.shape) for t in (W, U, B, K, V, decay, Z0)]))


def _gla_chunks(g, out, k, v, q, log_gate, state, chunk, scale):
    # one helper op gives every gradient, packed in the inputs' order; it reads the forward's start states
    grads = ops.apply("gla_chunks_back", (g, k, v, q, log_gate, state, out), ints=(chunk,), floats=(scale,))
    return tuple(ops._unpack_columns(grads, [(t.numel, t.shape) for t in (k, v, q, log_gate, state)]))


def _ssd_chunks(g, out, u, log_decay, B, C, first, chunk):
    # one helper op gives every gradient, packed in the inputs' order (it computes the start states again)
    grads = ops.apply("ssd_chunks_back", (g, u, log_decay, B, C, first), ints=(chunk,))
    return tuple(ops._unpack_columns(grads, [(t.numel, t.shape) for t in (u, log_decay, B, C, first)]))


def _linear(g, out, w, x, b, activation):
    # the activation's derivative from its output, then the matmul's and the bias's gradients
    if activation is not None:
        g = ops.apply(f"{activation}_back", (g, out))  # relu' from out > 0, tanh' = 1 - out^2, sigmoid' = out (1 - out)
    return ops.matmul(g, x, transpose_b=True), ops.matmul(w, g, transpose_a=True), g


def _first_max_mask(x):
    """1 at the first maximum of each column of x, 0 elsewhere; shaped like x."""
    return ops.reshape(ops.one_hot(ops.argmax(x), x.shape[0], dtype=x.dtype), x.shape)


def _ssm_scan(g, out, s, x, dt, A, B, C, ids):
    # ssm_scan_back packs every gradient (layout: native/ssm_scan.hpp); the per-sequence,
    # per-head and per-token partial sums are added up here.
    d_state, n_group = B.shape[0], B.shape[1]
    head_dim, n_head, n_tok, n_seqs = ops._ne4(x)
    n_rs, columns = ops._ne4(s)[3], n_tok * n_seqs
    grads = ops.apply("ssm_scan_back", (g, s, x, dt, A, B, C, ids))  # a column
    per_head = (d_state, n_head // n_group, n_group, columns)  # [d_state, n_head, n_tok, n_seqs]
    g_initial, g_x, g_dt, g_a, g_b, g_c = ops._unpack_columns(grads, [
        (d_state * head_dim * n_head * n_seqs, (d_state * head_dim * n_head, n_seqs)),  # a column per sequence
        (x.numel, x.shape), (dt.numel, dt.shape),
        (d_state * n_head * columns, (d_state, n_head, columns)),
        (d_state * n_head * columns, per_head), (d_state * n_head * columns, per_head),
    ])
    g_s = ops.reshape(ops.scatter_cols(g_initial, ids, n_rs), s.shape)  # summed over the sequences sharing a state
    g_a = ops.reshape(ops.sum_to(g_a, (A.shape[0], n_head, 1)), A.shape)

    def summed_per_group(t):
        return ops.reshape(ops.sum_to(t, (d_state, 1, n_group, columns)), B.shape)

    return g_s, g_x, g_dt, g_a, summed_per_group(g_b), summed_per_group(g_c), None


def _recurrence_grads(packed, k, state, with_bonus: bool):
    """Slices a recurrence's _back output: the gradients of the four [S, H, T] inputs, the bonus
    (summed over sequences) when there is one, and the state (layout: native/ops.def)."""
    rows, n_seqs = k.shape[0] * k.shape[1], state.shape[1]
    layout = [(k.numel, k.shape)] * 4 + ([(rows * n_seqs, (rows, n_seqs))] if with_bonus else []) + [(state.numel, state.shape)]
    blocks = ops._unpack_columns(packed, layout)
    bonus = ops.reshape(ops.sum_to(blocks[4], (rows, 1)), (k.shape[0], k.shape[1])) if with_bonus else None
    return blocks[:4], bonus, blocks[-1]


def _rwkv_wkv6(g, out, k, v, r, tf, td, state):
    packed = ops.apply("rwkv_wkv6_back", (g, k, v, r, tf, td, state))
    (gk, gv, gr, gtd), gtf, gstate = _recurrence_grads(packed, k, state, with_bonus=True)
    return gk, gv, gr, gtf, gtd, gstate


def _gated_linear_attn(g, out, k, v, q, gate, state, scale):
    packed = ops.apply("gated_linear_attn_back", (g, k, v, q, gate, state), floats=(scale,))
    (gk, gv, gq, ggate), _, gstate = _recurrence_grads(packed, k, state, with_bonus=False)
    return gk, gv, gq, ggate, gstate


def _conv2d(g, out, x, w, *bias, conv, activation):
    # the activation's derivative from the output (as linear's), then the convolution's gradients:
    # the input's only where it is wanted (an image batch often is not: an observation), the
    # bias's summed over pixels and images
    if activation is not None:
        g = ops.apply(f"{activation}_back", (g, out))  # [W', H', C_out, N]
    input_wh, kernel_wh = ops._ne4(x)[:2], ops._ne4(w)[:2]
    gx = ops.apply("conv2d_input_back", (g, w), ints=conv + input_wh) if x.requires_grad else None
    gw = ops.apply("conv2d_weight_back", (g, x), ints=conv + kernel_wh) if w.requires_grad else None
    if not bias:
        return gx, gw
    b = bias[0]
    gb = ops.reshape(ops.sum_to(g, (1, 1, ops._ne4(w)[3], 1)), b.shape) if b.requires_grad else None
    return gx, gw, gb


VJP = {
    "add": lambda g, out, a, b: (g, g),
    "sub": lambda g, out, a, b: (g, ops.neg(g)),
    "mul": lambda g, out, a, b: (ops.mul(g, b), ops.mul(g, a)),
    "div": lambda g, out, a, b: (ops.div(g, b), ops.neg(ops.div(ops.mul(g, out), b))),
    "minimum": lambda g, out, a, b: (ops.mul(g, ops.ge(b, a)), ops.mul(g, ops.gt(a, b))),
    "maximum": lambda g, out, a, b: (ops.mul(g, ops.ge(a, b)), ops.mul(g, ops.gt(b, a))),
    "neg": lambda g, out, x: (ops.neg(g),),
    "relu": lambda g, out, x: (ops.apply("relu_back", (g, x)),),
    "leaky_relu": lambda g, out, x, negative_slope: (ops.apply("leaky_relu_back", (g, x), floats=(negative_slope,)),),
    "sigmoid": lambda g, out, x: (ops.apply("sigmoid_back", (g, out)),),
    "tanh": lambda g, out, x: (ops.apply("tanh_back", (g, out)),),
    "softplus": lambda g, out, x: (ops.mul(g, ops.sigmoid(x)),),
    "silu": lambda g, out, x: (ops.apply("silu_back", (g, x)),),
    "exp": lambda g, out, x: (ops.mul(g, out),),
    "log": lambda g, out, x: (ops.div(g, x),),
    "sqrt": lambda g, out, x: (ops.div(ops.scale(g, 0.5), out),),
    "square": lambda g, out, x: (ops.mul(g, ops.scale(x, 2.0)),),
    "sum_squares": lambda g, out, *xs: tuple(ops.mul(g, ops.scale(x, 2.0)) for x in xs),
    "abs": lambda g, out, x: (ops.mul(g, ops.sign(x)),),
    "scale": lambda g, out, x, s: (ops.scale(g, s),),
    "pow": lambda g, out, x, p: (ops.mul(g, ops.scale(ops.pow(x, p - 1.0), p)),),
    "clamp": lambda g, out, x, lo, hi: (ops.apply("clamp_back", (g, x), floats=(lo, hi)),),
    "huber": lambda g, out, x, delta: (ops.mul(g, ops.clamp(x, -delta, delta)),),
    "cast": lambda g, out, x, dtype: (ops.cast(g, dtype),),
    "matmul": _matmul,
    "linear": _linear,
    "sum_to": lambda g, out, x: (ops.expand(g, x.shape),),
    "expand": lambda g, out, x: (ops.sum_to(g, x.shape),),
    "softmax": lambda g, out, x: (ops.apply("softmax_back", (g, out)),),
    "log_softmax": lambda g, out, x: (ops.apply("log_softmax_back", (g, out)),),
    "max": lambda g, out, x: (ops.mul(ops.expand(g, x.shape), _first_max_mask(x)),),
    "softmax_cross_entropy": lambda g, out, logits, target: (
        ops.mul(ops.sub(ops.softmax(logits), target), ops.scale(g, 1.0 / logits.shape[1])),
        ops.mul(ops.log_softmax(logits), ops.scale(g, -1.0 / logits.shape[1])),
    ),
    "transpose": lambda g, out, x: (ops.transpose(g),),
    "permute": lambda g, out, x, dims: (ops.permute(g, tuple(sorted(range(len(dims)), key=dims.__getitem__))),),
    "reshape": lambda g, out, x: (ops.reshape(g, x.shape),),
    "slice_rows": lambda g, out, x, start, n: (RowBlock(g, start, x.shape[0]),),
    "pad_rows": lambda g, out, x, before, after: (ops.slice_rows(g, before, x.shape[0]),),
    "concat_rows": lambda g, out, a, b: (ops.slice_rows(g, 0, a.shape[0]), ops.slice_rows(g, a.shape[0], b.shape[0])),
    "gather": lambda g, out, x, index: (ops.mul(ops.expand(g, x.shape), ops.one_hot(index, x.shape[0], x.dtype)), None),
    "get_rows": lambda g, out, x, index, columns: (ops.scatter_cols(g, index, columns), None),
    "scatter_cols": lambda g, out, src, index: (ops.get_rows(g, index), None),
    "ssm_conv": lambda g, out, sx, c: (ops.apply("ssm_conv_sx_back", (g, c)), ops.apply("ssm_conv_c_back", (g, sx))),
    "ssm_scan": _ssm_scan,
    "rwkv_wkv6": _rwkv_wkv6,
    "gated_linear_attn": _gated_linear_attn,
    "rwkv_wkv7": _rwkv_wkv7,
    "wkv7_chunk_terms": _wkv7_chunk_terms,
    "wkv7_chunk_states": _wkv7_chunk_states,
    "gla_chunks": _gla_chunks,
    "ssd_chunks": _ssd_chunks,
    "conv2d": _conv2d,
    "max_pool2d": lambda g, out, x, pool: (ops.apply("max_pool2d_back", (g, x), ints=pool),),
}
