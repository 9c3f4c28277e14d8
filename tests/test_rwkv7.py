"""rwkv_wkv7 beyond the op table's cases: the recurrence against a numpy loop (head sizes that do
and do not divide the GPU's 256 invocations, several sequences), float64 gradients of every input
across the backward's checkpoint chunks, the GPU against the CPU at realistic sizes (forward and
every gradient), a sequence run in two pieces carrying the state, and the shape and dtype errors."""

import numpy as np
import pytest

import rlkit.core as rc
from op_references import np_rwkv_wkv7, packed

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
    """lavapipe ends a shader invocation's loops after 65535 iterations in all; at head size 64,
    1000 tokens' forward pass went wrong there without an error. It is refused now, with a message
    that names the way out; 256 tokens still run and match the CPU."""
    arrays = [x.astype(np.float32) for x in inputs(64, 1, 1000, 1, seed=3)]
    with pytest.raises(RuntimeError, match="rwkv_wkv7: 1000 tokens per sequence need about .*llvmpipe.*CPU"):
        run(arrays, device="gpu")
    short = [x.astype(np.float32) for x in inputs(64, 1, 256, 1, seed=3)]
    for cpu, gpu in zip(run(short, device="cpu"), run(short, device="gpu")):
        np.testing.assert_allclose(gpu, cpu, rtol=1e-4, atol=2e-5 * float(np.abs(cpu).max()))


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
