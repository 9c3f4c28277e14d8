"""The matrix-state recurrences rwkv_wkv6 and gated_linear_attn beyond the op table's cases
(and gated_linear_attn's chunked form against the recurrence):
head sizes from 1 to 128 against the numpy loop on both backends (S <= 64 keeps the GPU state in
registers, larger S in global memory), the GPU against the CPU at realistic shapes for the
forward pass and every gradient, a sequence run in two pieces carrying the state, deterministic
CPU gradients, and bad inputs."""

import numpy as np
import pytest

import rlkit.core as rc
from rlkit import _native
from rlkit.core import ops

from op_references import assert_chunked_within_recurrent_error, np_recurrence

SCALE = 0.3


def _inputs(rng, S, H, T, n_seqs, bonus):
    """rwkv_wkv6's (k, v, r, tf, td, state) or gated_linear_attn's (k, v, q, g, state) as float64
    arrays; small vectors and decays in [0.5, 1) keep long f32 runs well conditioned."""
    vectors = [rng.normal(size=(S, H, T)) / np.sqrt(S) for _ in range(3)]
    decay = rng.uniform(0.5, 1.0, size=(S, H, T))
    state = rng.normal(size=(S * S * H, n_seqs))
    return vectors + ([rng.normal(size=(S, H))] if bonus else []) + [decay, state]


OPS = {
    "rwkv_wkv6": (lambda *a: rc.rwkv_wkv6(*a), lambda k, v, r, tf, td, s: np_recurrence(k, v, r, td, s, u=tf), True),
    "gated_linear_attn": (lambda *a: rc.gated_linear_attn(*a, scale=SCALE),
                          lambda k, v, q, g, s: np_recurrence(k, v, q, g, s, scale=SCALE), False),
}


def _tensors(arrays, dtype="f32", device=None):
    return [rc.tensor(np.asfortranarray(a, dtype=np.float32 if dtype == "f32" else np.float64), dtype=dtype,
                      device=device) for a in arrays]


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("S, H, T, n_seqs", [(1, 3, 5, 1), (2, 2, 8, 2), (8, 2, 34, 2), (32, 2, 20, 1),
                                              (64, 1, 18, 2), (128, 1, 3, 1)])
def test_forward_matches_the_numpy_loop_for_any_head_size(device, op, S, H, T, n_seqs):
    fn, ref, bonus = OPS[op]
    arrays = _inputs(np.random.default_rng(S * 100 + T), S, H, T, n_seqs, bonus)
    y, state = fn(*_tensors(arrays))
    rounded = [a.astype(np.float32).astype(np.float64) for a in arrays]
    y_ref, state_ref = ref(*rounded)
    assert y.shape == (S * H, T) and state.shape == (S * S * H, n_seqs)
    np.testing.assert_allclose(y.numpy(), y_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(state.numpy(), state_ref, rtol=1e-4, atol=1e-4)


def _forward_and_gradients(op, arrays, device, weights):
    """y, the final state and the gradient of every input of sum(wy * y) + sum(ws * state)."""
    fn, _, _ = OPS[op]
    xs = [rc.param(np.asfortranarray(a, dtype=np.float32)) for a in arrays]
    xs = [x.to(device) for x in xs]
    wy, ws = _tensors(weights, device=device)
    with rc.grad_tape():
        y, state = fn(*xs)
        loss = rc.add(rc.sum(rc.mul(y, wy)), rc.sum(rc.mul(state, ws)))
    grads = rc.backward(loss)
    return [y.numpy(), state.numpy()] + [np.asarray(grads[x]) for x in xs]


@pytest.mark.requires_gpu
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("S, H, T, n_seqs", [(8, 3, 34, 2), (32, 4, 128, 2), (64, 4, 64, 2), (64, 4, 128, 2),
                                              (128, 2, 40, 2)])
def test_gpu_matches_cpu_forward_and_every_gradient(op, S, H, T, n_seqs):
    rng = np.random.default_rng(S + T)
    arrays = _inputs(rng, S, H, T, n_seqs, OPS[op][2])
    weights = [rng.normal(size=(S * H, T)), rng.normal(size=(S * S * H, n_seqs))]
    expected = _forward_and_gradients(op, arrays, "cpu", weights)
    _native.set_gpu_poison(True)  # unwritten GPU memory shows as NaN
    try:
        got = _forward_and_gradients(op, arrays, "gpu", weights)
    finally:
        _native.set_gpu_poison(False)
    names = ["y", "final state"] + [f"gradient of input {n}" for n in range(len(arrays))]
    for name, g, e in zip(names, got, expected):
        assert g.shape == e.shape, name
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=2e-5 * np.abs(e).max(), err_msg=name)


