"""rwkv_wkv7 beyond the op table's cases: the recurrence against a numpy loop (head sizes that do
and do not divide the GPU's 256 invocations, several sequences), float64 gradients of every input
across the backward's checkpoint chunks, the GPU against the CPU at realistic sizes (forward and
every gradient), a sequence run in two pieces carrying the state, and the shape and dtype errors;
then the chunked form against the recurrence (float64 to rounding, float32 within a few times the
recurrence's error, decays that close, a capture, its own argument errors)."""

import numpy as np
import pytest

import rlkit.core as rc
from rlkit.core import ops
from op_references import (assert_chunked_within_recurrent_error, assert_gpu_matches_cpu, np_rwkv_wkv7, np_wkv7_chunk_states,
                           np_wkv7_chunk_terms, packed)

CHUNK = 16  # tokens between the backward's checkpoints (native/cpu_rwkv7.cpp, wkv7.comp)


def inputs(S, H, T, n_seqs, seed=0):
    """Well-conditioned inputs as llama.cpp makes them and ggml's test does: w in [0.5, 1],
    a = -kk and b = kk * gate with kk unit vectors per head and token."""
    rng = np.random.default_rng(seed)
    r, k, v = (rng.normal(size=(S, H, T)) for _ in range(3))
    w = rng.uniform(0.5, 1.0, size=(S, H, T))
    kk = rng.normal(size=(S, H, T))
    kk /= np.linalg.norm(kk, axis=0, keepdims=True)
    a, b = -kk, kk * rng.uniform(0.0, 1.0, size=(S, H, T))
    state = 0.5 * rng.normal(size=(S * S * H, n_seqs))
    return [r, w, k, v, a, b, state]


def run(arrays, dtype="f32", device=None):
    y, final = rc.rwkv_wkv7(*[rc.tensor(np.asfortranarray(x), dtype=dtype, device=device) for x in arrays])
    assert y.device == final.device == (device or rc.device())
    return y.numpy(), final.numpy()


# (S, H, T, n_seqs): S = 1 and 3 do not divide 256; T / n_seqs below, at and above the chunk
SHAPES = [(1, 1, 1, 1), (2, 3, 6, 2), (3, 2, 2 * CHUNK + 5, 1), (8, 2, 2 * (CHUNK + 3), 2), (5, 1, 3 * CHUNK, 3)]


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_matches_the_numpy_loop(shape, device):
    arrays = inputs(*shape)
    want_y, want_state = np_rwkv_wkv7(*arrays)
    for dtype in ("f32", "f64") if device == "cpu" else ("f32",):
        y, final = run(arrays, dtype)
        assert y.shape == want_y.shape and final.shape == want_state.shape
        tol = 1e-12 if dtype == "f64" else 2e-5
        np.testing.assert_allclose(y, want_y, rtol=tol, atol=tol)
        np.testing.assert_allclose(final, want_state, rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", [(2, 2, 2 * (CHUNK + 5), 2), (3, 1, CHUNK + 1, 1), (2, 1, 3, 1)])
def test_gradients_of_every_input_match_finite_differences(shape):
    """T / n_seqs = 21 (two chunks, the second partial), 17 and 3: the checkpointed walk back."""
    arrays = inputs(*shape, seed=1)
    n_out = arrays[0].size + arrays[6].size  # y, then the final state
    weight = rc.tensor(np.random.default_rng(2).normal(size=(n_out, 1)), dtype="f64")
    assert rc.gradcheck(lambda *xs: rc.mul(packed(*rc.rwkv_wkv7(*xs)), weight), [np.asfortranarray(x) for x in arrays])


def _gradients(arrays, weights, device):
    params = [rc.param(np.asfortranarray(x, dtype=np.float32), device=device) for x in arrays]
    with rc.grad_tape():
        y, final = rc.rwkv_wkv7(*params)
        loss = rc.add(rc.sum(rc.mul(y, rc.tensor(weights[0], device=device))),
                      rc.sum(rc.mul(final, rc.tensor(weights[1], device=device))))
    grads = rc.backward(loss)
    return [np.asarray(grads[p]) for p in params]


@pytest.mark.requires_gpu
@pytest.mark.parametrize("shape", [(32, 4, 128, 2), (64, 4, 64, 2), (2, 3, 2 * (CHUNK + 3), 2), (8, 2, 40, 1),
                                   (128, 1, CHUNK + 4, 1), (300, 1, 3, 1)])
def test_gpu_matches_the_cpu(shape):
    """Forward and all seven gradients; S = 300 takes the GPU's multi-pass row and column sums."""
    arrays = [x.astype(np.float32) for x in inputs(*shape, seed=3)]
    rng = np.random.default_rng(4)
    S, H, T, _ = shape
    weights = [np.asfortranarray(rng.normal(size=(S * H, T)), dtype=np.float32),
               np.asfortranarray(rng.normal(size=arrays[6].shape), dtype=np.float32)]
    for cpu, gpu in zip(run(arrays, device="cpu"), run(arrays, device="gpu")):  # y, final state
        np.testing.assert_allclose(gpu, cpu, rtol=1e-4, atol=2e-5 * float(np.abs(cpu).max()))
    cpu_grads = _gradients(arrays, weights, "cpu")
    gpu_grads = _gradients(arrays, weights, "gpu")
    for name, g, e in zip(("r", "w", "k", "v", "a", "b", "state"), gpu_grads, cpu_grads):
        scale = max(1.0, float(np.abs(e).max()))
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=2e-5 * scale, err_msg=f"d{name}")


