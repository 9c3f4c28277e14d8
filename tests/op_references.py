"""Input generators and numpy references of the op tests (tests/test_ops.py's case table, and
the state-space and RWKV tests): each generator takes a numpy Generator and returns an array;
each reference computes an op's result in float64 (or int32) independently of rlkit."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np

import rlkit.core as rc
from rlkit.core import ops

# ---- input generators: each takes a numpy Generator and returns an array -------------------------

def N(*shape, s=1.0):
    """Standard normal values (times s)."""
    return lambda r: s * r.normal(size=shape)


def SORTED(n):
    """An ascending column [n, 1] (standard normal values, sorted)."""
    return lambda r: np.sort(r.normal(size=(n, 1)), axis=0)


def np_searchsorted(sorted_column, query):
    n = sorted_column.shape[0]
    found = np.searchsorted(sorted_column.ravel(), query.ravel(order="F"), side="right")
    return np.minimum(found, n - 1).astype(np.int32).reshape(query.shape, order="F")


def np_ssm_conv(sx, c):
    """out[i, t, s] = sum_k sx[t + k, i, s] c[k, i] (ggml_ssm_conv), written as shifted sums."""
    sx = sx.reshape(sx.shape[0], sx.shape[1], -1)
    d_conv = c.shape[0]
    n_t = sx.shape[0] - d_conv + 1
    out = sum(sx[k:k + n_t] * c[k][None, :, None] for k in range(d_conv))  # [n_t, d_inner, n_s]
    return np.transpose(out, (1, 0, 2))


def np_softplus(v):
    return np.where(v > 20, v, np.log1p(np.exp(np.minimum(v, 20))))


def np_ssm_scan(s, x, dt, A, B, C, ids):
    """ggml_ssm_scan written as its recurrence, one (sequence, head) at a time; returns
    (y like x, final states [d_state, head_dim, n_head, n_seqs])."""
    d_state, n_group = B.shape[0], B.shape[1]
    _, n_head, n_tok, n_seqs = x.shape
    y, final = np.zeros_like(x), np.zeros((d_state, x.shape[0], n_head, n_seqs))
    for q in range(n_seqs):
        for h in range(n_head):
            g = h // (n_head // n_group)
            state = s[:, :, h, ids[q]].copy()  # [d_state, head_dim]
            for t in range(n_tok):
                dts = np_softplus(dt[h, t, q])
                decay = np.exp(dts * A[:, h])[:, None]  # [d_state or 1, 1]
                state = state * decay + np.outer(B[:, g, t, q], x[:, h, t, q] * dts)
                y[:, h, t, q] = C[:, g, t, q] @ state
            final[:, :, h, q] = state
    return y, final


def assert_chunked_within_recurrent_error(names, exact, recurrent, chunked):
    """For each result (outputs, then gradients): the float32 chunked form's largest error
    against the float64 ``exact`` one, relative to its largest value, is below 4x the float32
    recurrence's (or 1e-6, where the recurrence is exact to rounding)."""
    for name, e, a, b in zip(names, exact, recurrent, chunked):
        scale = np.abs(e).max()
        recurrent_error, chunked_error = np.abs(a - e).max() / scale, np.abs(b - e).max() / scale
        assert chunked_error < max(4 * recurrent_error, 1e-6), f"{name}: {chunked_error:.1e} against {recurrent_error:.1e}"


def packed(y, final):
    """Both results of a recurrent op as one column (rlkit tensors or numpy arrays)."""
    if isinstance(y, np.ndarray):
        return np.concatenate([y.reshape(-1, order="F"), final.reshape(-1, order="F")])[:, None]
    return rc.concat_rows(rc.reshape(y, (-1, 1)), rc.reshape(final, (-1, 1)))


def DECAY(*shape):
    """Negative decay rates, as Mamba's A = -exp(A_log)."""
    return lambda r: -np.exp(r.normal(size=shape))


