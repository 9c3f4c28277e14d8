"""Capture: a replayed step equals the same step run eagerly, on both backends; re-recording
rules; host work refused while tracing; a non-finite gradient norm skips the update; one upload,
one submission and one download per replay on the GPU."""

import numpy as np
import pytest

import rlkit.core as rc
from conftest import DEVICES
from rlkit.buffers import DeviceBuffer



def _model(opt_cls=rc.optim.Adam, **kw):
    rc.manual_seed(0)
    model = rc.nn.Sequential(rc.nn.Linear(4, 16, activation="tanh"), rc.nn.Linear(16, 2))
    return model, opt_cls(model.parameters(), **kw)


def _batches(n, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((4, 32)).astype(np.float32), rng.standard_normal((2, 32)).astype(np.float32))
            for _ in range(n)]


def _eager_steps(model, opt, batches, max_grad_norm=None):
    losses = []
    for x, y in batches:
        with rc.grad_tape():
            loss = rc.mse_loss(model(rc.tensor(x)), y)
        grads = rc.backward(loss)
        if max_grad_norm is not None:
            rc.clip_grad_norm(list(model.parameters().values()), grads, max_grad_norm)
        opt.step(grads)
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("opt_cls, kw, max_norm", [(rc.optim.Adam, dict(lr=1e-2), None),
                                                     (rc.optim.AdamW, dict(lr=1e-2, weight_decay=0.1), 0.5),
                                                     (rc.optim.SGD, dict(lr=0.05, momentum=0.9), 1.0)])
def test_replayed_steps_equal_eager_steps(device, opt_cls, kw, max_norm):
    batches = _batches(6)
    eager_model, eager_opt = _model(opt_cls, **kw)
    eager = _eager_steps(eager_model, eager_opt, batches, max_norm)
    model, opt = _model(opt_cls, **kw)
    step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt, max_grad_norm=max_norm)
    captured = [step(x=x, y=y)[0] for x, y in batches]
    assert step.captured.traces == 1
    np.testing.assert_allclose(captured, eager, rtol=2e-5, atol=1e-6)
    for name, value in eager_model.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[name], value, rtol=2e-4, atol=2e-6, err_msg=name)
    first = model.parameters()["0.W"]
    assert opt.state[id(first)]["step"] == 6


def test_a_non_finite_gradient_norm_skips_the_update(device):
    model, opt = _model(lr=1e-2)
    step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt)
    x, y = _batches(1)[0]
    step(x=x, y=y)
    before = model.state_dict()
    moments = {k: (s["m"].numpy(), s["v"].numpy(), s["step"]) for k, s in opt.state.items()}
    bad = x.copy()
    bad[0, 0] = np.nan
    loss, norm = step(x=bad, y=y)
    assert np.isnan(loss) and np.isnan(norm)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    for k, s in opt.state.items():
        np.testing.assert_array_equal(s["m"].numpy(), moments[k][0])
        np.testing.assert_array_equal(s["v"].numpy(), moments[k][1])
        assert s["step"] == moments[k][2]
    assert np.isfinite(step(x=x, y=y)[0])  # and the next good step runs


def test_re_recording_rules(device):
    model, opt = _model(lr=1e-2)
    step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt)
    x, y = _batches(1)[0]
    step(x=x, y=y)
    step(x=x, y=y)
    assert step.captured.traces == 1
    step(x=x[:, :8], y=y[:, :8])  # a new batch size: a new signature
    assert step.captured.traces == 2
    model.load_state_dict(model.state_dict())  # parameters re-uploaded from the host
    step(x=x, y=y)
    assert step.captured.traces == 3


def test_buffers_are_read_where_they_are(device):
    buf = DeviceBuffer(3, 10)
    buf.write(np.arange(30, dtype=np.float32).reshape(3, 10, order="F"))
    gather = rc.capture(lambda index: rc.sum(rc.get_rows(buf, index), dim=0), params=[buf])
    index = np.array([[1, 4, 9]], dtype=np.int32)
    np.testing.assert_array_equal(gather(index=index), [[12.0, 39.0, 84.0]])
    buf.write(np.ones((3, 1), np.float32), 4)  # a column write: seen without re-recording
    np.testing.assert_array_equal(gather(index=index), [[12.0, 3.0, 84.0]])
    assert gather.traces == 1
    buf.free()
    with pytest.raises(RuntimeError, match="freed"):
        gather(index=index)


def test_host_work_in_a_trace_is_refused(device):
    w = rc.param(np.ones((2, 2), np.float32))
    reads = rc.capture(lambda x: rc.matmul(w, x) * float(w.numpy().sum()), params=[w])
    with pytest.raises(rc.CaptureError, match=r"reads a value on the host \(Tensor.numpy\(\) or item\(\)\)"):
        reads(x=np.ones((2, 1), np.float32))
    uploads = rc.capture(lambda x: rc.matmul(w, x) + rc.tensor(np.ones((2, 1), np.float32)), params=[w])
    with pytest.raises(rc.CaptureError, match=r"makes a tensor from host data \(rc.tensor\)"):
        uploads(x=np.ones((2, 1), np.float32))
    with pytest.raises(rc.CaptureError, match="must return a Tensor"):
        rc.capture(lambda x: 3)(x=np.ones((2, 1), np.float32))
    with pytest.raises(TypeError, match="fn must be callable"):
        rc.capture(3)
    with pytest.raises(ValueError, match="max_grad_norm"):
        rc.capture_step(lambda x: x, [w], rc.optim.SGD([w]), max_grad_norm=-1.0)


@pytest.mark.skipif("gpu" not in DEVICES, reason="needs the GPU backend")
def test_a_gpu_replay_is_one_upload_one_submission_one_download():
    previous = rc.device("gpu")
    try:
        model, opt = _model(lr=1e-2)
        step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), opt)
        x, y = _batches(1)[0]
        step(x=x, y=y)
        rc.gpu_stats(reset=True)
        step(x=x, y=y)
        stats = rc.gpu_stats()
        assert (stats["uploads"], stats["submits"], stats["downloads"]) == (1, 1, 1)
    finally:
        rc.device(previous)


def test_update_step_outside_a_capture_and_bad_clipping_are_refused():
    w = rc.param(np.ones((2, 2)))
    optimizer = rc.optim.SGD([w], lr=0.1)
    with pytest.raises(rc.CaptureError, match="only inside a captured function"):
        rc.capturing.update_step(lambda: rc.sum(w), [w], optimizer)
    with pytest.raises(ValueError, match="max_grad_norm must be a positive number or None, got -1"):
        rc.capture_step(lambda: rc.sum(w), [w], optimizer, max_grad_norm=-1)