@pytest.mark.skipif("llvmpipe" not in str(rc.devices()), reason="a guard for lavapipe's loop limit")
def test_lavapipe_refuses_what_it_would_cut_short():
    """lavapipe ends a shader invocation's loops after 65535 iterations in all. Head sizes above 64
    run wkv7.comp, whose row and column sums are loops: at head size 64 its 1000 tokens' forward
    pass went wrong there without an error, so 1000 tokens at 65 are refused, with a message that
    names the way out. Up to 64 wkv7_registers.comp unrolls its loops over a row (1000 tokens x
    129 iterations would pass the limit if they were loops): 1000 tokens at 64 run and match the
    CPU, forward and backward, and only a sequence of 40000 tokens is refused."""
    long = [x.astype(np.float32) for x in inputs(65, 1, 1000, 1, seed=3)]
    with pytest.raises(RuntimeError, match="rwkv_wkv7: 1000 tokens per sequence need about .*llvmpipe.*CPU"):
        run(long, device="gpu")
    arrays = [x.astype(np.float32) for x in inputs(64, 1, 1000, 1, seed=3)]
    for cpu, gpu in zip(run(arrays, device="cpu"), run(arrays, device="gpu")):
        np.testing.assert_allclose(gpu, cpu, rtol=1e-4, atol=2e-5 * float(np.abs(cpu).max()))
    weights = [np.ones((64, 1000), np.float32), np.ones(arrays[6].shape, np.float32)]
    for name, g, e in zip("rwkvab", _gradients(arrays, weights, "gpu"), _gradients(arrays, weights, "cpu")):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=2e-5 * max(1.0, float(np.abs(e).max())), err_msg=f"d{name}")
    longest = [x.astype(np.float32) for x in inputs(2, 1, 40000, 1, seed=3)]
    with pytest.raises(RuntimeError, match="rwkv_wkv7: 40000 tokens per sequence need about .*llvmpipe.*CPU"):
        run(longest, device="gpu")


@pytest.mark.requires_gpu
def test_rlkit_info_names_where_the_recurrences_keep_their_state():
    """lavapipe has quad operations, so the tests above ran the register kernels there."""
    from rlkit import _native
    from rlkit.cli import info_lines

    quad = _native.gpu_info()["subgroup_quad"]
    if "llvmpipe" in str(rc.devices()):
        assert quad
    line = next(line for line in info_lines() if line.startswith("gpu rwkv_wkv6, rwkv_wkv7, gated_linear_attn: "))
    assert ("state in registers" in line) == quad and ("no quad operations" in line) == (not quad)


