"""The state-space and RWKV recurrences, with ggml's shapes and argument order: Mamba's causal
convolution and selective scan, RWKV-6's and RWKV-7's time mixing, gated linear attention. Each
is one op of the native table (its backward pass a helper op, its vjp rule in vjp.py), and
ssm_scan, gated_linear_attn and rwkv_wkv7 have a chunked form beside the exact recurrence:
ssm_scan's and gated_linear_attn's each one op of its own (ssd_chunks, gla_chunks), rwkv_wkv7's
two ops (each chunk's own terms, wkv7_chunk_terms; the states passed from chunk to chunk,
wkv7_chunk_states) and the outputs' matrix products.
"""

from __future__ import annotations

import math
import numbers

from rlkit.core.ops import (
    _index, _int_arg, _ne4, _unpack_columns, add, apply, arange, as_tensor, cast, check_inputs, get_rows, log,
    matmul, maximum, mul, permute, reshape, slice_rows, softplus,
)
from rlkit.core.tensor import Tensor

SSD_MAX_CHUNK = 64
"""The longest chunk ssm_scan's chunked form takes (native/ssd_chunks.hpp: kSsdMaxChunk)."""


def ssm_conv(sx, c) -> Tensor:
    """Mamba's causal depthwise convolution, as ggml_ssm_conv: ``sx`` [d_conv - 1 + n_t,
    d_inner, n_s] is each sequence's conv state followed by its n_t steps along dim 0, ``c``
    [d_conv, d_inner] one filter per channel; out[i, t, s] = sum_k sx[t + k, i, s] c[k, i],
    shaped [d_inner, n_t, n_s]. Differentiable in both. (The new conv state is the last
    d_conv - 1 steps of sx; the caller adds the bias and the activation.)"""
    sx = as_tensor(sx, op="ssm_conv", arg="sx")
    return apply("ssm_conv", (sx, as_tensor(c, like=sx, op="ssm_conv", arg="c")))


def ssm_scan(s, x, dt, A, B, C, ids=None, chunk_size: int | None = None) -> tuple[Tensor, Tensor]:
    """Mamba's selective scan, as ggml_ssm_scan (shapes in ne order):

    - ``s`` [d_state, head_dim, n_head, n_rs]: initial states; sequence q starts from s[..., ids[q]]
    - ``x`` [head_dim, n_head, n_tok, n_seqs], ``dt`` [n_head, n_tok, n_seqs] (raw: softplus is
      applied inside, ``dt`` > 20 taken as is)
    - ``A`` [1, n_head] (Mamba-2: one decay rate per head) or [d_state, n_head] (Mamba-1)
    - ``B``, ``C`` [d_state, n_group, n_tok, n_seqs]; head h reads group h // (n_head // n_group)
    - ``ids`` i32 [n_seqs]; None means sequence q starts from state q (then n_rs = n_seqs)

    Per token: S = S * exp(softplus(dt) A) + B (x softplus(dt)), y = C . S. Returns
    (y like x, final states [d_state, head_dim, n_head, n_seqs]); differentiable in every float
    input, the initial states included.

    ``chunk_size`` None (the default) runs the exact recurrence, token by token. An int (1 to 64)
    runs Mamba-2's chunked form (SSD) for A [1, n_head], one op (ssd_chunks): within each chunk of
    that many tokens the outputs are products of [chunk, chunk] matrices (C^T B times the decays
    between tokens) with the chunk's inputs, every chunk's at once, and only the chunks' states
    pass from chunk to chunk, so the work is matrix products rather than a loop over tokens. The
    same function in another order of sums: within a few f32 roundings of the recurrence
    (tests/test_ssm.py bounds both against float64). A NaN or an infinity in one token reaches the
    outputs of its head in its sequence from that token on, and its final state, as in the
    recurrence."""
    x = as_tensor(x, op="ssm_scan", arg="x")
    s, dt, A, B, C = (as_tensor(t, like=x, op="ssm_scan", arg=name) for t, name in
                      ((s, "s"), (dt, "dt"), (A, "A"), (B, "B"), (C, "C")))
    d_state, (head_dim, n_head, _, n_seqs), n_rs = _ne4(B)[0], _ne4(x), _ne4(s)[3]
    if ids is None:
        if n_rs != n_seqs:
            raise ValueError(f"ssm_scan: without ids, s must hold one state per sequence (s.shape[3] = {n_seqs}), "
                             f"got {n_rs}; pass ids to pick states")
        ids = reshape(cast(arange(n_seqs, device=x.device), "i32"), (n_seqs,))  # on the device: traceable
    ids = _index(ids, "ssm_scan", x.device, n_rs, "states of s")
    if chunk_size is not None:
        check_inputs("ssm_scan", (s, x, dt, A, B, C, ids))
        return _ssd_scan(s, x, dt, A, B, C, ids, chunk_size)
    packed = apply("ssm_scan", (s, x, dt, A, B, C, ids))  # one column [y, final states]
    n_y, n_final = math.prod(_ne4(x)), d_state * head_dim * n_head * n_seqs
    y, final_state = _unpack_columns(packed, [(n_y, x.shape), (n_final, (d_state, head_dim, n_head, n_seqs))])
    return y, final_state