@pytest.mark.skipif("llvmpipe" not in str(rc.devices()), reason="a guard for lavapipe's loop limit")
@pytest.mark.parametrize("op", sorted(OPS))
def test_lavapipe_runs_long_sequences_in_registers_and_refuses_longer(op):
    """lavapipe ends a shader invocation's loops after 65535 iterations in all. Up to head size 64
    recurrence_registers.comp unrolls its loops over a row or column, so 1000 tokens at 64 (which
    recurrence.comp, its sums in loops, would refuse) run and match the CPU, forward and every
    gradient; 40000 tokens are refused with a message that names the way out."""
    rng = np.random.default_rng(11)
    arrays = _inputs(rng, 64, 1, 1000, 1, OPS[op][2])
    weights = [rng.normal(size=(64, 1000)), rng.normal(size=(64 * 64, 1))]
    expected = _forward_and_gradients(op, arrays, "cpu", weights)
    for g, e in zip(_forward_and_gradients(op, arrays, "gpu", weights), expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=2e-5 * np.abs(e).max())
    longest = _tensors(_inputs(rng, 2, 1, 40000, 1, OPS[op][2]), device="gpu")
    with pytest.raises(RuntimeError, match=r"40000 tokens per sequence need about .*llvmpipe.*CPU"):
        OPS[op][0](*longest)


def _tokens(x, n_seqs, lo, hi):
    """Tokens [lo, hi) of every sequence of x [..., T] (sequences own equal consecutive blocks)."""
    per = x.shape[-1] // n_seqs
    return np.concatenate([x[..., b * per + lo:b * per + hi] for b in range(n_seqs)], axis=-1)


def _interleave(first, second, n_seqs):
    """Per sequence, the tokens of `first` then those of `second` ([rows, T1] and [rows, T2])."""
    n1, n2 = first.shape[1] // n_seqs, second.shape[1] // n_seqs
    return np.concatenate([np.concatenate([first[:, b * n1:(b + 1) * n1], second[:, b * n2:(b + 1) * n2]], axis=1)
                           for b in range(n_seqs)], axis=1)