@pytest.mark.requires_gpu
def test_gpu_backward_is_deterministic():
    arrays = [x.astype(np.float32) for x in inputs(16, 2, 40, 2, seed=5)]
    weights = [np.ones((32, 40), np.float32), np.ones(arrays[6].shape, np.float32)]
    first, second = _gradients(arrays, weights, "gpu"), _gradients(arrays, weights, "gpu")
    for g1, g2 in zip(first, second):
        np.testing.assert_array_equal(g1, g2)


def test_cpu_results_do_not_depend_on_the_thread_count():
    """32 (sequence, head) tasks, spread over the pool or run on one thread: the same bits."""
    arrays = inputs(8, 16, 80, 2, seed=8)
    weights = [np.ones((128, 80), np.float32), np.ones(arrays[6].shape, np.float32)]
    previous = rc.get_num_threads()
    try:
        rc.set_num_threads(1)
        alone = list(run(arrays)) + _gradients(arrays, weights, "cpu")
        rc.set_num_threads(max(2, previous))
        pooled = list(run(arrays)) + _gradients(arrays, weights, "cpu")
    finally:
        rc.set_num_threads(previous)
    for one, many in zip(alone, pooled):
        np.testing.assert_array_equal(one, many)


def test_two_pieces_carrying_the_state_equal_the_whole_sequence(device):
    S, H, T = 4, 2, 30
    r, w, k, v, a, b, state = inputs(S, H, T, 1, seed=6)
    whole_y, whole_state = run([r, w, k, v, a, b, state])
    cut = 11
    first_y, carried = run([x[:, :, :cut] for x in (r, w, k, v, a, b)] + [state])
    second_y, final = run([x[:, :, cut:] for x in (r, w, k, v, a, b)] + [carried])
    np.testing.assert_allclose(np.concatenate([first_y, second_y], axis=1), whole_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(final, whole_state, rtol=1e-5, atol=1e-5)


def test_sequences_are_independent():
    """Two sequences in one call give what each gives alone (sequence s owns its T/n_seqs tokens)."""
    r, w, k, v, a, b, state = inputs(3, 2, 10, 2, seed=7)
    y, final = run([r, w, k, v, a, b, state], "f64")
    for seq, tokens in enumerate((slice(0, 5), slice(5, 10))):
        alone_y, alone_state = run([x[:, :, tokens] for x in (r, w, k, v, a, b)] + [state[:, seq:seq + 1]], "f64")
        np.testing.assert_allclose(y[:, tokens], alone_y, rtol=1e-12)
        np.testing.assert_allclose(final[:, seq:seq + 1], alone_state, rtol=1e-12)


def _t(*shape, dtype="f32"):
    return rc.tensor(np.ones(shape), dtype=dtype)


@pytest.mark.parametrize("args, message", [
    (lambda: [_t(4, 2, 6)] * 6 + [_t(32, 4)], r"T = 6 tokens do not split into n_seqs = 4 sequences of equal length \(state \[32, 4\]"),
    (lambda: [_t(4, 2, 6)] * 6 + [_t(16, 2)], r"state must be \[S\*S\*H, n_seqs\] with S\*S\*H = 32 .*, got \[16, 2\]"),
    (lambda: [_t(4, 2, 6)] * 3 + [_t(4, 2, 5)] + [_t(4, 2, 6)] * 2 + [_t(32, 1)], r"v must be \[S, H, T\] like r \[4, 2, 6\], got \[4, 2, 5\]"),
    (lambda: [_t(4, 2, 6)] * 5 + [_t(4, 3, 6)] + [_t(32, 1)], r"b must be \[S, H, T\] like r \[4, 2, 6\], got \[4, 3, 6\]"),
    (lambda: [_t(4, 2, 6, 2)] * 6 + [_t(32, 1)], r"r must be \[S, H, T\] \(3 dimensions\), got \[4, 2, 6, 2\]"),
    (lambda: [_t(4, 2, 6)] * 6 + [_t(32, 1, 2)], r"state must be \[S\*S\*H, n_seqs\] with S\*S\*H = 32 .*, got \[32, 1, 2\]"),
])
def test_bad_shapes_are_refused(device, args, message):
    with pytest.raises(ValueError, match=r"^rwkv_wkv7: " + message):
        rc.rwkv_wkv7(*args())


def test_bad_dtypes_are_refused():
    with pytest.raises(TypeError, match=r"^rwkv_wkv7: dtypes differ: r is f32 but state is f64"):
        rc.rwkv_wkv7(*[_t(4, 2, 6)] * 6, _t(32, 1, dtype="f64"))
    with pytest.raises(TypeError, match=r"^rwkv_wkv7: k must be a float tensor"):
        rc.rwkv_wkv7(_t(4, 2, 6), _t(4, 2, 6), rc.tensor(np.ones((4, 2, 6), np.int32)), *[_t(4, 2, 6)] * 3, _t(32, 1))


@pytest.mark.parametrize("bad, exc, message", [
    (0, ValueError, r"chunk_size must be at least 1"),
    ("4", TypeError, r"chunk_size must be an int"),
])
def test_bad_chunk_sizes_are_refused(bad, exc, message):
    with pytest.raises(exc, match=r"^rwkv_wkv7: " + message):
        rc.rwkv_wkv7(*[_t(4, 2, 6)] * 6, _t(32, 1), chunk_size=bad)


def test_the_chunked_form_checks_its_inputs_as_the_recurrence():
    with pytest.raises(ValueError, match=r"^rwkv_wkv7: v must be \[S, H, T\] like r \[4, 2, 6\], got \[4, 2, 5\]"):
        rc.rwkv_wkv7(*[_t(4, 2, 6)] * 3, _t(4, 2, 5), *[_t(4, 2, 6)] * 2, _t(32, 1), chunk_size=2)


NAMES = ["y", "final state", "r", "w", "k", "v", "a", "b", "state"]


def _with_gradients(arrays, weights, chunk_size, dtype):
    """y, the final state and every gradient of sum(wy y) + sum(ws state)."""
    params = [rc.param(np.asfortranarray(x), dtype=dtype) for x in arrays]
    with rc.grad_tape():
        y, final = rc.rwkv_wkv7(*params, chunk_size=chunk_size)
        loss = rc.add(rc.sum(rc.mul(y, rc.tensor(weights[0], dtype=dtype))),
                      rc.sum(rc.mul(final, rc.tensor(weights[1], dtype=dtype))))
    grads = rc.backward(loss)
    return [y.numpy(), final.numpy()] + [np.asarray(grads[p]) for p in params]


def _chunk_case(S, H, T, n_seqs, seed, w_low=0.5):
    """Inputs for n_seqs sequences of T tokens (decays in [w_low, 1)) and the loss's weights."""
    arrays = inputs(S, H, T * n_seqs, n_seqs, seed=seed)
    rng = np.random.default_rng(seed + 100)
    arrays[1] = rng.uniform(w_low, 1.0, size=arrays[1].shape)
    return arrays, [rng.normal(size=(S * H, T * n_seqs)), rng.normal(size=arrays[6].shape)]


CHUNKED_CASES = [  # S, H, tokens per sequence, n_seqs, chunk_size
    (4, 2, 10, 2, 4),   # the last chunk short
    (8, 3, 16, 1, 4),   # chunks fill the sequence
    (3, 2, 7, 2, 16),   # one chunk longer than the sequence
    (5, 2, 9, 3, 1),    # chunks of one token
    (4, 1, 40, 1, 8),   # five chunks: the state passed four times, split and joined in halves
]


@pytest.mark.parametrize("S, H, T, n_seqs, chunk_size", CHUNKED_CASES)
def test_chunked_form_is_the_recurrence_in_float64(S, H, T, n_seqs, chunk_size):
    """In float64 the chunked form's outputs equal the numpy loop's, and its every gradient the
    recurrence's, to rounding."""
    arrays, weights = _chunk_case(S, H, T, n_seqs, seed=T + S)
    recurrent = _with_gradients(arrays, weights, None, "f64")
    chunked = _with_gradients(arrays, weights, chunk_size, "f64")
    want_y, want_state = np_rwkv_wkv7(*arrays)
    np.testing.assert_allclose(chunked[0], want_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(chunked[1], want_state, rtol=1e-12, atol=1e-12)
    for name, a, b in zip(NAMES, recurrent, chunked):
        np.testing.assert_allclose(b, a, rtol=1e-11, atol=1e-11 * np.abs(a).max(), err_msg=name)


@pytest.mark.parametrize("S, H, T, n_seqs, chunk_size, w_low", [
    (4, 2, 10, 2, 4, 0.5), (8, 3, 16, 1, 4, 0.5), (3, 2, 7, 2, 16, 0.5),
    (16, 2, 128, 1, 64, 0.5),  # long chunks: the powers of P_ab up to the 63rd
    (16, 1, 96, 1, 32, 0.05),  # strong decays: log decays of -3 a token summed over 32
])
def test_chunked_form_in_float32_is_as_close_to_float64_as_the_recurrence(device, S, H, T, n_seqs, chunk_size, w_low):
    arrays, weights = _chunk_case(S, H, T, n_seqs, seed=T + S + 1, w_low=w_low)
    previous = rc.device("cpu")
    try:
        exact = _with_gradients(arrays, weights, None, "f64")
    finally:
        rc.device(previous)
    recurrent = _with_gradients(arrays, weights, None, "f32")
    chunked = _with_gradients(arrays, weights, chunk_size, "f32")
    assert_chunked_within_recurrent_error(NAMES, exact, recurrent, chunked)


def test_chunked_form_with_decays_that_close(device):
    """Decays of 1e-30 and 0 inside a chunk of 8: no overflow (the pairs' decays are exp of sums
    never above 0) and no NaN; 0 is taken as e^-80, so the outputs are the recurrence's to
    float32's precision."""
    arrays, weights = _chunk_case(4, 2, 12, 2, seed=4)
    arrays[1][:, :, 3] = 1e-30
    arrays[1][:, 1, 9] = 0.0
    recurrent = _with_gradients(arrays, weights, None, "f32")
    chunked = _with_gradients(arrays, weights, 8, "f32")
    for name, a, b in zip(NAMES, recurrent, chunked):
        if name == "w":  # w's gradient at 0: log's, see the docstring
            continue
        assert np.isfinite(b).all(), name
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(a).max()), err_msg=name)