def _chunks(op: str, chunk_size, n_tok: int) -> tuple[int, int]:
    """(tokens per chunk, chunks per sequence) for a chunked form's ``chunk_size`` argument; the
    last chunk is padded with tokens that leave the state as it is, so the final state is exact."""
    chunk_size = _int_arg(chunk_size, op, "chunk_size")
    if chunk_size < 1:
        raise ValueError(f"{op}: chunk_size must be at least 1 (or None for the recurrence), got {chunk_size}")
    chunk = min(chunk_size, n_tok)
    return chunk, -(-n_tok // chunk)


def _out_of_chunks(t: Tensor, size: int, n_tok: int, n_seqs: int) -> Tensor:
    """Outputs of ``size`` elements per token, t [size, c chunk, n_seqs] (any shape of those
    elements; each sequence padded to c chunks), with the padding's tokens dropped, as
    [size * n_tok, n_seqs] (t itself where there was no padding)."""
    padded = t.numel // (size * n_seqs)
    return t if padded == n_tok else slice_rows(reshape(t, (size * padded, n_seqs)), 0, size * n_tok)


def _ssd_scan(s, x, dt, A, B, C, ids, chunk_size) -> tuple[Tensor, Tensor]:
    """ssm_scan in chunks (Mamba-2's state-space duality): one op, ssd_chunks, and its backward op
    (native/cpu_ssd_chunks.cpp, shaders/ssd_chunks.comp): each chunk's own state and its outputs
    computed for every chunk at once, only the states passed along the chunks in order."""
    d_state = _ne4(B)[0]
    head_dim, n_head, n_tok, n_seqs = _ne4(x)
    if _ne4(A)[0] != 1:
        raise ValueError(f"ssm_scan: the chunked form needs Mamba-2's A [1, n_head] (one decay per head), got A with "
                         f"{_ne4(A)[0]} rows (Mamba-1's decay per state); pass chunk_size=None for the recurrence")
    L, _ = _chunks("ssm_scan", chunk_size, n_tok)
    if chunk_size > SSD_MAX_CHUNK:
        raise ValueError(f"ssm_scan: chunk_size must be at most {SSD_MAX_CHUNK} (a chunk's pairs of tokens stay in the "
                         f"GPU's shared memory), got {chunk_size}")
    step = softplus(reshape(dt, (n_head, n_tok, n_seqs)))  # [H, T, N]
    log_decay = mul(step, reshape(A, (n_head, 1, 1)))  # [H, T, N]
    inputs = mul(reshape(x, (head_dim, n_head, n_tok, n_seqs)), reshape(step, (1, n_head, n_tok, n_seqs)))  # [P, H, T, N]
    E = d_state * head_dim
    first = reshape(get_rows(reshape(s, (E * n_head, _ne4(s)[3])), ids), (d_state, head_dim, n_head, n_seqs))
    packed = apply("ssd_chunks", (inputs, log_decay, B, C, first), ints=(L,), chunk=L)  # one column
    n_y, n_final = math.prod(_ne4(x)), E * n_head * n_seqs
    y, final_state = _unpack_columns(packed, [(n_y, x.shape), (n_final, (d_state, head_dim, n_head, n_seqs))])
    return y, final_state


def _split_recurrence(packed: Tensor, state: Tensor) -> list[Tensor]:
    """[y [S*H, T], the new state shaped like ``state``] from a recurrence's packed output
    [S*H, T + S*n_seqs]."""
    rows = packed.shape[0]
    n_y = packed.numel - state.numel
    return _unpack_columns(packed, [(n_y, (rows, n_y // rows)), (state.numel, state.shape)])


def _recurrence_inputs(op: str, names: tuple[str, ...], args: tuple) -> tuple[Tensor, ...]:
    """The arguments of a recurrence as tensors of the first one's dtype and device."""
    first = as_tensor(args[0], op=op, arg=names[0])
    return (first,) + tuple(as_tensor(x, like=first, op=op, arg=name) for name, x in zip(names[1:], args[1:]))


def rwkv_wkv6(k, v, r, tf, td, state) -> tuple[Tensor, Tensor]:
    """RWKV-6's time mixing, as ggml_rwkv_wkv6. k, v, r, td are [S, H, T] (head size S, H heads,
    T tokens of n_seqs sequences of equal length, sequence b owning tokens [b*T/n_seqs,
    (b+1)*T/n_seqs)), td the per-token decay in linear space, tf [S, H] the bonus u, state
    [S*S*H, n_seqs] (head h's S x S matrix at ``h*S*S + i*S + j``). Per sequence and head:
    ``y_t[j] = sum_i r_t[i] (u[i] k_t[i] v_t[j] + S[i,j])``, then
    ``S[i,j] = td_t[i] S[i,j] + k_t[i] v_t[j]``. Returns (y [S*H, T], final state like
    ``state``), differentiable in every input."""
    k, v, r, tf, td, state = _recurrence_inputs("rwkv_wkv6", ("k", "v", "r", "tf", "td", "state"),
                                                (k, v, r, tf, td, state))
    return tuple(_split_recurrence(apply("rwkv_wkv6", (k, v, r, tf, td, state)), state))


def gated_linear_attn(k, v, q, g, state, scale: float, chunk_size: int | None = None) -> tuple[Tensor, Tensor]:
    """Gated linear attention, as ggml_gated_linear_attn: k, v, q, g are [S, H, T] (g the
    per-key-channel gate in linear space), state [S*S*H, n_seqs], shapes and sequences as in
    :func:`rwkv_wkv6`. Per sequence and head: ``S[i,j] = g_t[i] S[i,j] + k_t[i] v_t[j]``, then
    ``y_t[j] = scale * sum_i q_t[i] S[i,j]`` (the updated state). Returns (y [S*H, T], final
    state); differentiable in every tensor (``scale`` is a constant).

    ``chunk_size`` None (the default) runs the exact recurrence; an int runs the chunked form
    (as flash-linear-attention's chunk_gla), one op and its backward op (gla_chunks,
    native/cpu_gla_chunks.cpp: per sequence and head the chunks in order, the state carried
    between them; shaders/gla_chunks.comp: every chunk's work at once, only the states passed
    along the chunks in order): within a chunk every pair of tokens is weighted per
    key channel by its gates' product, exp of the sum of the log gates between them (never above
    1, so strong gates cannot overflow), and the outputs read the chunk's start state and its
    tokens. It takes log(g): gates must be positive (a gate of 0 is taken as e^-80; a negative
    one gives NaN). Chunks of 16 to 64 tokens (the GPU takes at most 64, and its backward pass
    grows with the cube of the chunk length); a NaN in one token reaches the outputs of its head
    in its sequence from that token on, and the final state, as in the recurrence. On the GPU the
    recurrence is still the faster form (head sizes up to 64 keep its state in registers:
    about 14 against 16 ms at 2048 tokens x 4 on an H100; BENCHMARKS.md), on the CPU this one."""
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"gated_linear_attn: scale must be a number, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"gated_linear_attn: scale must be finite, got {scale}")
    k, v, q, g, state = _recurrence_inputs("gated_linear_attn", ("k", "v", "q", "g", "state"), (k, v, q, g, state))
    if chunk_size is not None:
        check_inputs("gated_linear_attn", (k, v, q, g, state), floats=(float(scale),))
        return _chunked_gla(k, v, q, g, state, float(scale), chunk_size)
    packed = apply("gated_linear_attn", (k, v, q, g, state), floats=(float(scale),), scale=float(scale))
    return tuple(_split_recurrence(packed, state))


def _chunked_gla(k, v, q, g, state, scale: float, chunk_size) -> tuple[Tensor, Tensor]:
    """gated_linear_attn in chunks: one op (gla_chunks), its output [y, final state, the state at
    every chunk's start] (the last for its backward op)."""
    S, H = _ne4(k)[:2]
    n_tok = k.numel // (S * H * state.shape[1])
    L, _ = _chunks("gated_linear_attn", chunk_size, n_tok)
    log_gate = maximum(log(g), -80.0)  # [S, H, T]
    packed = apply("gla_chunks", (k, v, q, log_gate, state), ints=(L,), floats=(scale,), chunk=L, scale=scale)
    # y and the final state sliced off together: their gradients are added at their own size, and
    # padded to the packed output's (the start states besides, often 4x as large) once
    head = slice_rows(reshape(packed, (packed.numel, 1)), 0, v.numel + state.numel)
    y, final = _unpack_columns(head, [(v.numel, (S * H, v.numel // (S * H))), (state.numel, state.shape)])
    return y, final


def _heads_out_of_chunks(y: Tensor, S: int, H: int, n_tok: int, n_seqs: int) -> Tensor:
    """Outputs with tokens in rows, y [L, S, B] with B = H n_seqs c the (head, sequence, chunk)
    batch, head fastest, as [S H, n_tok n_seqs], the padding's tokens dropped."""
    L = y.shape[0]
    y = permute(reshape(y, (L, S, H * n_seqs, -1)), (1, 2, 0, 3))  # [S, H N, L, c]
    y = permute(reshape(y, (S * H, n_seqs, -1)), (0, 2, 1))  # [S H, L c, N]
    return reshape(_out_of_chunks(y, S * H, n_tok, n_seqs), (S * H, n_tok * n_seqs))


def rwkv_wkv7(r, w, k, v, a, b, state, chunk_size: int | None = None) -> tuple[Tensor, Tensor]:
    """RWKV-7's recurrence, as ggml_rwkv_wkv7. ``r, w, k, v, a, b`` are [S, H, T]: head size S,
    H heads, T tokens of n_seqs equal sequences (sequence s owns tokens [s T/n_seqs, (s+1)
    T/n_seqs)); ``w`` is the decay in linear space. ``state`` [S*S*H, n_seqs] holds each
    sequence's H matrices S x S, head h's at h*S*S + i*S + j (i the value row, j the key
    column). Per token and head::

        sa[i]  = sum_j a[j] S[i, j]
        S[i,j] = S[i,j] w[j] + v[i] k[j] + sa[i] b[j]
        y[i]   = sum_j S[i, j] r[j]

    Returns (y [S*H, T], final_state [S*S*H, n_seqs]), differentiable in every input.

    ``chunk_size`` None (the default) runs the exact recurrence; an int runs the chunked form
    (the WY form of flash-linear-attention's chunk_dplr): within a chunk the tokens' ``sa`` come
    from one triangular solve of its pairs of tokens (weighted by the decays between them per key
    channel, never above 1), computed for every chunk at once by one op (wkv7_chunk_terms), the
    outputs from products with the chunk's start state, and only that state passes from chunk to
    chunk (one op, wkv7_chunk_states, whose kernel loops over the chunks: two [chunk, S] x [S, S]
    products each). It takes log(w): decays must be positive (0 is taken as e^-80, a negative one
    gives NaN). Chunks of 16 to 64 tokens (at most 64 on the GPU); a NaN in one token reaches every
    output of its head in its sequence from its chunk's first token on. On the GPU the recurrence
    has been the faster form (head sizes up to 64 keep its state in registers; BENCHMARKS.md)."""
    r, w, k, v, a, b, state = _recurrence_inputs("rwkv_wkv7", ("r", "w", "k", "v", "a", "b", "state"),
                                                 (r, w, k, v, a, b, state))
    if chunk_size is not None:
        check_inputs("rwkv_wkv7", (r, w, k, v, a, b, state))
        return _chunked_wkv7(r, w, k, v, a, b, state, chunk_size)
    packed = apply("rwkv_wkv7", (r, w, k, v, a, b, state))  # [S*H, T + S*n_seqs]
    return tuple(_split_recurrence(packed, state))


def _chunked_wkv7(r, w, k, v, a, b, state, chunk_size) -> tuple[Tensor, Tensor]:
    """rwkv_wkv7 in chunks: each chunk's own terms from its tokens (one op, wkv7_chunk_terms:
    with Z = S^T the state [key, value] at the chunk's start, its tokens' sa are U = W Z + U0,
    its outputs Rf Z + Q_rb U + Q_rk V, its end state decay Z + Be^T U + Ke^T V), the states
    passed from chunk to chunk with each chunk's U (one op, wkv7_chunk_states), then the outputs'
    products. Dims in ne order: S the head size, L the chunk length, c the chunks per sequence,
    B = H N c the (head, sequence, chunk) batch with the head fastest."""
    S, H = _ne4(k)[:2]
    n_seqs = state.shape[1]
    n_tok = k.numel // (S * H * n_seqs)  # per sequence
    L, c = _chunks("rwkv_wkv7", chunk_size, n_tok)  # the last padded with tokens of decay 1 and no input
    HN = H * n_seqs

    log_decay = maximum(log(w), -80.0)  # [S(key), H, T]
    terms = apply("wkv7_chunk_terms", (r, k, v, a, b, log_decay), ints=(L, n_seqs), chunk=L, n_seqs=n_seqs)  # a column
    n_block, n_pairs, B = S * L * HN * c, L * L * HN * c, HN * c
    W, U_inputs, B_end, K_end, R_from, values, Q_rb, Q_rk, chunk_decay = _unpack_columns(
        terms, [(n_block, (L, S, B))] * 6 + [(n_pairs, (L, L, B))] * 2 + [(S * B, (S, HN, c))])  # [L, S, B] ...

    # the states at each chunk's start, chunk after chunk (one op, its loop inside the kernel), and
    # each chunk's U = W Z + U_inputs: Z' = decay Z + B~^T U + K~^T V
    states = apply("wkv7_chunk_states", tuple(reshape(t, (L, S, HN, c)) for t in (W, U_inputs, B_end, K_end, values))
                   + (chunk_decay, reshape(state, (S, S, HN))))  # one column
    Z_start, final_state, U = _unpack_columns(  # [S(key), S(value), B], the final state, U [L, S(value), B]
        states, [(S * S * B, (S, S, B)), (state.numel, state.shape), (n_block, (L, S, B))])

    y = add(matmul(R_from, Z_start), add(matmul(Q_rb, U), matmul(Q_rk, values)))  # [L, S, B]
    return _heads_out_of_chunks(y, S, H, n_tok, n_seqs), final_state
