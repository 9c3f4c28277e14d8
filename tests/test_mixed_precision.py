"""Mixed precision: f16 parameters trained through f32 master weights with loss scaling
(rlkit.core.optim): the same accuracy as f32 training, steps with Inf/NaN gradients skipped and
the scale halved, the scale doubled after clean steps, a static scale undone exactly, state
dicts that resume, and clear errors."""

import numpy as np
import pytest

import rlkit.core as rc
from rlkit.core import nn


def blobs(n, seed):
    """Three Gaussian classes in 4-D: x [4, n], one-hot y [3, n]."""
    rng = np.random.default_rng(seed)
    centers = np.array([[3.0, 0, 0], [0, 3.0, 0], [0, 0, 3.0], [1.0, -1.0, 0]])
    labels = rng.integers(0, 3, n)
    return centers[:, labels] + rng.normal(size=(4, n)), np.eye(3)[labels].T


def train(dtype, steps=300, **options):
    """Accuracy on held-out blobs, steps skipped, the final loss scale and the model."""
    previous = rc.dtype(dtype)
    try:
        rc.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 32, activation="relu"), nn.Linear(32, 3))
        optimizer = rc.optim.Adam(model.parameters(), lr=0.01, **options)
        x, y = blobs(512, 1)
        test_x, test_y = blobs(512, 2)
        skipped = 0
        for i in range(steps):
            cols = np.random.default_rng(i).integers(0, 512, 64)
            with rc.grad_tape():
                loss = optimizer.scale_loss(rc.softmax_cross_entropy_loss(model(rc.tensor(x[:, cols])),
                                                                          rc.tensor(y[:, cols])))
            skipped += not optimizer.step(rc.backward(loss))
        accuracy = float((model(rc.tensor(test_x)).numpy().argmax(0) == test_y.argmax(0)).mean())
        return accuracy, skipped, optimizer, model
    finally:
        rc.dtype(previous)


def test_f16_with_master_weights_trains_to_the_accuracy_of_f32(device):
    accuracy32, _, _, _ = train("f32")
    accuracy16, skipped, optimizer, model = train("f16", master_weights=True, loss_scale="dynamic")
    assert accuracy32 > 0.9 and abs(accuracy16 - accuracy32) <= 0.02, (accuracy16, accuracy32)
    assert all(p.dtype == "f16" for p in model.parameters().values())
    for p in model.parameters().values():  # the parameter is its f32 master rounded to f16
        master = optimizer.master[id(p)]
        assert master.dtype == "f32" and optimizer.state[id(p)]["m"].dtype == "f32"
        np.testing.assert_array_equal(p.numpy(), master.numpy().astype(np.float16))
    assert skipped == 0 and optimizer.loss_scale == 2.0**15


def one_param_step(optimizer, p, factor):
    """A step on loss = factor * sum(p), scaled by the optimizer."""
    with rc.grad_tape():
        loss = optimizer.scale_loss(rc.scale(rc.sum(p), factor))
    return optimizer.step(rc.backward(loss))


def f16_param(values):
    previous = rc.dtype("f16")
    try:
        return rc.param(np.asarray(values, np.float64))
    finally:
        rc.dtype(previous)


def test_a_step_with_overflowing_gradients_is_skipped_and_halves_the_scale():
    p = f16_param([[0.5, -0.25]])
    optimizer = rc.optim.Adam([p], lr=0.1, master_weights=True, loss_scale="dynamic")
    # d loss / d p = 1e4; times the scale 32768 it is 3.3e8, past f16's 65504: Inf
    assert one_param_step(optimizer, p, 1e4) is False
    assert optimizer.loss_scale == 2.0**14
    np.testing.assert_array_equal(p.numpy(), np.array([[0.5, -0.25]], np.float16))
    assert optimizer.state[id(p)]["step"] == 0 and not optimizer.state[id(p)]["m"].numpy().any()
    # a gradient small enough for the scale: the step is taken
    assert one_param_step(optimizer, p, 1.0) is True
    assert optimizer.state[id(p)]["step"] == 1 and optimizer.loss_scale == 2.0**14
    np.testing.assert_allclose(p.numpy().astype(np.float64), [[0.4, -0.35]], atol=1e-3)  # Adam's first step: lr


def test_the_scale_doubles_after_growth_interval_clean_steps():
    p = rc.param(np.array([[0.5]]))  # f32: f16 itself cannot hold a scale above 2**15
    optimizer = rc.optim.SGD([p], lr=0.01, loss_scale="dynamic", growth_interval=3)
    scales = []
    for _ in range(7):
        assert one_param_step(optimizer, p, 0.01)
        scales.append(optimizer.loss_scale)
    assert scales == [2.0**15] * 2 + [2.0**16] * 3 + [2.0**17] * 2


def test_in_f16_a_scale_past_what_f16_holds_is_halved_back():
    p = f16_param([[0.5]])
    optimizer = rc.optim.SGD([p], lr=0.01, master_weights=True, loss_scale="dynamic", growth_interval=2)
    taken = [one_param_step(optimizer, p, 0.01) for _ in range(3)]
    # two clean steps double the scale to 2**16, which f16 holds as Inf: the third step is skipped
    assert taken == [True, True, False] and optimizer.loss_scale == 2.0**15


def test_a_static_scale_is_undone_exactly():
    results = []
    for loss_scale in (None, 1024.0):
        rc.manual_seed(3)
        model = nn.Linear(3, 2)
        optimizer = rc.optim.Adam(model.parameters(), lr=0.05, loss_scale=loss_scale)
        x = rc.tensor(np.random.default_rng(0).normal(size=(3, 8)))
        for _ in range(5):
            with rc.grad_tape():
                loss = optimizer.scale_loss(rc.mean(rc.square(model(x))))
            optimizer.step(rc.backward(loss))
        results.append(model.W.numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)


def test_the_state_dict_keeps_master_weights_and_the_scale():
    _, _, optimizer, model = train("f16", steps=20, master_weights=True, loss_scale="dynamic", growth_interval=7)
    saved_model, saved = model.state_dict(), optimizer.state_dict()
    _, _, fresh, fresh_model = train("f16", steps=1, master_weights=True, loss_scale="dynamic", growth_interval=7)
    fresh_model.load_state_dict(saved_model)
    fresh.load_state_dict(saved)
    assert fresh.loss_scale == optimizer.loss_scale and fresh._scaling.clean_steps == optimizer._scaling.clean_steps
    for a, b in zip(model.parameters().values(), fresh_model.parameters().values()):
        np.testing.assert_array_equal(fresh.master[id(b)].numpy(), optimizer.master[id(a)].numpy())
        np.testing.assert_array_equal(fresh.state[id(b)]["v"].numpy(), optimizer.state[id(a)]["v"].numpy())


def test_mixed_precision_errors():
    with pytest.raises(TypeError, match="the f16 parameter .* needs master_weights=True"):
        train("f16", steps=1)
    p = rc.param(np.ones((2, 1)))
    for bad in ("always", 0.0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="loss_scale must be None, a positive number or 'dynamic'"):
            rc.optim.Adam([p], loss_scale=bad)
    with pytest.raises(ValueError, match="growth_interval must be a positive int"):
        rc.optim.Adam([p], loss_scale="dynamic", growth_interval=0)
    optimizer = rc.optim.SGD([p], lr=0.1, loss_scale="dynamic")
    with pytest.raises(rc.CaptureError, match="master weights or loss scaling cannot be captured yet"):
        rc.capture_step(lambda: rc.sum(rc.square(p)), [p], optimizer)()