def test_chunked_form_in_a_capture_gives_the_eager_values(device):
    arrays, _ = _chunk_case(4, 2, 10, 2, seed=5)
    tensors = [np.asfortranarray(x, dtype=np.float32) for x in arrays]
    captured = rc.capture(lambda r, w, k, v, a, b, state: rc.rwkv_wkv7(r, w, k, v, a, b, state, chunk_size=4))
    eager = rc.rwkv_wkv7(*[rc.tensor(x) for x in tensors], chunk_size=4)
    for _ in range(2):  # the trace, then a replay
        for replayed, expected in zip(captured(**dict(zip("r w k v a b state".split(), tensors))), eager):
            np.testing.assert_array_equal(np.asarray(replayed), expected.numpy())


def test_chunked_form_keeps_a_nan_in_its_head_and_sequence():
    """A NaN in one token's key reaches its head's outputs in its sequence (all of them: the
    products within a chunk multiply it by zeros) and nothing else."""
    arrays, _ = _chunk_case(4, 2, 8, 2, seed=6)
    arrays[2][1, 1, 10] = np.nan  # head 1, sequence 1 (tokens 8..15)
    y, final = (x.numpy() for x in rc.rwkv_wkv7(*[rc.tensor(np.asfortranarray(x)) for x in arrays], chunk_size=4))
    bad = np.zeros((8, 16), bool)
    bad[4:8, 8:16] = True  # rows of head 1, tokens of sequence 1
    assert np.isnan(y[bad]).all() and np.isfinite(y[~bad]).all()
    assert np.isnan(final[16:32, 1]).all() and np.isfinite(final[:16]).all() and np.isfinite(final[16:32, 0]).all()


