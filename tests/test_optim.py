"""Optimizers against numpy re-implementations of the textbook update rules (PyTorch's
semantics), convergence on a quadratic, learning-rate changes and argument checks."""

import numpy as np
import pytest

import rlkit.core as rc
from rlkit.core import optim

RNG = np.random.default_rng(0)
W0 = RNG.standard_normal((3, 4))
B0 = RNG.standard_normal((3, 1))
X = np.asfortranarray(RNG.standard_normal((4, 10)))
T = np.asfortranarray(RNG.standard_normal((3, 10)))


@pytest.fixture(autouse=True)
def _close_tape():
    yield
    with rc.grad_tape():
        pass


def numpy_grads(W, b):
    """Gradients of mean((W X + b - T)^2)."""
    r = 2 * (W @ X + b - T) / T.size
    return r @ X.T, r.sum(axis=1, keepdims=True)


def train(opt_cls, steps, dtype="f64", lrs=None, use_dot_grad=False, **kw):
    """Runs `steps` optimizer steps on the linear least-squares problem; returns (W, b)."""
    W = rc.param(W0, name="W", dtype=dtype)
    b = rc.param(B0, name="b", dtype=dtype)
    opt = opt_cls([W, b], **kw)
    x, t = rc.tensor(X, dtype=dtype), rc.tensor(T, dtype=dtype)
    for k in range(steps):
        if lrs is not None:
            opt.lr = lrs[k]
        with rc.grad_tape():
            loss = rc.mse_loss(W @ x + b, t)
        grads = rc.backward(loss)
        opt.step(None if use_dot_grad else grads)
        opt.zero_grad()
    return W.numpy(), b.numpy()


def numpy_sgd(steps, lr, momentum=0.0, weight_decay=0.0, lrs=None):
    params = [W0.copy(), B0.copy()]
    velocity = [np.zeros_like(p) for p in params]
    for k in range(steps):
        rate = lr if lrs is None else lrs[k]
        grads = numpy_grads(*params)
        for i, (p, g) in enumerate(zip(params, grads)):
            g = g + weight_decay * p
            velocity[i] = momentum * velocity[i] + g
            params[i] = p - rate * velocity[i]
    return params


def numpy_adam(steps, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False, lrs=None):
    beta1, beta2 = betas
    params = [W0.copy(), B0.copy()]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for k in range(steps):
        t = k + 1
        rate = lr if lrs is None else lrs[k]
        grads = numpy_grads(*params)
        for i, (p, g) in enumerate(zip(params, grads)):
            if decoupled:
                p = p * (1 - rate * weight_decay)
            else:
                g = g + weight_decay * p
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            m_hat = m[i] / (1 - beta1**t)
            v_hat = v[i] / (1 - beta2**t)
            params[i] = p - rate * m_hat / (np.sqrt(v_hat) + eps)
    return params


# ---- update rules ------------------------------------------------------------------------