def np_recurrence(k, v, r, w, state, u=None, scale=1.0):
    """(y [S*H, T], new state) of rwkv_wkv6 (with the bonus u: reads the state before each token)
    or gated_linear_attn (u None: reads it after, times scale), one token at a time."""
    S, H, T = k.shape[0], k.shape[1], k.shape[2] if k.ndim > 2 else 1
    k, v, r, w = (x.reshape(S, H, T) for x in (k, v, r, w))
    n_seqs = state.shape[1]
    y, new_state = np.zeros((S * H, T)), state.copy()
    for b, h in itertools.product(range(n_seqs), range(H)):
        st = state[h * S * S:(h + 1) * S * S, b].reshape(S, S).copy()  # st[i, j]: key i, value j
        for t in range(b * T // n_seqs, (b + 1) * T // n_seqs):
            kv = np.outer(k[:, h, t], v[:, h, t])
            if u is not None:
                y[h * S:(h + 1) * S, t] = r[:, h, t] @ (u[:, h, None] * kv + st)
                st = w[:, h, t, None] * st + kv
            else:
                st = w[:, h, t, None] * st + kv
                y[h * S:(h + 1) * S, t] = scale * (r[:, h, t] @ st)
        new_state[h * S * S:(h + 1) * S * S, b] = st.ravel()
    return y, new_state


def RECURRENCE(S, H, T, n_seqs, bonus):
    """Inputs of rwkv_wkv6 (bonus: k, v, r, tf, td, state) or gated_linear_attn (k, v, q, g,
    state), with decays in [0.5, 1)."""
    vectors = [N(S, H, T), N(S, H, T), N(S, H, T)]
    return tuple(vectors + ([N(S, H)] if bonus else []) + [U(0.5, 1.0, S, H, T), N(S * S * H, n_seqs)])


# (S, H, T, n_seqs) of the recurrence cases: one chunk; T / n_seqs past the 16-token chunk of the
# backward pass and not a multiple of it; two sequences of 17 tokens.
RECURRENCE_SHAPES = [(2, 2, 6, 2), (3, 1, 18, 1), (2, 1, 34, 2)]


def np_rwkv_wkv7(r, w, k, v, a, b, state):
    """ggml_rwkv_wkv7 as a plain loop: per sequence, head and token, sa = S a,
    S = S diag(w) + v k^T + sa b^T, y = S r; S[i, j] at state[h*S*S + i*S + j]. Returns
    (y [S*H, T], final_state like state)."""
    S, H, T = r.shape
    n_seqs = state.shape[1]
    L = T // n_seqs
    y, final = np.zeros((S * H, T)), np.zeros(state.shape)
    for seq in range(n_seqs):
        for h in range(H):
            st = state[h * S * S:(h + 1) * S * S, seq].reshape(S, S)
            for t in range(seq * L, (seq + 1) * L):
                sa = st @ a[:, h, t]
                st = st * w[None, :, h, t] + np.outer(v[:, h, t], k[:, h, t]) + np.outer(sa, b[:, h, t])
                y[h * S:(h + 1) * S, t] = st @ r[:, h, t]
            final[h * S * S:(h + 1) * S * S, seq] = st.reshape(-1)
    return y, final


def np_wkv7_chunk_terms(r, k, v, a, b, log_decay, L, n_seqs):
    """wkv7_chunk_terms from its formulas: the inputs [S, H, T] cut into chunks of L tokens
    (chunk h + H (n + n_seqs q) holds head h's tokens q L .. of sequence n, zeros past its end), then
    per chunk with numpy's products and inverse: the decays from the chunk's start and between
    pairs of tokens, P_ab, P_ak (s < t), Q_rb, Q_rk (s <= t), W = (I - P_ab)^-1 A0,
    U = (I - P_ab)^-1 P_ak V. Returns the op's 1-D output [W, U, Be, Ke, Rf, V [L, S, B], Q_rb,
    Q_rk [L, L, B], decay [S, B], P_ab, P_ak [L, L, B]]."""
    S, H, T = r.shape
    n_tok = T // n_seqs
    c = -(-n_tok // L)
    B = H * c * n_seqs

    def chunk(x, ch):  # [S, L]
        h, n, q = ch % H, (ch // H) % n_seqs, ch // (H * n_seqs)
        out = np.zeros((S, L))
        tokens = x[:, h, n * n_tok + q * L:n * n_tok + min((q + 1) * L, n_tok)]
        out[:, :tokens.shape[1]] = tokens
        return out

    rows = {name: np.zeros((L, S, B)) for name in ("W", "U", "Be", "Ke", "Rf", "V")}
    Q_rb, Q_rk, decay = np.zeros((L, L, B)), np.zeros((L, L, B)), np.zeros((S, B))
    kept_ab, kept_ak = np.zeros((L, L, B)), np.zeros((L, L, B))
    for ch in range(B):
        r_, k_, v_, a_, b_, lw = (chunk(x, ch) for x in (r, k, v, a, b, log_decay))
        start = np.exp(np.cumsum(lw, axis=1))  # [S, L]: through token t
        between = lambda s, t: np.exp(lw[:, s + 1:t + 1].sum(axis=1))  # noqa: E731  over s < u <= t
        P_ab, P_ak = np.zeros((L, L)), np.zeros((L, L))
        for t, s in itertools.product(range(L), range(L)):
            if s < t:
                P_ab[t, s] = (a_[:, t] * b_[:, s] * between(s, t - 1)).sum()
                P_ak[t, s] = (a_[:, t] * k_[:, s] * between(s, t - 1)).sum()
            if s <= t:
                Q_rb[t, s, ch] = (r_[:, t] * b_[:, s] * between(s, t)).sum()
                Q_rk[t, s, ch] = (r_[:, t] * k_[:, s] * between(s, t)).sum()
        A0 = (a_ * np.concatenate([np.ones((S, 1)), start[:, :-1]], axis=1)).T  # [L, S]
        inverse = np.linalg.inv(np.eye(L) - P_ab)
        rows["W"][:, :, ch] = inverse @ A0
        rows["U"][:, :, ch] = inverse @ P_ak @ v_.T
        to_end = np.stack([between(s, L - 1) for s in range(L)], axis=1)  # [S, L]
        rows["Be"][:, :, ch] = (b_ * to_end).T
        rows["Ke"][:, :, ch] = (k_ * to_end).T
        rows["Rf"][:, :, ch] = (r_ * start).T
        rows["V"][:, :, ch] = v_.T
        decay[:, ch] = start[:, -1]
        kept_ab[:, :, ch], kept_ak[:, :, ch] = P_ab, P_ak
    parts = list(rows.values()) + [Q_rb, Q_rk, decay, kept_ab, kept_ak]
    return np.concatenate([x.reshape(-1, order="F") for x in parts])


def np_wkv7_chunk_states(W, U, B, K, V, decay, Z0):
    """wkv7_chunk_states as a plain loop: per batch n and chunk q, T = W Z + U, then
    Z = decay * Z + B^T T + K^T V (decay per key row). Returns the op's 1-D output: the state
    before each chunk and after the last [S, S, N, c+1], then each chunk's T [L, S, N, c]."""
    L, S, N, c = W.shape
    states, sa = np.zeros((S, S, N, c + 1)), np.zeros((L, S, N, c))
    for n in range(N):
        z = Z0[:, :, n]
        states[:, :, n, 0] = z
        for q in range(c):
            sa[:, :, n, q] = W[:, :, n, q] @ z + U[:, :, n, q]
            z = decay[:, n, q][:, None] * z + B[:, :, n, q].T @ sa[:, :, n, q] + K[:, :, n, q].T @ V[:, :, n, q]
            states[:, :, n, q + 1] = z
    return np.concatenate([states.reshape(-1, order="F"), sa.reshape(-1, order="F")])


def assert_gpu_matches_cpu(op: str, arrays: list, names: list[str], **attrs) -> None:
    """A packed-output op on both backends in float32: its output and the gradient of a random
    weighting of it for every input, the GPU's against the CPU's (names: the output's, then
    each input's, for the messages; attrs: ops.apply's, ints and the vjp rule's keywords)."""
    def run(device):
        params = [rc.param(np.asfortranarray(a.astype(np.float32)), device=device) for a in arrays]
        with rc.grad_tape():
            out = rc.reshape(ops.apply(op, tuple(params), **attrs), (-1, 1))
            w = rc.tensor(np.random.default_rng(4).normal(size=(out.shape[0], 1)).astype(np.float32), device=device)
            loss = rc.sum(rc.mul(out, w))
        grads = rc.backward(loss)
        return [out.numpy()] + [np.asarray(grads[p]) for p in params]

    for name, g, c in zip(names, run("gpu"), run("cpu")):
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=2e-5 * max(1.0, float(np.abs(c).max())), err_msg=name)


def WKV7(S, H, T, n_seqs):
    """Inputs of rwkv_wkv7, well conditioned as llama.cpp makes them and ggml's test does:
    w in [0.5, 1], a = -kk and b = kk * gate with kk unit vectors per head and token."""
    def unit(r):
        x = r.normal(size=(S, H, T))
        return x / np.linalg.norm(x, axis=0, keepdims=True)
    return (N(S, H, T), lambda r: r.uniform(0.5, 1.0, size=(S, H, T)), N(S, H, T), N(S, H, T),
            lambda r: -unit(r), lambda r: unit(r) * r.uniform(size=(S, H, T)), N(S * S * H, n_seqs, s=0.5))


def U(lo, hi, *shape):
    """Uniform values in [lo, hi)."""
    return lambda r: r.uniform(lo, hi, size=shape)


def POS(*shape):
    """Positive values, away from 0 (for log, sqrt, pow, divisors)."""
    return U(0.5, 2.0, *shape)


def AWAY(*shape):
    """|x| in [0.2, 2): away from the kinks of relu, abs and sign at 0."""
    return lambda r: r.choice([-1.0, 1.0], size=shape) * r.uniform(0.2, 2.0, size=shape)


def GRID(*shape, offset=0.0):
    """k / 2 + offset with a jitter of at most 0.05: two grids with offsets 0 and 0.25 never come
    closer than 0.15, so minimum / maximum have no ties and clamp bounds on the other grid are
    never touched."""
    return lambda r: r.integers(-4, 5, size=shape) * 0.5 + offset + r.uniform(-0.05, 0.05, size=shape)


def DISTINCT(*shape):
    """Every column (along dim 0) a permutation of values 0.5 apart: no ties for max / argmax."""
    def make(r):
        ranks = np.argsort(r.random(shape), axis=0)
        return (ranks - shape[0] / 2) * 0.5 + r.uniform(-0.1, 0.1, size=shape)
    return make


def ONEHOT(classes, n):
    """A float one-hot target [classes, n]."""
    return lambda r: np.eye(classes)[r.integers(0, classes, size=n)].T.copy()


def SOFT(classes, n):
    """A soft target [classes, n]: each column a probability vector."""
    def make(r):
        p = r.uniform(0.1, 1.0, size=(classes, n))
        return p / p.sum(axis=0, keepdims=True)
    return make


def IDX(*values):
    """Fixed 0-based indices (an i32 tensor of one column)."""
    return lambda r: np.array(values, dtype=np.int32)


def RIDX(n, hi):
    """n random 0-based indices below hi (repeats likely)."""
    return lambda r: r.integers(0, hi, size=n).astype(np.int32)


def CONST(values):
    """Fixed float values."""
    return lambda r: np.array(values, dtype=np.float64)


# ---- numpy reference helpers ----------------------------------------------------------------------

def _align(*arrays):
    """rlkit broadcasts from the first dimension (ggml's ne order): pad trailing sizes of 1."""
    nd = max(a.ndim for a in arrays)
    return [a.reshape(a.shape + (1,) * (nd - a.ndim)) for a in arrays]


def binary(f):
    return lambda a, b: f(*_align(a, b))


def np_softmax(x):
    e = np.exp(x - x.max(axis=0, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)


def np_log_softmax(x):
    m = x.max(axis=0, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=0, keepdims=True))


def np_sigmoid(x):
    return np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x))))