@pytest.mark.parametrize("op", sorted(OPS))
def test_two_pieces_carrying_the_state_match_the_whole_sequence(device, op):
    """Forward values and the gradients of every input (through the carried state too)."""
    fn, _, bonus = OPS[op]
    S, H, n_seqs, per, cut = 4, 2, 2, 21, 13  # 21 tokens per sequence, cut after 13
    rng = np.random.default_rng(7)
    arrays = _inputs(rng, S, H, per * n_seqs, n_seqs, bonus)
    wy, ws = rng.normal(size=(S * H, per * n_seqs)), rng.normal(size=(S * S * H, n_seqs))
    params = [rc.param(np.asfortranarray(a, dtype=np.float32)).to(device) for a in arrays]

    def weighted(x, w):
        return rc.sum(rc.mul(x, rc.tensor(w, dtype="f32")))

    with rc.grad_tape():
        y, state = fn(*params)
        whole = rc.backward(rc.add(weighted(y, wy), weighted(state, ws)))
    whole = [np.asarray(whole[p]) for p in params]

    pieces = [[rc.tensor(a if a.ndim == 2 else _tokens(a, n_seqs, lo, hi), dtype="f32") for a in arrays[:-1]]
              for lo, hi in ((0, cut), (cut, per))]  # tf [S, H] is shared by both pieces
    for piece in pieces:
        for t in piece:
            t.requires_grad = True
    state0 = params[-1]
    with rc.grad_tape():
        y1, state1 = fn(*pieces[0], state0)
        y2, state2 = fn(*pieces[1], state1)
        split = rc.add(weighted(y1, _tokens(wy, n_seqs, 0, cut)), weighted(y2, _tokens(wy, n_seqs, cut, per)))
        grads = rc.backward(rc.add(split, weighted(state2, ws)))
    y_joined = _interleave(y1.numpy(), y2.numpy(), n_seqs)
    np.testing.assert_allclose(y_joined, y.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state2.numpy(), state.numpy(), rtol=1e-5, atol=1e-5)
    for n, a in enumerate(arrays[:-1]):
        g1, g2 = np.asarray(grads[pieces[0][n]]), np.asarray(grads[pieces[1][n]])
        expected = whole[n]
        got = g1 + g2 if a.ndim == 2 else _interleave(g1.reshape(-1, g1.shape[-1]), g2.reshape(-1, g2.shape[-1]),
                                                       n_seqs).reshape(a.shape)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=f"input {n}")
    np.testing.assert_allclose(np.asarray(grads[state0]), whole[-1], rtol=1e-4, atol=1e-5, err_msg="state")


@pytest.mark.parametrize("op", sorted(OPS))
def test_cpu_gradients_do_not_depend_on_the_thread_count(op):
    rng = np.random.default_rng(3)
    S, H, T, n_seqs = 16, 8, 2 * 40, 2
    arrays = _inputs(rng, S, H, T, n_seqs, OPS[op][2])
    weights = [rng.normal(size=(S * H, T)), rng.normal(size=(S * S * H, n_seqs))]
    previous = rc.get_num_threads()
    try:
        rc.set_num_threads(1)
        one = _forward_and_gradients(op, arrays, "cpu", weights)
        rc.set_num_threads(max(2, previous))
        many = _forward_and_gradients(op, arrays, "cpu", weights)
    finally:
        rc.set_num_threads(previous)
    for a, b in zip(one, many):
        np.testing.assert_array_equal(a, b)


def _f32(*shape):
    return rc.tensor(np.ones(shape, np.float32))


def _wkv6(S=2, H=3, T=4, n_seqs=2, **change):
    args = dict(k=_f32(S, H, T), v=_f32(S, H, T), r=_f32(S, H, T), tf=_f32(S, H), td=_f32(S, H, T),
                state=_f32(S * S * H, n_seqs))
    args.update(change)
    return lambda: rc.rwkv_wkv6(**args)


def _gla(S=2, H=3, T=4, n_seqs=2, scale=0.5, chunk_size=None, **change):
    args = dict(k=_f32(S, H, T), v=_f32(S, H, T), q=_f32(S, H, T), g=_f32(S, H, T), state=_f32(S * S * H, n_seqs))
    args.update(change)
    return lambda: rc.gated_linear_attn(**args, scale=scale, chunk_size=chunk_size)