@pytest.mark.parametrize(
    "kw",
    [dict(lr=0.1), dict(lr=0.05, momentum=0.9), dict(lr=0.05, momentum=0.5, weight_decay=0.1)],
)
def test_sgd_matches_numpy(kw):
    W, b = train(optim.SGD, 7, **kw)
    W_ref, b_ref = numpy_sgd(7, **kw)
    np.testing.assert_allclose(W, W_ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(b, b_ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "kw",
    [
        dict(lr=0.01),
        dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6),
        dict(lr=0.02, weight_decay=0.1),
        dict(lr=0.1, eps=0.5),  # a large eps makes the bias corrections visible in the result
    ],
)
def test_adam_matches_numpy(kw):
    W, b = train(optim.Adam, 8, **kw)
    W_ref, b_ref = numpy_adam(8, **kw)
    np.testing.assert_allclose(W, W_ref, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(b, b_ref, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("kw", [dict(lr=0.01), dict(lr=0.05, weight_decay=0.3), dict(lr=0.1, weight_decay=0.5, eps=0.1)])
def test_adamw_matches_numpy_with_decoupled_decay(kw):
    W, b = train(optim.AdamW, 8, **kw)
    W_ref, b_ref = numpy_adam(8, decoupled=True, **{"weight_decay": 0.01, **kw})
    np.testing.assert_allclose(W, W_ref, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(b, b_ref, rtol=1e-11, atol=1e-13)


def test_adamw_default_weight_decay_is_decoupled_and_differs_from_adam():
    W_w, _ = train(optim.AdamW, 5, lr=0.1, weight_decay=0.2)
    W_a, _ = train(optim.Adam, 5, lr=0.1, weight_decay=0.2)
    np.testing.assert_allclose(W_w, numpy_adam(5, 0.1, weight_decay=0.2, decoupled=True)[0], rtol=1e-11)
    np.testing.assert_allclose(W_a, numpy_adam(5, 0.1, weight_decay=0.2, decoupled=False)[0], rtol=1e-11)
    assert not np.allclose(W_w, W_a)


def test_f32_parameters_follow_the_same_rules():
    W, b = train(optim.Adam, 5, dtype="f32", lr=0.05)
    W_ref, b_ref = numpy_adam(5, 0.05)
    np.testing.assert_allclose(W, W_ref, rtol=1e-4, atol=1e-5)
    W, b = train(optim.SGD, 5, dtype="f32", lr=0.05, momentum=0.9)
    W_ref, b_ref = numpy_sgd(5, 0.05, momentum=0.9)
    np.testing.assert_allclose(W, W_ref, rtol=1e-5, atol=1e-6)


def test_step_without_grads_uses_the_accumulated_dot_grad():
    W, b = train(optim.Adam, 4, use_dot_grad=True, lr=0.05)
    W_ref, b_ref = numpy_adam(4, 0.05)
    np.testing.assert_allclose(W, W_ref, rtol=1e-11)
    np.testing.assert_allclose(b, b_ref, rtol=1e-11)


def test_two_backward_passes_before_a_step_add_up():
    p = rc.param(np.array([1.0, -2.0]), dtype="f64")
    opt = optim.SGD([p], lr=0.1)
    for _ in range(2):
        with rc.grad_tape():
            loss = rc.sum(p * p)
        rc.backward(loss)
    opt.step()
    np.testing.assert_allclose(p.numpy().ravel(), np.array([1.0, -2.0]) * (1 - 0.1 * 4))


def test_changing_lr_between_steps_takes_effect():
    lrs = [0.1, 0.0, 0.3, 0.05, 0.2]
    W, b = train(optim.SGD, 5, lr=0.1, momentum=0.9, lrs=lrs)
    W_ref, _ = numpy_sgd(5, 0.1, momentum=0.9, lrs=lrs)
    np.testing.assert_allclose(W, W_ref, rtol=1e-12)
    W, b = train(optim.Adam, 5, lr=0.1, lrs=lrs)
    W_ref, _ = numpy_adam(5, 0.1, lrs=lrs)
    np.testing.assert_allclose(W, W_ref, rtol=1e-11)
    # lr = 0 freezes the parameters
    W, b = train(optim.Adam, 3, lr=0.1, lrs=[0.0, 0.0, 0.0])
    np.testing.assert_array_equal(W, W0)


def test_adam_bias_correction_counts_the_steps_of_each_parameter():
    # PyTorch keeps a step count per parameter: one without a gradient in a step does not
    # advance its bias correction.
    a = rc.param(np.array([1.0, 2.0]), dtype="f64")
    c = rc.param(np.array([3.0]), dtype="f64")
    opt = optim.Adam([a, c], lr=0.1, eps=0.5)
    ref = {"a": np.array([1.0, 2.0]), "c": np.array([3.0])}
    state = {k: [np.zeros_like(v), np.zeros_like(v), 0] for k, v in ref.items()}

    def ref_step(name, g):
        m, v, t = state[name]
        t += 1
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        ref[name] = ref[name] - 0.1 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 0.5)
        state[name] = [m, v, t]

    for k in range(4):
        with rc.grad_tape():
            loss = rc.sum(a * a) + rc.sum(c * c) if k % 2 else rc.sum(a * a)
        grads = rc.backward(loss)
        ref_step("a", 2 * ref["a"])
        if k % 2:
            ref_step("c", 2 * ref["c"])
        opt.step(grads)
        opt.zero_grad()
        np.testing.assert_allclose(a.numpy().ravel(), ref["a"], rtol=1e-12)
        np.testing.assert_allclose(c.numpy().ravel(), ref["c"], rtol=1e-12)


@pytest.mark.parametrize("opt_cls", [optim.Adam, optim.SGD])
def test_an_eager_step_bumps_the_versions_a_replay_does_not(opt_cls):
    """An eager step is a write of the parameters and their state that version readers see (a
    captured function over them re-traces, DQN refreshes its host copy); a captured step's replay
    is the capture's own update."""
    w = rc.param(np.ones((3, 2), np.float32))
    opt = opt_cls([w], lr=0.1)
    state = [t for t in opt.state[id(w)].values() if isinstance(t, rc.Tensor)]

    def versions():
        return [t._impl.version for t in (w, *state)]

    before = versions()
    with rc.grad_tape():
        loss = rc.sum(rc.square(w))
    opt.step(rc.backward(loss))
    assert versions() == [v + 1 for v in before]
    step = rc.capture_step(lambda x: rc.sum(rc.square(w - x)), [w], opt)
    x = np.zeros((3, 2), np.float32)
    step(x=x)
    before = versions()
    step(x=x)
    assert versions() == before and step.captured.traces == 1


def test_a_parameter_listed_twice_is_updated_once():
    p = rc.param(np.array([1.0]), dtype="f64")
    opt = optim.SGD([p, p], lr=0.25)
    with rc.grad_tape():
        loss = rc.sum(p * p)
    opt.step(rc.backward(loss))
    assert p.numpy().item() == pytest.approx(1.0 - 0.25 * 2.0)


def test_params_given_as_a_dict():
    W = rc.param(W0, name="W", dtype="f64")
    opt = optim.SGD({"W": W}, lr=0.5)
    with rc.grad_tape():
        loss = rc.sum(W)
    opt.step(rc.backward(loss))
    np.testing.assert_allclose(W.numpy(), W0 - 0.5)


# ---- convergence ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "opt_cls, kw, steps",
    [
        (optim.SGD, dict(lr=0.1), 200),
        (optim.SGD, dict(lr=0.05, momentum=0.9), 200),
        (optim.Adam, dict(lr=0.05), 600),
        (optim.AdamW, dict(lr=0.05, weight_decay=0.0), 600),
    ],
)
def test_quadratic_converges_to_its_minimum(opt_cls, kw, steps):
    # f(w) = sum(a * (w - c)^2), minimum at c
    a = np.array([1.0, 2.0, 0.5, 3.0])
    c = np.array([0.5, -1.0, 2.0, 0.25])
    w = rc.param(np.zeros(4), dtype="f64")
    opt = opt_cls([w], **kw)
    for _ in range(steps):
        with rc.grad_tape():
            loss = rc.sum(rc.mul(rc.square(w - c.reshape(4, 1)), a.reshape(4, 1)))
        opt.step(rc.backward(loss))
    np.testing.assert_allclose(w.numpy().ravel(), c, atol=1e-3)


# ---- arguments ------------------------------------------------------------------------------

@pytest.mark.parametrize("opt_cls", [optim.SGD, optim.Adam, optim.AdamW])
def test_empty_parameter_list_is_a_value_error(opt_cls):
    with pytest.raises(ValueError, match="empty"):
        opt_cls([])
    with pytest.raises(ValueError, match="empty"):
        opt_cls({})


@pytest.mark.parametrize("opt_cls", [optim.SGD, optim.Adam, optim.AdamW])
def test_non_parameters_are_a_type_error(opt_cls):
    p = rc.param(np.ones(2))
    with pytest.raises(TypeError):
        opt_cls([rc.tensor(np.ones(2))])  # not trainable
    with pytest.raises(TypeError):
        opt_cls([np.ones(2)])
    with pytest.raises(TypeError):
        opt_cls(p)  # a single tensor, not a list
    with rc.grad_tape():
        intermediate = p * 2.0  # requires grad, but is not a parameter
    with pytest.raises(TypeError):
        opt_cls([p, intermediate])


@pytest.mark.parametrize(
    "opt_cls, kw",
    [
        (optim.SGD, dict(lr=-0.1)),
        (optim.SGD, dict(lr=float("nan"))),
        (optim.SGD, dict(momentum=-0.5)),
        (optim.SGD, dict(weight_decay=-1.0)),
        (optim.Adam, dict(lr=-1e-3)),
        (optim.Adam, dict(betas=(1.0, 0.999))),
        (optim.Adam, dict(betas=(0.9, -0.1))),
        (optim.Adam, dict(eps=-1e-8)),
        (optim.AdamW, dict(weight_decay=-0.01)),
    ],
)
def test_bad_hyperparameters_are_value_errors(opt_cls, kw):
    with pytest.raises(ValueError):
        opt_cls([rc.param(np.ones(2))], **kw)


def test_zero_grad_clears_every_parameter():
    a, b = rc.param(np.ones(2)), rc.param(np.ones(3))
    opt = optim.Adam([a, b])
    with rc.grad_tape():
        loss = rc.sum(a) + rc.sum(b)
    rc.backward(loss)
    assert a.grad is not None and b.grad is not None
    opt.zero_grad()
    assert a.grad is None and b.grad is None


# ---- parameter groups, accumulation, state dicts -----------------------------------------

def _linear_problem(dtype="f64"):
    W = rc.param(W0, name="W", dtype=dtype)
    b = rc.param(B0, name="b", dtype=dtype)
    return W, b, rc.tensor(X, dtype=dtype), rc.tensor(T, dtype=dtype)


def _step(opt, W, b, x, t):
    with rc.grad_tape():
        loss = rc.mse_loss(W @ x + b, t)
    updated = opt.step(rc.backward(loss))
    opt.zero_grad()
    return updated


def test_parameter_groups_use_their_own_settings():
    W, b, x, t = _linear_problem()
    opt = optim.SGD([{"params": [W], "lr": 0.5}, {"params": [b]}], lr=0.1)
    gW, gb = numpy_grads(W0, B0)
    _step(opt, W, b, x, t)
    np.testing.assert_allclose(W.numpy(), W0 - 0.5 * gW, rtol=1e-12)
    np.testing.assert_allclose(b.numpy(), B0 - 0.1 * gb, rtol=1e-12)


def test_setting_lr_keeps_the_ratio_between_groups():
    W, b, _, _ = _linear_problem()
    opt = optim.Adam([{"params": [W], "lr": 0.02}, {"params": [b], "lr": 0.01}])
    opt.lr = 0.04
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.04, 0.02])
    with pytest.raises(ValueError, match="lr"):
        opt.lr = -1.0
    with pytest.raises(ValueError, match="lr"):
        opt.lr = float("nan")