def np_matmul(a, b, ta=False, tb=False):
    """Column-major batched matmul: dims 0, 1 are the matrix, dims 2, 3 broadcast batches."""
    a, b = _align(a, b)
    if a.ndim == 2:
        return (a.T if ta else a) @ (b.T if tb else b)
    a = np.moveaxis(a, (0, 1), (-2, -1))
    b = np.moveaxis(b, (0, 1), (-2, -1))
    a = np.swapaxes(a, -1, -2) if ta else a
    b = np.swapaxes(b, -1, -2) if tb else b
    return np.moveaxis(a @ b, (-2, -1), (0, 1))


def np_activation(activation):
    """The fused ops' activation (rlkit.core.ops.LINEAR_ACTIVATIONS) as a numpy function."""
    return {None: lambda z: z, "relu": lambda z: np.maximum(z, 0), "tanh": np.tanh, "sigmoid": np_sigmoid}[activation]


def np_linear(activation):
    """act(w @ x + b), b [out, 1] added to every column of every batch slice."""
    act = np_activation(activation)

    def ref(w, x, b):
        z = np_matmul(w, x)
        return act(z + b.reshape(b.shape[0], *([1] * (z.ndim - 1))))
    return ref


def np_reduce(f, dim, keepdim):
    """sum / mean as rlkit shapes them: dim None gives [1, 1]; results keep 2 dimensions; a 3-D or
    4-D input loses the reduced dimension unless keepdim."""
    def ref(x):
        if dim is None:
            return np.asarray(f(x)).reshape(1, 1)
        out = f(x, axis=dim, keepdims=True)
        return out if keepdim or x.ndim == 2 else np.squeeze(out, axis=dim)
    return ref