# ---- wkv7_chunk_terms: what each chunk computes from its own tokens -------------------------------

def _chunk_terms_inputs(S, H, T, seed=0, w_low=0.5):
    """r, k, v, a, b, log_decay [S, H, T] as the chunked form takes them (a = -kk, b = kk * gate)."""
    rng = np.random.default_rng(seed)
    r, k, v = (rng.normal(size=(S, H, T)) for _ in range(3))
    kk = rng.normal(size=(S, H, T))
    kk /= np.linalg.norm(kk, axis=0, keepdims=True)
    a, b = -kk, kk * rng.uniform(0.0, 1.0, size=(S, H, T))
    return [r, k, v, a, b, np.log(rng.uniform(w_low, 1.0, size=(S, H, T)))]


def _chunk_terms(arrays, L, n_seqs, dtype="f32", device=None):
    return ops.apply("wkv7_chunk_terms", tuple(rc.tensor(np.asfortranarray(x), dtype=dtype, device=device)
                                               for x in arrays), ints=(L, n_seqs))


# (S, H, T, L, n_seqs): one token; sizes that do not divide the GPU's 256 invocations, sequences
# whose last chunk is short (padded); the shaders' channel blocks (64 at chunks of 16, 16 at
# chunks of 64) filled and split; chunks of 64
CHUNK_TERM_SHAPES = [(1, 1, 1, 1, 1), (3, 2, 10, 4, 2), (7, 3, 16, 16, 1), (70, 1, 36, 16, 2), (20, 1, 64, 64, 1)]