@pytest.mark.parametrize("call, exc, message", [
    (_wkv6(T=5), ValueError, r"T = 5 tokens do not split into n_seqs = 2 sequences"),
    (_wkv6(v=_f32(3, 3, 4)), ValueError, r"v must be \[S, H, T\] like k \[2, 3, 4\], got \[3, 3, 4\]"),
    (_wkv6(td=_f32(2, 3, 5)), ValueError, r"td must be \[S, H, T\] like k \[2, 3, 4\], got \[2, 3, 5\]"),
    (_wkv6(tf=_f32(2, 2)), ValueError, r"tf must be \[S, H\] = \[2, 3\]"),
    (_wkv6(state=_f32(13, 2)), ValueError, r"state must be \[S\*S\*H, n_seqs\] with S\*S\*H = 12"),
    (_wkv6(k=_f32(2, 3, 4, 2)), ValueError, r"k must be \[S, H, T\] \(3 dimensions\)"),
    (_wkv6(r=rc.tensor(np.ones((2, 3, 4)), dtype="f64")), TypeError, r"dtypes differ: k is f32 but r is f64"),
    (_wkv6(state=rc.tensor(np.ones((12, 2), np.int32))), TypeError, r"dtypes differ: k is f32 but state is i32"),
    (_gla(q=_f32(2, 4, 4)), ValueError, r"q must be \[S, H, T\] like k"),
    (_gla(n_seqs=3), ValueError, r"T = 4 tokens do not split into n_seqs = 3 sequences"),
    (_gla(state=_f32(12, 2, 2)), ValueError, r"state must be \[S\*S\*H, n_seqs\]"),
    (_gla(scale="0.5"), TypeError, r"scale must be a number, got str"),
    (_gla(scale=float("nan")), ValueError, r"scale must be finite"),
    (_gla(g=np.zeros((0, 3))), ValueError, r"g is empty"),
    (_gla(chunk_size=0), ValueError, r"chunk_size must be at least 1"),
    (_gla(chunk_size="4"), TypeError, r"chunk_size must be an int"),
    (_gla(chunk_size=2, q=_f32(2, 4, 4)), ValueError, r"q must be \[S, H, T\] like k"),  # the recurrence's own checks
])
def test_bad_inputs_are_refused_clearly(call, exc, message):
    with pytest.raises(exc, match=r"^(rwkv_wkv6|gated_linear_attn): " + ".*" + message):
        call()


def _gla_with_gradients(arrays, chunk_size, dtype, weights):
    """gated_linear_attn's y, final state and every gradient of sum(wy y) + sum(ws state)."""
    params = [rc.param(np.asfortranarray(a), dtype=dtype) for a in arrays]
    with rc.grad_tape():
        y, state = rc.gated_linear_attn(*params, scale=SCALE, chunk_size=chunk_size)
        loss = rc.add(rc.sum(rc.mul(y, rc.tensor(weights[0], dtype=dtype))),
                      rc.sum(rc.mul(state, rc.tensor(weights[1], dtype=dtype))))
    grads = rc.backward(loss)
    return [y.numpy(), state.numpy()] + [np.asarray(grads[p]) for p in params]


GLA_CHUNKED_CASES = [  # S, H, tokens per sequence, n_seqs, chunk_size
    (4, 2, 10, 2, 4),   # the last chunk short
    (8, 3, 16, 1, 4),   # chunks fill the sequence
    (3, 2, 7, 2, 16),   # one chunk longer than the sequence
    (5, 2, 9, 3, 1),    # chunks of one token
]


def _gla_arrays(rng, S, H, T, n_seqs):
    arrays = _inputs(rng, S, H, T * n_seqs, n_seqs, bonus=False)
    arrays[3] = rng.uniform(0.05, 1.0, size=(S, H, T * n_seqs))  # gates down to 0.05: strong decay
    weights = [rng.normal(size=(S * H, T * n_seqs)), rng.normal(size=(S * S * H, n_seqs))]
    return arrays, weights


