"""The Vulkan backend against the CPU backend: every op case of test_ops, forward and gradients,
with fresh inputs and freshly poisoned (NaN-filled) GPU memory; random streams; residency and
transfer counts of a training step; the same loss curve on both backends.

CI runs these on Mesa's lavapipe (software Vulkan) with the Khronos validation layer on. Where no
Vulkan device exists they are skipped, unless RLKIT_REQUIRE_GPU=1 makes that a failure.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import rlkit.core as rc
from rlkit import _native

from test_ops import CASES, Case, _arrays, _is_index, _params

pytestmark = pytest.mark.requires_gpu

# Per-op tolerances of GPU f32 against CPU f32 (transcendentals and reduction orders differ).
TOLERANCE = {"default": (2e-5, 2e-5), "matmul": (1e-4, 1e-4), "pow": (1e-4, 1e-5), "softplus": (1e-4, 1e-5),
             "sum": (1e-4, 1e-4), "mean": (1e-4, 1e-5), "sum_to": (1e-4, 1e-4), "huber_loss": (1e-4, 1e-5),
             "softmax_cross_entropy_loss": (1e-4, 1e-5), "cross_entropy_loss": (1e-4, 1e-5),
             "mse_loss": (1e-4, 1e-5), "conv2d": (1e-4, 1e-4), "expand": (0, 0), "transpose": (0, 0), "permute": (0, 0), "reshape": (0, 0)}


# Cases that make f64 tensors: f64 exists for float64 gradient checks on the CPU only.
CPU_ONLY = {"cast_f64", "one_hot_f64"}
GPU_CASES = [c for c in CASES if c.id not in CPU_ONLY]


def _tensor(a: np.ndarray, device: str) -> rc.Tensor:
    if _is_index(a):
        return rc.tensor(np.asfortranarray(a, dtype=np.int32), device=device)
    return rc.tensor(np.asfortranarray(a, dtype=np.float32), dtype="f32", device=device)


def _run(case: Case, arrays, device: str, seed: int) -> np.ndarray:
    previous = rc.device(device)
    try:
        rc.manual_seed(seed)  # sample_normal draws the same noise on both backends
        out = case.fn(*[_tensor(a, device) for a in arrays])
        assert out.device == device
        return out.numpy()
    finally:
        rc.device(previous)


def _close(case: Case, got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape and got.dtype == expected.dtype
    if got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, expected)
        return
    rtol, atol = TOLERANCE.get(case.op, TOLERANCE["default"])
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=max(atol, case.atol32), equal_nan=True)


@pytest.mark.parametrize("case, k", _params(GPU_CASES))
def test_forward_matches_cpu(case: Case, k: int, on_gpu):
    arrays = _arrays(case, k)
    expected = _run(case, arrays, "cpu", seed=k)
    got = _run(case, arrays, "gpu", seed=k)
    _close(case, got, expected)


def _gradients(case: Case, arrays, device: str, seed: int) -> list[np.ndarray]:
    previous = rc.device(device)
    try:
        rc.manual_seed(seed)
        inputs = [_tensor(a, device) if _is_index(a) else rc.param(a.astype(np.float32), device=device)
                  for a in arrays]
        with rc.grad_tape():
            out = case.fn(*inputs)
            weight = rc.tensor(np.random.default_rng(seed).normal(size=out.shape), dtype="f32", device=device)
            loss = rc.sum(rc.mul(out, weight))
        grads = rc.backward(loss)
        return [np.asarray(grads[p]) if p in grads else np.zeros(p.shape, np.float32)
                for p in inputs if p.requires_grad]
    finally:
        rc.device(previous)


@pytest.mark.parametrize("case, k", _params(GPU_CASES, grad_only=True))
def test_gradients_match_cpu(case: Case, k: int, on_gpu):
    arrays = _arrays(case, k)
    expected = _gradients(case, arrays, "cpu", seed=k)
    got = _gradients(case, arrays, "gpu", seed=k)
    for g, e in zip(got, expected):
        rtol, atol = TOLERANCE.get(case.op, TOLERANCE["default"])
        np.testing.assert_allclose(g, e, rtol=max(rtol, 1e-4), atol=max(atol, 1e-4, case.atol32))


def test_random_streams_match_the_cpu(on_gpu):
    for op in (rc.rand, rc.randn):
        rc.manual_seed(11)
        gpu = op((64, 50)).numpy()
        previous = rc.device("cpu")
        rc.manual_seed(11)
        cpu = op((64, 50)).numpy()
        rc.device(previous)
        if op is rc.rand:
            np.testing.assert_array_equal(gpu, cpu)  # the same 24-bit uniforms, exactly
        else:
            np.testing.assert_allclose(gpu, cpu, rtol=1e-4, atol=1e-5)
    logits = np.log(np.array([[0.2], [0.5], [0.3]], dtype=np.float32)) * np.ones((1, 20000), np.float32)
    draws = rc.sample_categorical(rc.tensor(logits)).numpy().ravel()
    np.testing.assert_allclose(np.bincount(draws, minlength=3) / draws.size, [0.2, 0.5, 0.3], atol=0.015)


def test_device_indices_are_clamped_and_host_indices_checked(on_gpu):
    x = rc.tensor(np.arange(12, dtype=np.float32).reshape(3, 4, order="F"))
    with pytest.raises(IndexError, match="get_rows: index 9 at position 1 is out of range for 4 columns"):
        rc.get_rows(x, np.array([0, 9]))
    computed = rc.tensor(np.array([[-5, 1, 70]], dtype=np.int32))  # as if computed on the device
    np.testing.assert_array_equal(rc.get_rows(x, computed).numpy(), x.numpy()[:, [0, 1, 3]])


def _mlp(device: str, seed: int = 0):
    rc.manual_seed(seed)
    previous = rc.device(device)
    model = rc.nn.Sequential(rc.nn.Linear(8, 32, activation="relu"), rc.nn.Dropout(0.1), rc.nn.Linear(32, 3))
    rc.device(previous)
    return model, rc.optim.Adam(model.parameters(), lr=1e-2)


def _train(device: str, steps: int = 30) -> list[float]:
    model, opt = _mlp(device)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    y = rng.integers(0, 3, 16)
    losses = []
    for _ in range(steps):
        with rc.grad_tape():
            loss = rc.softmax_cross_entropy_loss(model(rc.tensor(x, device=device)), y)
        opt.step(rc.backward(loss))
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_a_short_training_run_gives_the_same_loss_curve(on_gpu):
    cpu, gpu = _train("cpu"), _train("gpu")
    assert gpu[-1] < gpu[0]
    np.testing.assert_allclose(gpu, cpu, rtol=2e-3, atol=1e-4)  # dropout masks are identical too


def test_a_training_step_crosses_only_for_inputs_and_the_loss(on_gpu):
    model, opt = _mlp("gpu")
    x = np.random.default_rng(2).standard_normal((8, 16)).astype(np.float32)
    y = np.random.default_rng(3).integers(0, 3, 16)

    def step():
        with rc.grad_tape():
            loss = rc.softmax_cross_entropy_loss(model(rc.tensor(x)), y)
        opt.step(rc.backward(loss))
        opt.zero_grad()
        return loss.item()

    step()  # the first step makes the optimizer's moments (on the device: no upload either)
    rc.transfer_stats(reset=True)
    step()
    stats = rc.transfer_stats()
    assert stats["uploads"] == 2  # x, and the class indices y
    assert stats["upload_bytes"] == x.nbytes + y.size * 4
    assert stats["downloads"] == 1 and stats["download_bytes"] == 4  # the loss value
    assert all(p.device == "gpu" for p in model.parameters().values())
    assert all(s["m"].device == "gpu" for s in opt.state.values())


def test_device_gradients_are_handles(on_gpu):
    w = rc.param(np.ones((2, 2), np.float32), name="w")
    with rc.grad_tape():
        loss = rc.sum(w * w)
    grads = rc.backward(loss)
    handle = w.grad
    assert isinstance(handle, rc.tape.DeviceGradient) and isinstance(grads["w"], rc.tape.DeviceGradient)
    np.testing.assert_array_equal(handle.numpy(), 2 * np.ones((2, 2)))
    np.testing.assert_array_equal(np.asarray(grads[w]), 2 * np.ones((2, 2)))
    with pytest.raises(TypeError, match="handle without arithmetic"):
        handle + 1.0
    with pytest.raises(TypeError, match="handle without arithmetic"):
        handle * handle
    with rc.grad_tape():
        pass
    with pytest.raises(RuntimeError, match="earlier pass"):
        handle.numpy()


def test_mixed_devices_are_refused(on_gpu):
    a = rc.tensor(np.ones((2, 2), np.float32), device="gpu")
    b = rc.tensor(np.ones((2, 2), np.float32), device="cpu")
    with pytest.raises(ValueError, match="different devices"):
        rc.add(a, b)
    with pytest.raises(TypeError, match="CPU-only"):
        rc.tensor(np.ones((2, 2)), dtype="f64", device="gpu") * 2.0


def test_module_to_moves_parameters_in_place(on_gpu):
    rc.device("cpu")
    layer = rc.nn.Linear(3, 2)
    w_before = layer.W.numpy()
    same_object = layer.W
    layer.to("gpu")
    assert layer.W is same_object and layer.W.device == "gpu"
    np.testing.assert_array_equal(layer.W.numpy(), w_before)
    x = np.ones((3, 4), np.float32)
    np.testing.assert_allclose(layer(rc.tensor(x, device="gpu")).numpy(), w_before @ x + layer.b.numpy(), rtol=1e-6)


def test_tensors_larger_than_a_staging_piece_go_to_the_device_and_back(on_gpu):
    # uploads and downloads pass through staging memory in pieces of 64 MiB: 240 MB is three and a
    # remainder, each piece landing where it belongs
    n = 60_000_001
    x = np.arange(n, dtype=np.float32).reshape(n, 1)
    t = rc.tensor(x)
    assert t._impl.nbytes > 3 * (64 << 20)
    np.testing.assert_array_equal(t.numpy(), x)


def test_a_tensor_larger_than_the_gpus_memory_is_refused(on_gpu):
    memory = rc.devices()[1]["memory"]
    with pytest.raises(MemoryError, match=r"out of GPU memory: a tensor of \d+ bytes is larger than .*'s memory"):
        rc.full((memory // 4 + 1024, 1), 1.0)


def test_tensors_beyond_one_binding_range(on_gpu):
    # 160 MiB, more than lavapipe's 128 MiB storage-buffer range: shaders address memory by
    # device address, so no binding limits a tensor's size.
    x = np.tile(np.arange(4096, dtype=np.float32)[:, None] % 7, (1, 10240))
    t = rc.tensor(x)
    assert t._impl.nbytes > 128 << 20
    np.testing.assert_array_equal(rc.sum(t, dim=0).numpy(), x.sum(axis=0, keepdims=True))
    np.testing.assert_array_equal(rc.scale(t, 2.0).numpy()[:, -3:], 2 * x[:, -3:])


@pytest.mark.parametrize("x_shape, out_shape", [
    ((409600, 1), (1, 1)),               # a whole loss: its reduction split into slices
    ((20, 20, 32, 32), (1, 1, 1, 1)),
    ((8, 100000), (8, 1)),               # a bias gradient over a long batch: the reduced dimension trails
    ((512, 32), (512, 1)),               # ... over a short one: one workgroup per output, unsplit
    ((16384, 1), (1, 1)),                # the longest sum left whole
    ((16385, 1), (1, 1)),                # the shortest split: 8 slices, the last one shorter
    ((3000, 40), (1, 40)),               # the reduced dimension leads
    ((20, 20, 32, 32), (1, 1, 32, 1)),   # conv2d's bias gradient: reduced on both sides of the kept one
    ((7, 3000, 5), (7, 1, 5)),           # ... at an awkward size, split
    ((64, 16, 300), (64, 1, 300)),       # short sums over many outputs (an invocation each): decoded
    ((2, 32, 5000), (1, 1, 5000)),       # ... the longest (64), the reduced elements in one block
    ((65, 5000), (1, 5000)),             # ... the shortest left to a workgroup per output
    ((256, 64), (256, 1)),               # a bias gradient over a batch of 64, few outputs: workgroups
    ((8, 300), (1, 300)),                # a tiny sum: an invocation each however few outputs
    ((300000, 1), (300000, 1)),          # nothing to sum: each output its element
])
def test_sum_to_matches_numpy_in_every_layout(x_shape, out_shape, on_gpu):
    """sum_to on the GPU, wherever the reduced elements lie and whether or not its reduction is cut
    into slices (summed afterwards in order), against numpy's float64 sum; the same bits twice."""
    x = np.random.default_rng(8).standard_normal(x_shape).astype(np.float32)
    t = rc.tensor(np.asfortranarray(x))
    got = rc.sum_to(t, out_shape).numpy()
    axes = tuple(d for d in range(x.ndim) if out_shape[d] == 1 and x_shape[d] != 1)
    expected = x.astype(np.float64).sum(axis=axes, keepdims=True)
    assert got.size == expected.size
    np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-5,
                               atol=1e-5 * np.sqrt(x.size / expected.size))
    np.testing.assert_array_equal(rc.sum_to(t, out_shape).numpy(), got)


