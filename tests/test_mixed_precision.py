"""Mixed precision: f16 parameters trained through f32 master weights with loss scaling
(rlkit.core.optim): the same accuracy as f32 training, steps with Inf/NaN gradients skipped and
the scale halved, the scale doubled after clean steps, a static scale undone exactly, state
dicts that resume, captured steps with master weights and loss scales equal to eager ones, and
clear errors."""

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
    with pytest.raises(rc.CaptureError, match="return the unscaled loss; a captured step"):
        rc.capture_step(lambda: optimizer.scale_loss(rc.sum(rc.square(p))), [p], optimizer)()

    def manual_step():  # backward and step by hand: nothing scales the loss
        with rc.grad_tape():
            loss = rc.sum(rc.square(p))
        optimizer.step(rc.backward(loss))
        return loss

    with pytest.raises(rc.CaptureError, match="loss scaling steps inside rc.capture_step or rc.update_step"):
        rc.capture(manual_step)()


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_cast_into_rounds_each_source_into_its_target_in_place(device, dtype):
    """The op a captured step with master weights ends with: each target becomes its source
    rounded to nearest even in the target's dtype (numpy's rounding; ml_dtypes' for bf16), past
    the largest f16 to inf, NaN kept."""
    rng = np.random.default_rng(3)
    sources = [rng.normal(size=(5, 3)) * 100.0, np.array([[1e6, -1e6, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, np.nan]])]
    targets = [rc.tensor(np.zeros(s.shape, np.float32), dtype=dtype) for s in sources]
    keep = targets[0]._impl  # written in place: the same storage afterwards
    rc.ops.apply("cast_into", tuple(t for pair in zip(targets, (rc.tensor(s.astype(np.float32)) for s in sources))
                                    for t in pair))
    assert targets[0]._impl is keep
    for target, source in zip(targets, sources):
        with np.errstate(over="ignore"):  # numpy's f16 of 1e6 is inf, as the op's must be
            expected = source.astype(np.float32).astype(target.numpy().dtype)
        # compared in f32 (exact for f16 and bf16), where numpy's NaN-aware comparison works
        np.testing.assert_array_equal(target.numpy().astype(np.float32), expected.astype(np.float32))


def _master_weight_model(dtype, opt_cls, **kw):
    previous = rc.dtype(dtype)
    try:
        rc.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 16, activation="relu"), nn.Linear(16, 2))
        return model, opt_cls(model.parameters(), master_weights=True, **kw)
    finally:
        rc.dtype(previous)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("opt_cls, kw", [(rc.optim.Adam, dict(lr=1e-2)), (rc.optim.SGD, dict(lr=0.05, momentum=0.9))])
def test_captured_steps_with_master_weights_equal_eager_steps(device, dtype, opt_cls, kw):
    """rc.capture_step over f16 / bf16 parameters with master weights: the same masters, moments
    and parameters as eager steps, and the parameters stay their masters rounded. The CPU runs the
    same update code both ways (equal bit for bit); the GPU's eager and captured updates are two
    shaders, whose compilers may contract differently (a float32 rounding, and so at most one
    step of the parameters' dtype)."""
    exact = device == "cpu"
    close32 = dict(rtol=0, atol=0) if exact else dict(rtol=1e-5, atol=1e-7)
    close16 = dict(rtol=0, atol=0) if exact else dict(rtol=2.0**-7, atol=1e-7)
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((4, 32)).astype(np.float32), rng.standard_normal((2, 32)).astype(np.float32))
               for _ in range(5)]
    eager_model, eager_opt = _master_weight_model(dtype, opt_cls, **kw)
    eager_losses = []
    for x, y in batches:
        with rc.grad_tape():
            loss = rc.mse_loss(rc.cast(eager_model(rc.cast(rc.tensor(x), dtype)), "f32"), y)
        eager_opt.step(rc.backward(loss))
        eager_losses.append(loss.item())
    model, opt = _master_weight_model(dtype, opt_cls, **kw)
    step = rc.capture_step(lambda x, y: rc.mse_loss(rc.cast(model(rc.cast(x, dtype)), "f32"), y), model.parameters(), opt)
    losses = [step(x=x, y=y)[0] for x, y in batches]
    assert step.captured.traces == 1
    np.testing.assert_allclose(losses, eager_losses, **(close32 if exact else dict(rtol=1e-3)))
    for (name, p), q in zip(model.parameters().items(), eager_model.parameters().values()):
        assert p.dtype == dtype
        master = opt.master[id(p)].numpy()
        np.testing.assert_array_equal(p.numpy(), master.astype(p.numpy().dtype), err_msg=name)  # exact everywhere
        np.testing.assert_allclose(p.numpy().astype(np.float32), q.numpy().astype(np.float32), **close16, err_msg=name)
        np.testing.assert_allclose(master, eager_opt.master[id(q)].numpy(), **close32, err_msg=name)
        for slot in opt.slots:
            np.testing.assert_allclose(opt.state[id(p)][slot].numpy(), eager_opt.state[id(q)][slot].numpy(), **close32)
        assert opt.state[id(p)]["step"] == len(batches)


@pytest.mark.parametrize("loss_scale", ["dynamic", 512.0])
def test_captured_steps_with_a_loss_scale_equal_eager_steps(device, loss_scale):
    """f16 with master weights and a loss scale, captured: the step scales the loss by each
    replay's scale. With a dynamic scale, a batch whose f16 gradients overflow is skipped and
    halves the scale, and clean steps double it (growth_interval 2), as eager steps do."""
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((4, 32)).astype(np.float32), rng.standard_normal((2, 32)).astype(np.float32))
               for _ in range(6)]
    if loss_scale == "dynamic":
        batches[2] = (batches[2][0] * 3e4, batches[2][1])  # f16 activations and gradients overflow
    kw = dict(lr=1e-2, loss_scale=loss_scale, growth_interval=2)
    eager_model, eager_opt = _master_weight_model("f16", rc.optim.Adam, **kw)
    eager_scales, eager_updated = [], []
    for x, y in batches:
        with rc.grad_tape():
            loss = eager_opt.scale_loss(rc.mse_loss(rc.cast(eager_model(rc.cast(rc.tensor(x), "f16")), "f32"), y))
        eager_updated.append(eager_opt.step(rc.backward(loss)))
        eager_scales.append(eager_opt.loss_scale)
    model, opt = _master_weight_model("f16", rc.optim.Adam, **kw)
    step = rc.capture_step(lambda x, y: rc.mse_loss(rc.cast(model(rc.cast(x, "f16")), "f32"), y), model.parameters(), opt)
    scales, norms = [], []
    for x, y in batches:
        norms.append(step(x=x, y=y)[1])
        scales.append(opt.loss_scale)
    assert step.captured.traces == 1
    assert scales == eager_scales
    assert [np.isfinite(n) for n in norms] == eager_updated
    if loss_scale == "dynamic":
        assert eager_updated == [True, True, False, True, True, True]
        assert eager_scales == [2.0**15, 2.0**16, 2.0**15, 2.0**15, 2.0**16, 2.0**16]
    exact = device == "cpu"
    for (name, p), q in zip(model.parameters().items(), eager_model.parameters().values()):
        np.testing.assert_array_equal(p.numpy(), opt.master[id(p)].numpy().astype(np.float16), err_msg=name)
        np.testing.assert_allclose(opt.master[id(p)].numpy(), eager_opt.master[id(q)].numpy(),
                                   rtol=0 if exact else 1e-5, atol=0 if exact else 1e-7, err_msg=name)
        assert opt.state[id(p)]["step"] == eager_opt.state[id(q)]["step"] == sum(eager_updated)