@pytest.mark.parametrize("shape", CHUNK_TERM_SHAPES)
def test_chunk_terms_match_the_numpy_formulas(device, shape):
    arrays, (L, n_seqs) = _chunk_terms_inputs(*shape[:3]), shape[3:]
    want = np_wkv7_chunk_terms(*arrays, L, n_seqs)
    for dtype in ("f32", "f64") if device == "cpu" else ("f32",):
        got = _chunk_terms(arrays, L, n_seqs, dtype).numpy().ravel()
        tol = 1e-12 if dtype == "f64" else 2e-5
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (3, 2, 10, 4, 2), (4, 1, 7, 7, 1)])
def test_chunk_terms_gradients_match_finite_differences(shape):
    """Every input's gradient in float64, every part of the output weighted (the padding's too)."""
    arrays, (L, n_seqs) = _chunk_terms_inputs(*shape[:3], seed=1), shape[3:]
    n_out = np_wkv7_chunk_terms(*arrays, L, n_seqs).size
    weight = rc.tensor(np.random.default_rng(2).normal(size=(n_out, 1)), dtype="f64")
    assert rc.gradcheck(lambda *xs: rc.mul(rc.reshape(ops.apply("wkv7_chunk_terms", xs, ints=(L, n_seqs), chunk=L,
                                                                n_seqs=n_seqs), (-1, 1)), weight),
                        [np.asfortranarray(x) for x in arrays])


@pytest.mark.requires_gpu
@pytest.mark.parametrize("shape", [(3, 2, 10, 4, 2), (7, 3, 48, 16, 3), (64, 2, 40, 16, 2), (70, 1, 32, 16, 2),
                                   (20, 1, 64, 64, 1), (9, 2, 66, 33, 2)])
def test_chunk_terms_gpu_matches_the_cpu(shape):
    """Forward and every gradient, float32, strong decays: chunks of 16 (every channel of 64 in one
    block of shared memory, or two blocks; sequences of 20 tokens padded to 32), of 33 and 64
    (blocks of 32 and 16 channels)."""
    arrays, (L, n_seqs) = _chunk_terms_inputs(*shape[:3], seed=3, w_low=0.05), shape[3:]
    assert_gpu_matches_cpu("wkv7_chunk_terms", arrays, ["terms", "r", "k", "v", "a", "b", "log_decay"],
                           ints=(L, n_seqs), chunk=L, n_seqs=n_seqs)


@pytest.mark.requires_gpu
def test_chunk_terms_refuse_chunks_longer_than_the_gpu_kernels_hold():
    with pytest.raises(ValueError, match=r"^wkv7_chunk_terms: chunks of at most 64 tokens on the GPU, got 65"):
        _chunk_terms(_chunk_terms_inputs(2, 1, 65), 65, 1, device="gpu")