def test_devices_lists_the_gpu():
    rows = rc.devices()
    assert [r["device"] for r in rows] == ["cpu", "gpu"]
    assert rows[1]["backend"] == "vulkan" and rows[1]["memory"] > 0


def test_validation_layer_is_on_when_asked():
    if os.environ.get("RLKIT_VK_VALIDATION") == "1":
        assert _native.gpu_info()["validation"] is True
    assert _native.gpu_counters()["validation_errors"] == 0  # even in a process that has not used the GPU yet


_STATISTICS_PROBE = """
import json
import numpy as np
import rlkit.core as rc
from rlkit import _native
rc.device("gpu")
x = rc.tensor(np.ones((64, 64), np.float32))
(rc.matmul(x, x) + 1.0).numpy()
print(json.dumps([_native.gpu_info()["pipeline_statistics"], _native.gpu_pipeline_statistics()]))
"""


def test_pipeline_statistics_only_where_asked():
    """RLKIT_VK_PIPELINE_STATISTICS=1 keeps the driver compiler's statistics of every pipeline
    made (where the driver offers VK_KHR_pipeline_executable_properties: NVIDIA's does, lavapipe's
    of Mesa 22 does not), and the device works either way; without it nothing is kept."""
    env = {**os.environ, "RLKIT_VK_PIPELINE_STATISTICS": "1"}
    done = subprocess.run([sys.executable, "-c", _STATISTICS_PROBE], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    kept, statistics = json.loads(done.stdout.strip().splitlines()[-1])
    if kept:
        assert len(statistics) >= 2  # the product's shader and the add's
        for shader, named in statistics.items():
            assert named and all(isinstance(value, str) and value for value in named.values()), (shader, named)
    else:
        assert statistics == {}
    if os.environ.get("RLKIT_VK_PIPELINE_STATISTICS", "0") == "0":
        rc.synchronize()
        assert _native.gpu_info()["pipeline_statistics"] is False and _native.gpu_pipeline_statistics() == {}


def test_f16_tensors_compute_in_f32_on_the_gpu(on_gpu):
    x = np.random.default_rng(6).standard_normal((5, 7)).astype(np.float16)
    for device in ("cpu", "gpu"):
        t = rc.tensor(x, dtype="f16", device=device)
        out = rc.tanh(t * 2.0 + 1.0)
        assert out.dtype == "f16" and out.device == device
        if device == "cpu":
            expected = out.numpy()
    np.testing.assert_allclose(out.numpy().astype(np.float32), expected.astype(np.float32), atol=1e-3)


def test_submission_points(on_gpu, submits_only_when_read):
    model, opt = _mlp("gpu")
    x = rc.tensor(np.ones((8, 4), np.float32))
    with rc.grad_tape():
        loss = rc.mean(rc.square(model(x)))
    rc.backward(loss)
    before = rc.gpu_stats()["submits"]
    opt.step()  # the end of a step submits the recorded work, without a host read
    assert rc.gpu_stats()["submits"] == before + 1
    # A long recording is submitted in pieces as it grows; the result is still exact.
    t = rc.tensor(np.zeros((4, 1), np.float32))
    before = rc.gpu_stats()["submits"]
    for _ in range(5000):
        t = t + 1.0
    np.testing.assert_array_equal(t.numpy(), np.full((4, 1), 5000.0))
    assert rc.gpu_stats()["submits"] >= before + 2  # 5000 add dispatches: one early submit at 4096, then the read


def test_a_recording_the_host_spends_long_on_goes_to_the_gpu_in_pieces(on_gpu):
    """Once the host has recorded eager work for the set time, the next command submits it (the
    GPU runs it while the host records the rest); what is submitted early and what is submitted
    at the read make the exact result, and work recorded for less still goes in one submit."""
    x = rc.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    rc.synchronize()
    previous = _native.set_gpu_submit_after(1)  # microseconds: every command after the first submits
    try:
        before = rc.gpu_stats()["submits"]
        t = x
        for k in range(20):
            t = rc.add(rc.mul(t, 1.5), float(k))
        submitted_early = rc.gpu_stats()["submits"] - before
        got = t.numpy()
        _native.set_gpu_submit_after(10_000_000)  # ten seconds: no early submit in a short recording
        before = rc.gpu_stats()["submits"]
        u = rc.add(rc.mul(x, 2.0), 1.0)
        np.testing.assert_array_equal(u.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4) * 2 + 1)
        assert rc.gpu_stats()["submits"] == before + 1
    finally:
        _native.set_gpu_submit_after(previous)
    assert submitted_early >= 20, submitted_early  # 40 dispatches, nearly each its own submit
    expected = np.arange(12, dtype=np.float64).reshape(3, 4)
    for k in range(20):
        expected = expected * 1.5 + k
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    with pytest.raises(ValueError, match="microseconds must be >= 0"):
        _native.set_gpu_submit_after(-1)


@pytest.mark.skipif(os.environ.get("RLKIT_VK_VALIDATION") != "1",
                    reason="the validation layer is on only with RLKIT_VK_VALIDATION=1 (CI sets it)")
def test_the_validation_layer_is_really_active():
    """A deliberately invalid call (a buffer of size 0) made through a test-only hook is reported
    by the layer, and counted apart from rlkit's own validation errors (which must stay 0)."""
    rc.synchronize()
    before = _native.gpu_counters().get("validation_errors", 0)
    assert _native.provoke_validation_error() >= 1
    assert _native.gpu_counters().get("validation_errors", 0) == before