@pytest.mark.parametrize("S, H, T, n_seqs, chunk_size", GLA_CHUNKED_CASES)
def test_chunked_gla_is_the_recurrence_in_float64(S, H, T, n_seqs, chunk_size):
    """The chunked form computes the recurrence's function: in float64 its outputs and every
    gradient agree with it to rounding, and with the numpy loop."""
    arrays, weights = _gla_arrays(np.random.default_rng(T + S), S, H, T, n_seqs)
    recurrent = _gla_with_gradients(arrays, None, "f64", weights)
    chunked = _gla_with_gradients(arrays, chunk_size, "f64", weights)
    y_ref, state_ref = np_recurrence(*arrays, scale=SCALE)
    np.testing.assert_allclose(chunked[0], y_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(chunked[1], state_ref, rtol=1e-12, atol=1e-12)
    for name, a, b in zip(["y", "final state", "k", "v", "q", "g", "state"], recurrent, chunked):
        np.testing.assert_allclose(b, a, rtol=1e-11, atol=1e-11 * np.abs(a).max(), err_msg=name)


@pytest.mark.parametrize("S, H, T, n_seqs, chunk_size", GLA_CHUNKED_CASES[:3])
def test_chunked_gla_in_float32_is_as_close_to_float64_as_the_recurrence(device, S, H, T, n_seqs, chunk_size):
    arrays, weights = _gla_arrays(np.random.default_rng(T + S + 1), S, H, T, n_seqs)
    previous = rc.device("cpu")
    try:
        exact = _gla_with_gradients(arrays, None, "f64", weights)
    finally:
        rc.device(previous)
    recurrent = _gla_with_gradients(arrays, None, "f32", weights)
    chunked = _gla_with_gradients(arrays, chunk_size, "f32", weights)
    assert_chunked_within_recurrent_error(["y", "final state", "k", "v", "q", "g", "state"], exact, recurrent, chunked)


def test_chunked_gla_keeps_float32_precision_over_long_chunks(device):
    """Chunks of 64 tokens of gates in [0.05, 1): the log gates between two tokens are summed
    over the steps between them, not taken as a difference of running sums (an error of 1e-6 of
    the gradients, 30x the recurrence's, before). Within a few times the recurrence's error."""
    arrays, weights = _gla_arrays(np.random.default_rng(9), 16, 2, 128, 2)
    previous = rc.device("cpu")
    try:
        exact = _gla_with_gradients(arrays, None, "f64", weights)
    finally:
        rc.device(previous)
    recurrent = _gla_with_gradients(arrays, None, "f32", weights)
    chunked = _gla_with_gradients(arrays, 64, "f32", weights)
    assert_chunked_within_recurrent_error(["y", "final state", "k", "v", "q", "g", "state"], exact, recurrent, chunked)


def test_chunked_gla_with_gates_that_close(device):
    """Gates of 1e-30 and 0 inside a chunk of 8: no overflow (the pairs' gates are exp of sums
    never above 0) and no NaN; a gate of 0 is taken as e^-80, so the outputs are the
    recurrence's to float32's precision."""
    rng = np.random.default_rng(4)
    arrays, weights = _gla_arrays(rng, 4, 2, 12, 2)
    arrays[3][:, :, 3] = 1e-30
    arrays[3][:, 1, 9] = 0.0
    recurrent = _gla_with_gradients(arrays, None, "f32", weights)
    chunked = _gla_with_gradients(arrays, 8, "f32", weights)
    for name, a, b in zip(["y", "final state", "k", "v", "q"], recurrent, chunked):  # g's gradient at 0: see the docstring
        assert np.isfinite(b).all(), name
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(a).max()), err_msg=name)


@pytest.mark.parametrize("which", [0, 1, 3])  # k, v, the gate
def test_chunked_gla_propagates_nan_as_the_recurrence(device, which):
    """A NaN in one token of one head is never hidden: it reaches that head's outputs from that
    token on (within its chunk too) and its final state, and nothing before it or of the other
    heads and sequences, as in the recurrence."""
    arrays, _ = _gla_arrays(np.random.default_rng(8), 3, 2, 12, 2)
    arrays = [a.astype(np.float32) for a in arrays]
    arrays[which][:, 1, 6] = np.nan  # head 1, token 6 of sequence 0: inside the second chunk of 4
    y, final = (t.numpy() for t in rc.gated_linear_attn(*[rc.tensor(np.asfortranarray(a)) for a in arrays],
                                                         scale=SCALE, chunk_size=4))
    y = y.reshape(3, 2, 24, order="F")  # [S, H, T]
    assert np.isnan(y[:, 1, 6:12]).all() and np.isfinite(y[:, 1, :6]).all()
    assert np.isfinite(y[:, 0]).all() and np.isfinite(y[:, :, 12:]).all()
    final = final.reshape(9, 2, 2, order="F")  # [S*S, H, n_seqs]
    assert np.isnan(final[:, 1, 0]).any() and np.isfinite(final[:, 0]).all() and np.isfinite(final[:, :, 1]).all()


