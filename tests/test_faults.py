"""Faults: running out of memory in the middle of a training step raises MemoryError with a
message saying so, and leaves parameters, optimizer state and buffers as they were and usable:
training then goes on exactly as a run that never failed, on both backends."""

import numpy as np
import pytest

import rlkit.core as rc
from rlkit.buffers import ReplayBuffer

TOO_BIG = (1 << 20, 1 << 19)  # 2 TiB of f32: more than any host or device here


def _model_and_optimizer():
    rc.manual_seed(0)
    model = rc.nn.Sequential(rc.nn.Linear(4, 8, activation="relu"), rc.nn.Linear(8, 2))
    return model, rc.optim.Adam(model.parameters(), lr=1e-2)


def _step(model, optimizer, x, y, exhaust_memory=False):
    with rc.grad_tape():
        out = model(x)  # [2, 16]
        if exhaust_memory:
            out = out + rc.sum(rc.full(TOO_BIG, 0.0))  # the allocation fails mid-forward
        loss = rc.mse_loss(out, y)
    optimizer.step(rc.backward(loss))


def test_out_of_memory_mid_step_leaves_training_usable(device):
    rng = np.random.default_rng(0)
    x = rc.tensor(rng.standard_normal((4, 16)).astype(np.float32))
    y = rc.tensor(rng.standard_normal((2, 16)).astype(np.float32))
    buffer = ReplayBuffer(64, 4, 1, seed=0)
    buffer.add(np.ones((1, 4)), np.zeros((1, 1)), [1.0], np.ones((1, 4)), [False], [False])

    model, optimizer = _model_and_optimizer()
    _step(model, optimizer, x, y)
    weights, state = model.state_dict(), optimizer.state_dict()
    with pytest.raises(MemoryError, match="out of (host|GPU) memory"):
        _step(model, optimizer, x, y, exhaust_memory=True)
    with pytest.raises(MemoryError):
        ReplayBuffer(1 << 40, 4, 1)  # a buffer larger than the device: refused before allocating
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, weights[name], err_msg=name)
    assert [s["step"] for s in optimizer.state.values()] == [s["step"] for s in state["state"].values()]

    _step(model, optimizer, x, y)  # training goes on
    reference, reference_optimizer = _model_and_optimizer()
    for _ in range(2):
        _step(reference, reference_optimizer, x, y)
    for name, value in reference.state_dict().items():
        np.testing.assert_array_equal(model.state_dict()[name], value, err_msg=name)
    buffer.add(np.zeros((1, 4)), np.zeros((1, 1)), [2.0], np.zeros((1, 4)), [True], [False])
    assert len(buffer) == 2 and buffer.sample(4).reward.numpy().max() == 2.0


def test_out_of_memory_while_recording_a_capture_leaves_training_usable(device):
    """A captured step whose program cannot get its memory fails on its first call with
    MemoryError; nothing was updated, and other captured steps record and replay as before."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    y = rng.standard_normal((2, 16)).astype(np.float32)
    model, optimizer = _model_and_optimizer()
    weights = model.state_dict()

    def too_big(x, y):
        return rc.mse_loss(model(x) + rc.sum(rc.full(TOO_BIG, 0.0)), y)

    with pytest.raises(MemoryError, match="out of (host|GPU) memory"):
        rc.capture_step(too_big, model.parameters(), optimizer)(x=x, y=y)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, weights[name], err_msg=name)
    assert all(s["step"] == 0 for s in optimizer.state.values())
    step = rc.capture_step(lambda x, y: rc.mse_loss(model(x), y), model.parameters(), optimizer)
    first, _ = step(x=x, y=y)
    second, _ = step(x=x, y=y)
    assert second < first and step.captured.traces == 1