def test_bad_groups_are_refused():
    W, b, _, _ = _linear_problem()
    with pytest.raises(ValueError, match="unknown settings \\['lr_scale'\\]"):
        optim.SGD([{"params": [W], "lr_scale": 2.0}])
    with pytest.raises(ValueError, match="accumulate_steps"):
        optim.SGD([W], accumulate_steps=0)
    with pytest.raises(TypeError, match="gradients"):
        optim.SGD([W]).step({"W": np.zeros((3, 4))})


@pytest.mark.parametrize("average", [True, False])
def test_accumulate_steps_updates_once_with_the_mean_gradient(average):
    W, b, x, t = _linear_problem()
    opt = optim.SGD([W, b], lr=0.1, accumulate_steps=2, average=average)
    x2 = rc.tensor(X[:, ::-1].copy(order="F"), dtype="f64")
    assert _step(opt, W, b, x, t) is False
    np.testing.assert_array_equal(W.numpy(), W0)  # nothing moved yet
    assert _step(opt, W, b, x2, t) is True
    g1 = numpy_grads(W0, B0)[0]
    r = 2 * (W0 @ X[:, ::-1] + B0 - T) / T.size
    g2 = r @ X[:, ::-1].T
    factor = 0.5 if average else 1.0
    np.testing.assert_allclose(W.numpy(), W0 - 0.1 * factor * (g1 + g2), rtol=1e-12)