@pytest.mark.parametrize("args, ints, exc, message", [
    (lambda: [_f(2, 3, 4)] * 5 + [_f(2, 3, 5)], (2, 1), ValueError,
     r"log_decay must be \[S, H, T\] like r \[2, 3, 4\], got \[2, 3, 5\]"),
    (lambda: [_f(2, 3, 4)] * 2 + [_f(2, 3, 4, 2)] + [_f(2, 3, 4)] * 3, (2, 1), ValueError,
     r"v must be \[S, H, T\] like r \[2, 3, 4\], got \[2, 3, 4, 2\]"),
    (lambda: [_f(2, 3, 4)] * 5 + [_f(2, 3, 4, dtype="f64")], (2, 1), TypeError, r"dtypes differ: r is f32 but log_decay is f64"),
    (lambda: [rc.tensor(np.ones((2, 3, 4), np.int32))] + [_f(2, 3, 4)] * 5, (2, 1), TypeError, r"r must be a float tensor"),
    (lambda: [_f(2, 3, 4)] * 6, (2, 3), ValueError, r"4 tokens do not split into 3 sequences of equal length"),
    (lambda: [_f(2, 3, 4)] * 6, (0, 1), ValueError, r"expected two int attributes, L \(tokens per chunk\) and n_seqs"),
    (lambda: [_f(2, 3, 4)] * 6, (2,), ValueError, r"expected two int attributes"),
])
def test_chunk_terms_refuse_bad_inputs(args, ints, exc, message):
    with pytest.raises(exc, match=r"^wkv7_chunk_terms: " + message):
        ops.apply("wkv7_chunk_terms", tuple(args()), ints=ints)


def test_chunk_terms_backward_checks_the_upstream_gradient():
    inputs = [_f(2, 3, 4)] * 6
    out = ops.apply("wkv7_chunk_terms", tuple(inputs), ints=(2, 2))  # B = 6 chunks: 6 * 24 + 4 * 24 + 12 = 252
    with pytest.raises(ValueError, match=r"^wkv7_chunk_terms_back: g \[7, 1\] is not the forward's output shape \[252, 1\]"):
        ops.apply("wkv7_chunk_terms_back", (_f(7), *inputs, out), ints=(2, 2))
    with pytest.raises(TypeError, match=r"^wkv7_chunk_terms_back: dtypes differ: r is f32 but out is f64"):
        ops.apply("wkv7_chunk_terms_back", (out, *inputs, rc.tensor(out.numpy(), dtype="f64")), ints=(2, 2))


# ---- wkv7_chunk_states: the op that passes the chunked form's state from chunk to chunk ----------

def _chunk_states_inputs(L, S, N, c, seed=0):
    rng = np.random.default_rng(seed)
    blocks = [0.3 * rng.normal(size=(L, S, N, c)) for _ in range(5)]  # W, U, B, K, V
    return blocks + [rng.uniform(0.5, 1.0, size=(S, N, c)), rng.normal(size=(S, S, N))]


def _chunk_states(arrays, dtype="f32", device=None):
    return ops.apply("wkv7_chunk_states", tuple(rc.tensor(np.asfortranarray(a), dtype=dtype, device=device)
                                                for a in arrays))


# (L, S, N, c): one chunk of one token; sizes that do not divide the GPU's 256 invocations; more
# state (S S) than invocations; more chunk rows (L S) than invocations
CHUNK_STATE_SHAPES = [(1, 5, 1, 1), (3, 4, 2, 3), (4, 3, 3, 2), (16, 20, 2, 5), (20, 17, 1, 3)]