def test_chunked_gla_in_a_capture_gives_the_eager_values(device):
    arrays, _ = _gla_arrays(np.random.default_rng(5), 4, 2, 10, 2)
    tensors = [np.asfortranarray(a, dtype=np.float32) for a in arrays]
    captured = rc.capture(lambda k, v, q, g, state: rc.gated_linear_attn(k, v, q, g, state, scale=SCALE, chunk_size=4))
    eager = rc.gated_linear_attn(*[rc.tensor(a) for a in tensors], scale=SCALE, chunk_size=4)
    for _ in range(2):  # the trace, then a replay
        for replayed, expected in zip(captured(**dict(zip("k v q g state".split(), tensors))), eager):
            np.testing.assert_array_equal(np.asarray(replayed), expected.numpy())


def _gla_chunks_grads(arrays, chunk, dtype, device, weights):
    """gla_chunks' whole output (y, the final state, every chunk's start state) and the gradients of
    its weighted sum for k, v, q, log_gate and state."""
    params = [rc.param(np.asfortranarray(a), dtype=dtype, device=device) for a in arrays]
    with rc.grad_tape():
        out = ops.apply("gla_chunks", tuple(params), ints=(chunk,), floats=(SCALE,), chunk=chunk, scale=SCALE)
        loss = rc.sum(rc.mul(out, rc.tensor(weights, dtype=dtype, device=device)))
    grads = rc.backward(loss)
    return [out.numpy()] + [np.asarray(grads[p]) for p in params]