@pytest.mark.parametrize("opt_cls, kw", [(optim.SGD, dict(lr=0.1, momentum=0.9)), (optim.Adam, dict(lr=0.05)),
                                         (optim.AdamW, dict(lr=0.05, weight_decay=0.1))])
def test_state_dict_round_trip_continues_identically(opt_cls, kw):
    W, b, x, t = _linear_problem()
    opt = opt_cls([W, b], **kw)
    for _ in range(3):
        _step(opt, W, b, x, t)
    saved, weights = opt.state_dict(), (W.numpy(), b.numpy())
    W2, b2 = rc.param(weights[0], dtype="f64"), rc.param(weights[1], dtype="f64")
    opt2 = opt_cls([W2, b2], lr=123.0)  # hyperparameters come back from the state too
    opt2.load_state_dict(saved)
    assert opt2.lr == opt.lr
    for _ in range(2):
        _step(opt, W, b, x, t)
        _step(opt2, W2, b2, x, t)
    np.testing.assert_array_equal(W.numpy(), W2.numpy())
    np.testing.assert_array_equal(b.numpy(), b2.numpy())


def test_load_state_dict_refuses_foreign_states():
    W, b, x, t = _linear_problem()
    adam = optim.Adam([W, b])
    _step(adam, W, b, x, t)
    with pytest.raises(ValueError, match="Adam state cannot load into SGD"):
        optim.SGD([W, b]).load_state_dict(adam.state_dict())
    with pytest.raises(ValueError, match="groups differ"):
        optim.Adam([W]).load_state_dict(adam.state_dict())
    other = rc.param(np.zeros((2, 2)), dtype="f64")
    with pytest.raises(ValueError, match="m of parameter 0 has shape"):
        optim.Adam([other, b]).load_state_dict(adam.state_dict())