@pytest.mark.parametrize("shape", CHUNK_STATE_SHAPES)
def test_chunk_states_match_the_numpy_loop(device, shape):
    arrays = _chunk_states_inputs(*shape)
    want = np_wkv7_chunk_states(*arrays)
    for dtype in ("f32", "f64") if device == "cpu" else ("f32",):
        got = _chunk_states(arrays, dtype).numpy().ravel()
        tol = 1e-12 if dtype == "f64" else 2e-5
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("shape", CHUNK_STATE_SHAPES[:4])
def test_chunk_states_gradients_match_finite_differences(shape):
    """Every input's gradient in float64, the states after every chunk and every chunk's T weighted."""
    arrays = _chunk_states_inputs(*shape, seed=1)
    n_out = np_wkv7_chunk_states(*arrays).size
    weight = rc.tensor(np.random.default_rng(2).normal(size=(n_out, 1)), dtype="f64")
    assert rc.gradcheck(lambda *xs: rc.mul(rc.reshape(ops.apply("wkv7_chunk_states", xs), (-1, 1)), weight),
                        [np.asfortranarray(a) for a in arrays])


@pytest.mark.requires_gpu
@pytest.mark.parametrize("shape", [(3, 4, 2, 3), (16, 20, 2, 5), (20, 17, 1, 3), (16, 64, 3, 4), (16, 40, 2, 3),
                                   (40, 64, 1, 2), (16, 80, 1, 2), (70, 5, 2, 2)])
def test_chunk_states_gpu_matches_the_cpu(shape):
    """Forward and every gradient, float32: the staged forward and walk (shared memory; blocks of
    value columns, the last short at 16 x 40), and at 40 x 64 and 16 x 80 the forward and walk
    that read the chunk from device memory (it does not fit); the sums over several blocks of key
    rows at 40 x 64 and 16 x 80; at 70 x 5 (chunks over 64 tokens) the one-kernel backward."""
    assert_gpu_matches_cpu("wkv7_chunk_states", _chunk_states_inputs(*shape, seed=3),
                           ["states", "W", "U", "B", "K", "V", "decay", "Z0"])


def _f(*shape, dtype="f32"):
    return rc.tensor(np.ones(shape), dtype=dtype)


@pytest.mark.parametrize("args, exc, message", [
    (lambda: [_f(2, 3, 2, 4)] * 4 + [_f(2, 3, 2, 5), _f(3, 2, 4), _f(3, 3, 2)], ValueError,
     r"V must be \[L, S, N, c\] like W \[2, 3, 2, 4\], got \[2, 3, 2, 5\]"),
    (lambda: [_f(2, 3, 2, 4)] * 5 + [_f(3, 2, 3), _f(3, 3, 2)], ValueError, r"decay must be \[S, N, c\] = \[3, 2, 4\], got \[3, 2, 3\]"),
    (lambda: [_f(2, 3, 2, 4)] * 5 + [_f(3, 2, 4), _f(3, 2, 2)], ValueError, r"Z0 must be \[S, S, N\] = \[3, 3, 2\], got \[3, 2, 2\]"),
    (lambda: [_f(2, 3, 2, 4)] * 5 + [_f(3, 2, 4), _f(3, 3, 2, dtype="f64")], TypeError, r"dtypes differ: W is f32 but Z0 is f64"),
    (lambda: [rc.tensor(np.ones((2, 3, 2, 4), np.int32))] + [_f(2, 3, 2, 4)] * 4 + [_f(3, 2, 4), _f(3, 3, 2)], TypeError,
     r"W must be a float tensor"),
])
def test_chunk_states_refuse_bad_inputs(args, exc, message):
    with pytest.raises(exc, match=r"^wkv7_chunk_states: " + message):
        ops.apply("wkv7_chunk_states", tuple(args()))


def test_chunk_states_backward_checks_the_upstream_gradient():
    inputs = [_f(2, 3, 2, 4)] * 5 + [_f(3, 2, 4), _f(3, 3, 2)]
    out = ops.apply("wkv7_chunk_states", tuple(inputs))
    with pytest.raises(ValueError, match=r"^wkv7_chunk_states_back: g \[7, 1\] is not the forward's output shape \[138\]"):
        ops.apply("wkv7_chunk_states_back", (_f(7), *inputs, out))
    with pytest.raises(TypeError, match=r"^wkv7_chunk_states_back: out and W have different dtypes"):
        ops.apply("wkv7_chunk_states_back", (out, *inputs, rc.tensor(out.numpy(), dtype="f64")))