def np_reshape(shape):
    def ref(x):
        out = np.reshape(x, shape, order="F")  # column-major, as the engine stores values
        return out.reshape(-1, 1) if out.ndim == 1 else out
    return ref


def np_scatter_cols(g, idx, columns):
    out = np.zeros((g.shape[0], columns), dtype=g.dtype)
    np.add.at(out.T, idx.ravel(), g.T)
    return out


def np_huber_terms(p, t, delta):
    d = np.abs(p - t)
    return np.where(d <= delta, 0.5 * d * d, delta * (d - 0.5 * delta))


def np_huber(p, t, delta):
    return np.mean(np_huber_terms(p, t, delta)).reshape(1, 1)


def to_f16(x):
    with np.errstate(over="ignore"):  # out-of-range values become inf, as they should
        return x.astype(np.float16)


def to_bf16(x):
    """x (float64) correctly rounded to bfloat16 (nearest, ties to an even last bit), found by
    search: of the bf16 values around x, the nearest (ml_dtypes rounds float64 through float32,
    which can round twice)."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore"):
        guess = x.astype(np.float32).astype(ml_dtypes.bfloat16)
    bits = guess.view(np.uint16).astype(np.int64)
    # the bf16 values one step either side (sign-magnitude bits: step the magnitude)
    candidates = []
    for step in (-1, 0, 1):
        magnitude = np.clip((bits & 0x7FFF) + step, 0, 0x7F80)
        candidates.append(((bits & 0x8000) | magnitude).astype(np.uint16).view(ml_dtypes.bfloat16))
    values = np.stack([c.astype(np.float64) for c in candidates])
    with np.errstate(invalid="ignore"):
        distance = np.abs(values - x)
        # a tie goes to the even last bit: make the odd one slightly farther
        odd = np.stack([(c.view(np.uint16) & 1).astype(bool) for c in candidates])
        distance = np.where(odd, np.nextafter(distance, np.inf), distance)
        best = np.take_along_axis(np.stack(candidates), np.nanargmin(np.where(np.isnan(distance), np.inf, distance),
                                                                      axis=0)[None], axis=0)[0]
    # inf, NaN and what rounds past bf16's largest value (from its midpoint with 2**128): the guess
    exact = ~np.isfinite(x) | (np.abs(x) >= 2.0**128 - 2.0**119)
    return np.where(exact, guess, best).astype(ml_dtypes.bfloat16)


def np_randn_like(shape, seed):
    """The noise sample_normal draws: the first randn stream after rc.manual_seed(seed)."""
    rc.manual_seed(seed)
    return rc.randn(shape, dtype="f64").numpy()


# ---- images [W, H, C, N] (ne0 = W); the ops' pairs are PyTorch's (height, width) ------------------

def PERMUTED(*shape):
    """Values 0.5 apart in a random order, plus a little noise: no ties anywhere (max pooling's
    windows overlap, so DISTINCT's per-column guarantee is not enough)."""
    def make(r):
        n = int(np.prod(shape))
        return (r.permutation(n).reshape(shape) - n / 2) * 0.5 + r.uniform(-0.1, 0.1, size=shape)
    return make


def _wh(value):
    """An int or a PyTorch (height, width) pair as (w, h)."""
    return (value, value) if np.isscalar(value) else (value[1], value[0])


def _as_images(x):
    return x.reshape(x.shape + (1,) * (4 - x.ndim))  # [W, H, C, N]


def _conv_taps(x_shape, w_shape, stride, padding, dilation):
    """(output size (W', H'), padding (w, h), and per tap (kw, kh) the slices of the padded input
    that it reads at every output pixel)."""
    (sw, sh), (pw, ph), (dw, dh) = _wh(stride), _wh(padding), _wh(dilation)
    out_w = (x_shape[0] + 2 * pw - dw * (w_shape[0] - 1) - 1) // sw + 1
    out_h = (x_shape[1] + 2 * ph - dh * (w_shape[1] - 1) - 1) // sh + 1
    taps = {(kw, kh): (slice(kw * dw, kw * dw + sw * (out_w - 1) + 1, sw), slice(kh * dh, kh * dh + sh * (out_h - 1) + 1, sh))
            for kw in range(w_shape[0]) for kh in range(w_shape[1])}
    return (out_w, out_h), (pw, ph), taps


def np_conv2d(x, w, b=None, stride=1, padding=0, dilation=1):
    """PyTorch's conv2d in rlkit's layout (x [W, H, C_in, N], w [KW, KH, C_in, C_out]) written as a
    sum over the kernel's taps, each a strided slice of the zero-padded input times one [C_in,
    C_out] matrix: [W', H', C_out, N]."""
    x = _as_images(x)
    (out_w, out_h), (pw, ph), taps = _conv_taps(x.shape, w.shape, stride, padding, dilation)
    padded = np.pad(x, [(pw, pw), (ph, ph), (0, 0), (0, 0)])
    out = np.zeros((out_w, out_h, w.shape[3], x.shape[3]))
    for (kw, kh), (sx, sy) in taps.items():
        out += np.einsum("whcn,co->whon", padded[sx, sy], w[kw, kh])
    return out if b is None else out + b.reshape(1, 1, -1, 1)


def np_conv2d_backward(x, w, g, stride=1, padding=0, dilation=1):
    """(d x, d w) of sum(g * conv2d(x, w)): each tap's slice of the padded input gets g times its
    matrix back, and its matrix gets the slice times g."""
    x = _as_images(x)
    (_, _), (pw, ph), taps = _conv_taps(x.shape, w.shape, stride, padding, dilation)
    padded = np.pad(x, [(pw, pw), (ph, ph), (0, 0), (0, 0)])
    d_padded, dw = np.zeros_like(padded), np.zeros_like(w)
    for (kw, kh), (sx, sy) in taps.items():
        d_padded[sx, sy] += np.einsum("whon,co->whcn", g, w[kw, kh])
        dw[kw, kh] = np.einsum("whcn,whon->co", padded[sx, sy], g)
    return d_padded[pw:pw + x.shape[0], ph:ph + x.shape[1]], dw


def np_max_pool2d(x, kernel, stride=None, padding=0):
    """PyTorch's max_pool2d in rlkit's layout: the maximum over the window's elements of the
    -inf-padded input (np.max: a NaN in the window gives NaN), [W', H', C, N]."""
    x = _as_images(x)
    (kw, kh), (pw, ph) = _wh(kernel), _wh(padding)
    sw, sh = _wh(kernel if stride is None else stride)
    out_w, out_h = (x.shape[0] + 2 * pw - kw) // sw + 1, (x.shape[1] + 2 * ph - kh) // sh + 1
    padded = np.pad(x, [(pw, pw), (ph, ph), (0, 0), (0, 0)], constant_values=-np.inf)
    windows = [padded[i:i + sw * (out_w - 1) + 1:sw, j:j + sh * (out_h - 1) + 1:sh] for i in range(kw) for j in range(kh)]
    return np.max(np.stack(windows), axis=0)