@pytest.mark.parametrize("S, H, T, n_seqs, chunk", [(3, 2, 7, 1, 3), (2, 1, 8, 2, 4), (4, 2, 5, 1, 8)])
def test_gla_chunks_gradients_match_finite_differences(S, H, T, n_seqs, chunk):
    """The op alone in float64, its whole output weighted: the start states' gradient too (no
    caller reads them, but the backward op adds theirs), and the log gates' through every decay
    that spans them."""
    rng = np.random.default_rng(S + T)
    arrays, _ = _gla_arrays(rng, S, H, T, n_seqs)
    arrays[3] = np.log(arrays[3])
    n_out = S * H * T * n_seqs + S * S * H * n_seqs * (1 + -(-T // chunk))  # T tokens per sequence
    weights = rc.tensor(rng.normal(size=(n_out, 1)), dtype="f64")
    assert rc.gradcheck(lambda *xs: rc.mul(ops.apply("gla_chunks", xs, ints=(chunk,), floats=(SCALE,), chunk=chunk,
                                                     scale=SCALE), weights), [np.asfortranarray(a) for a in arrays])


@pytest.mark.requires_gpu
@pytest.mark.parametrize("S, H, T, n_seqs, chunk", [(3, 2, 7, 1, 3), (5, 3, 12, 2, 4), (16, 2, 40, 1, 16),
                                                   (33, 1, 70, 2, 64), (1, 3, 5, 3, 2), (7, 2, 9, 1, 1)])
def test_gla_chunks_gpu_matches_the_cpu(S, H, T, n_seqs, chunk):
    """Forward and every gradient in float32, the start states' gradient too: head sizes and
    chunks of 1 to 64, a last chunk shorter, one chunk longer than the sequence."""
    rng = np.random.default_rng(S * T)
    arrays, _ = _gla_arrays(rng, S, H, T, n_seqs)
    arrays = [a.astype(np.float32) for a in arrays[:3]] + [np.log(arrays[3]).astype(np.float32), arrays[4].astype(np.float32)]
    n_out = S * H * T * n_seqs + S * S * H * n_seqs * (1 + -(-T // chunk))  # T tokens per sequence
    weights = rng.normal(size=(n_out, 1)).astype(np.float32)
    names = ["output", "k", "v", "q", "log_gate", "state"]
    for name, g, c in zip(names, _gla_chunks_grads(arrays, chunk, "f32", "gpu", weights),
                          _gla_chunks_grads(arrays, chunk, "f32", "cpu", weights)):
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=2e-5 * max(1.0, float(np.abs(c).max())), err_msg=name)


@pytest.mark.requires_gpu
def test_gla_chunks_on_the_gpu_refuse_chunks_over_64_tokens():
    """The GPU's kernels stage a chunk's tokens in shared memory: longer chunks are refused, not cut."""
    vectors = rc.tensor(np.ones((2, 1, 70), np.float32), device="gpu")
    state = rc.tensor(np.zeros((4, 1), np.float32), device="gpu")
    with pytest.raises(ValueError, match=r"^gla_chunks: chunks of at most 64 tokens on the GPU, got 65 \(pass a smaller"):
        ops.apply("gla_chunks", (vectors,) * 4 + (state,), ints=(65,), floats=(1.0,))
    assert ops.apply("gla_chunks", (vectors,) * 4 + (state,), ints=(64,), floats=(1.0,)).shape == (140 + 4 + 8, 1)


@pytest.mark.skipif("llvmpipe" not in str(rc.devices()), reason="a guard for lavapipe's loop limit")
def test_gla_chunks_on_lavapipe_refuse_what_its_loops_would_cut_short():
    """lavapipe ends an invocation's loops after 65535 iterations: the products over head size 2048
    would be cut short there. Refused, naming the chunk's tokens."""
    vectors = rc.tensor(np.zeros((2048, 1, 4), np.float32), device="gpu")
    state = rc.tensor(np.zeros((2048 * 2048, 1), np.float32), device="gpu")
    with pytest.raises(RuntimeError, match=r"^gla_chunks: 4 tokens per chunk need about .*llvmpipe"):
        ops.apply("gla_chunks", (vectors,) * 4 + (state,), ints=(4,), floats=(1.0,)).numpy()


def test_gla_chunks_refuse_bad_attributes_and_gradients():
    arrays = [_f32(2, 3, 4)] * 4 + [_f32(12, 2)]
    with pytest.raises(ValueError, match=r"^gla_chunks: expected one int attribute: the chunk length L >= 1"):
        ops.apply("gla_chunks", tuple(arrays), ints=(0,), floats=(1.0,))
    with pytest.raises(ValueError, match=r"^gla_chunks: expected one finite float attribute: scale"):
        ops.apply("gla_chunks", tuple(arrays), ints=(2,), floats=(float("nan"),))
    out = ops.apply("gla_chunks", tuple(arrays), ints=(1,), floats=(1.0,))  # y 24, final 24, starts 2 x 24
    assert out.shape == (96, 1)
    with pytest.raises(ValueError, match=r"^gla_chunks_back: g \[95, 1\] is not the forward's output shape \[96, 1\]"):
        ops.apply("gla_chunks_back", (_f32(95, 1), *arrays, out), ints=(1,), floats=(1.0,))


def test_backward_helpers_check_the_upstream_gradient():
    from rlkit.core import ops

    args = [_f32(2, 3, 4), _f32(2, 3, 4), _f32(2, 3, 4), _f32(2, 3), _f32(2, 3, 4), _f32(12, 2)]
    with pytest.raises(ValueError, match=r"^rwkv_wkv6_back: the upstream gradient must be shaped like the forward "
                                         r"output \[6, 8\], got \[6, 4\]"):
        ops.apply("rwkv_wkv6_back", (_f32(6, 4), *args))
    with pytest.raises(TypeError, match=r"^gated_linear_attn_back: dtypes differ"):
        ops.apply("gated_linear_attn_back", (rc.tensor(np.ones((6, 8)), dtype="f64"), *(args[:3] + args[4:])), floats=(1.0,))
