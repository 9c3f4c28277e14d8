"""One optimizer update over a whole parameter set (one pass over all their elements: one
dispatch on the GPU) against the same update applied one parameter at a time, numpy's textbook
Adam and SGD, and the CPU backend: awkward sizes (1 element, odd sizes, chunk edges, many
tensors), parameter groups, f16 parameters with f32 masters next to f32 ones, gradient scales
and skipped updates, captured steps, and a moved tensor re-recording the update's table. The
same for the other passes over a whole set: a target network's polyak update and the sum of
squares behind a global gradient norm."""

import re

import numpy as np
import pytest

import rlkit.core as rc
from rlkit import _native
from rlkit.agents.polyak import Polyak


# 1 element, odd sizes, the GPU's 1024-element chunks and their edges, 3-D and 4-D shapes
AWKWARD_SHAPES = [(1, 1), (3, 1), (1, 7), (5, 3), (1, 1), (257, 1), (33, 33), (1023, 1), (1024, 1), (1025, 1),
                  (2, 3, 5), (2, 3, 1, 2), (2049, 1)]
ADAM = dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6)


def _arrays(shapes, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


def _many_shapes(n, seed):
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(1, 40)), int(rng.integers(1, 9))) for _ in range(n)]


# ---- numpy's textbook rules (float64) -----------------------------------------------------------

def numpy_adam(w, g, m, v, t, lr, betas, eps, weight_decay=0.0, decoupled=False, grad_scale=1.0):
    """One Adam step at step t (1-based); returns the new (w, m, v)."""
    beta1, beta2 = betas
    w, g = w.astype(np.float64), grad_scale * g.astype(np.float64)
    if decoupled:
        w = w * (1 - lr * weight_decay)
    else:
        g = g + weight_decay * w
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    return w - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def numpy_sgd(w, g, velocity, lr, momentum=0.0, weight_decay=0.0, grad_scale=1.0):
    """One SGD step; returns the new (w, velocity)."""
    g = grad_scale * g.astype(np.float64) + weight_decay * w
    velocity = momentum * velocity + g
    return w - lr * velocity, velocity


# ---- the update op over a set against one call per parameter and numpy ------------------------

def _adam_hyper(t, lr, betas, eps, weight_decay=0.0, decoupled=False):
    """The captured adam_step's coefficients, as Adam computes them before a replay."""
    beta1, beta2 = betas
    return np.array([beta1, beta2, eps, 0.0 if decoupled else weight_decay, 1 - lr * weight_decay if decoupled else 1.0,
                     lr / (1 - beta1**t), 1 / (1 - beta2**t), 0.0], np.float32)[:, None]


def _apply_step(rule, hyper, scale, members):
    """The rule's update op over `members`: (w, g, state...) tensor tuples."""
    tensors = [t for member in members for t in member]
    rc.ops.apply(f"{rule}_step", (rc.tensor(hyper), rc.tensor(np.full((1, 1), scale, np.float32)), *tensors))


def _run_steps(rule, shapes, one_call, scale, steps=3):
    """`steps` updates of parameters of `shapes` by the update op, over the whole set in one
    call or one call per parameter; returns (w, state...) per parameter as numpy arrays."""
    members = []
    n_state = 2 if rule == "adam" else 1
    for w0 in _arrays(shapes, 1):
        state = [rc.tensor(np.zeros_like(w0)) for _ in range(n_state)]
        members.append((rc.param(w0), *state))
    for t in range(1, steps + 1):
        grads = [rc.tensor(g) for g in _arrays(shapes, 100 + t)]
        hyper = _adam_hyper(t, weight_decay=0.05, **ADAM) if rule == "adam" else \
            np.array([0.9, 0.05, 0.1, 0, 0, 0, 0, 0], np.float32)[:, None]  # momentum, weight decay, lr
        sets = [[(m[0], g, *m[1:]) for m, g in zip(members, grads)]]
        if not one_call:
            sets = [[member] for member in sets[0]]
        for subset in sets:
            _apply_step(rule, hyper, scale, subset)
    return [[t.numpy() for t in member] for member in members]


def _numpy_steps(rule, shapes, scale, steps=3):
    results = []
    for k, w in enumerate(_arrays(shapes, 1)):
        w = w.astype(np.float64)
        state = [np.zeros_like(w) for _ in range(2 if rule == "adam" else 1)]
        for t in range(1, steps + 1):
            g = _arrays(shapes, 100 + t)[k]
            if rule == "adam":
                w, *state = numpy_adam(w, g, *state, t, weight_decay=0.05, grad_scale=scale, **ADAM)
            else:
                w, *state = numpy_sgd(w, g, *state, lr=0.1, momentum=0.9, weight_decay=0.05, grad_scale=scale)
        results.append([w, *state])
    return results


@pytest.mark.parametrize("rule", ["adam", "sgd"])
@pytest.mark.parametrize("shapes", [AWKWARD_SHAPES, _many_shapes(150, 7)], ids=["awkward", "150 tensors"])
def test_one_update_over_a_set_equals_one_per_parameter_and_numpy(device, rule, shapes):
    fused = _run_steps(rule, shapes, one_call=True, scale=0.5)
    per_parameter = _run_steps(rule, shapes, one_call=False, scale=0.5)
    reference = _numpy_steps(rule, shapes, scale=0.5)
    for k, (got, alone, expected) in enumerate(zip(fused, per_parameter, reference)):
        for name, a, b, e in zip(("w", "state 1", "state 2"), got, alone, expected):
            np.testing.assert_array_equal(a, b, err_msg=f"parameter {k} {shapes[k]}: {name}")  # the same arithmetic
            np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-6, err_msg=f"parameter {k} {shapes[k]}: {name}")


@pytest.mark.requires_gpu
@pytest.mark.parametrize("rule", ["adam", "sgd"])
def test_the_gpu_update_equals_the_cpus(rule):
    results = {}
    for device in ("cpu", "gpu"):
        previous = rc.device(device)
        try:
            results[device] = _run_steps(rule, AWKWARD_SHAPES, one_call=True, scale=0.5)
        finally:
            rc.device(previous)
    for k, (gpu, cpu) in enumerate(zip(results["gpu"], results["cpu"])):
        for a, b in zip(gpu, cpu):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=f"parameter {k} {AWKWARD_SHAPES[k]}")


@pytest.mark.requires_gpu
def test_a_table_longer_than_one_command_buffer_write(on_gpu):
    """More chunk records than one vkCmdUpdateBuffer carries (64 KiB: 1638 records of 1024
    elements) are written in pieces; every element is still updated."""
    shapes = [(3, 1), (1700 * 1024 + 5, 1), (1, 1)]
    got = _run_steps("sgd", shapes, one_call=True, scale=1.0, steps=1)
    expected = _numpy_steps("sgd", shapes, scale=1.0, steps=1)
    for k, (g, e) in enumerate(zip(got, expected)):
        for a, b in zip(g, e):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6, err_msg=f"parameter {k} {shapes[k]}")


@pytest.mark.parametrize("rule", ["adam", "sgd"])
def test_a_non_finite_scale_leaves_the_whole_set_untouched(device, rule):
    shapes = [(1, 1), (1025, 1), (7, 3)]
    before = _run_steps(rule, shapes, one_call=True, scale=1.0, steps=0)
    after = _run_steps(rule, shapes, one_call=True, scale=float("nan"), steps=2)
    for b, a in zip(before, after):
        for x, y in zip(b, a):
            np.testing.assert_array_equal(x, y)


def _one_step_with_scale(rule, scale_input, ints=(), floats=()):
    """One update of a fixed set by the update op, its scale input ``scale_input`` and the given
    attributes; returns (w, state...) per parameter."""
    shapes = [(1, 1), (1025, 1), (7, 3)]
    members = []
    for w0 in _arrays(shapes, 1):
        members.append((rc.param(w0), *[rc.tensor(np.zeros_like(w0)) for _ in range(2 if rule == "adam" else 1)]))
    grads = [rc.tensor(g) for g in _arrays(shapes, 7)]
    hyper = _adam_hyper(1, **ADAM) if rule == "adam" else np.array([0.9, 0.1, 0.05, 0, 0, 0, 0, 0], np.float32)[:, None]
    tensors = [t for (w, *state), g in zip(members, grads) for t in (w, g, *state)]
    rc.ops.apply(f"{rule}_step", (rc.tensor(hyper), rc.tensor(np.full((1, 1), scale_input, np.float32)), *tensors),
                 ints, floats)
    return [[t.numpy() for t in member] for member in members]


@pytest.mark.parametrize("rule", ["adam", "sgd"])
@pytest.mark.parametrize("sum_squares, max_norm", [(4.0, 0.5), (0.01, 0.5), (9.0, 0.0), (0.0, 1.0), (1e30, 2.0),
                                                   (float("inf"), 0.5), (float("nan"), 0.0)])
def test_an_update_from_the_sum_of_squares_equals_one_from_its_clipping_factor(device, rule, sum_squares, max_norm):
    """With ints {1}, floats {max_grad_norm} the scale input is the gradients' sum of squares and
    the update clips by the factor capture's _gradient_factor computes from it as ops (1 without
    clipping, NaN where the sum is not finite: no update): the same parameters and state, bit
    for bit, as an update given that factor."""
    from rlkit.core.capturing import _gradient_factor

    factor = float(_gradient_factor(rc.tensor(np.full((1, 1), sum_squares, np.float32)), max_norm or None).numpy()[0, 0])
    assert (0.0 < factor <= 1.0) == np.isfinite(sum_squares)
    expected = _one_step_with_scale(rule, factor)
    got = _one_step_with_scale(rule, sum_squares, (1,), (max_norm,))
    for g, e in zip(got, expected):
        for a, b in zip(g, e):
            np.testing.assert_array_equal(a, b)


def test_an_update_refuses_attributes_it_does_not_know(device):
    w = rc.param(np.ones((2, 2), np.float32))
    inputs = (rc.zeros((8, 1)), rc.ones((1, 1)), w, rc.ones((2, 2)), rc.zeros((2, 2)), rc.zeros((2, 2)))
    for ints, floats, given in (((2,), (1.0,), "1 ints and 1 floats, ints[0] = 2"), ((1,), (), "1 ints and 0 floats"),
                                ((1,), (-1.0,), "floats[0] = -1"), ((1,), (float("inf"),), "floats[0] = inf"),
                                ((1, 1), (1.0,), "2 ints and 1 floats")):
        with pytest.raises(ValueError, match=re.escape("adam_step: attributes must be none, or ints {1} with floats "
                                                       "{max_grad_norm}, a finite number >= 0; got ")) as refused:
            rc.ops.apply("adam_step", inputs, ints, floats)
        assert given in str(refused.value)


# ---- optimizers: groups, master weights, mixed dtypes --------------------------------------------

def _linear_loss(params, coefficients):
    """sum_k sum(p_k * c_k): the gradient of p_k is c_k exactly."""
    total = None
    for p, c in zip(params, coefficients):
        term = rc.sum(p * rc.tensor(c, dtype=p.dtype))
        term = rc.cast(term, "f32") if p.dtype != "f32" else term
        total = term if total is None else total + term
    return total


def _coefficients(shapes, step, dtypes):
    """The gradients of step `step`, representable in each parameter's dtype."""
    return [c.astype(np.float16).astype(np.float32) if d == "f16" else c
            for c, d in zip(_arrays(shapes, 200 + step), dtypes)]


@pytest.mark.parametrize("opt_cls, group_kw, decoupled", [
    (rc.optim.Adam, [dict(weight_decay=0.1), dict(lr=0.03, betas=(0.5, 0.9))], False),
    (rc.optim.AdamW, [dict(weight_decay=0.2), dict(lr=0.03, weight_decay=0.0)], True),
    (rc.optim.SGD, [dict(momentum=0.9, weight_decay=0.1), dict(lr=0.2)], None),
])
def test_groups_and_f16_masters_next_to_f32_match_numpy(device, opt_cls, group_kw, decoupled):
    """Two groups of awkward sizes, f16 parameters (f32 masters) mixed with f32 ones in each."""
    shapes = AWKWARD_SHAPES
    dtypes = ["f16" if k % 3 == 0 else "f32" for k in range(len(shapes))]
    initial = [w.astype(np.float16).astype(np.float32) for w in _arrays(shapes, 1)]
    params = [rc.param(w, dtype=d) for w, d in zip(initial, dtypes)]
    half = len(params) // 2
    groups = [{"params": params[:half], **group_kw[0]}, {"params": params[half:], **group_kw[1]}]
    defaults = dict(lr=0.01) if opt_cls is rc.optim.SGD else dict(lr=0.01, betas=(0.9, 0.99), eps=1e-6)
    opt = opt_cls(groups, master_weights=True, **defaults)
    masters = [w.astype(np.float64) for w in initial]
    state = [[np.zeros_like(w) for _ in range(2 if decoupled is not None else 1)] for w in masters]
    for step in range(1, 4):
        coefficients = _coefficients(shapes, step, dtypes)
        with rc.grad_tape():
            loss = _linear_loss(params, coefficients)
        assert opt.step(rc.backward(loss))
        for k, g in enumerate(coefficients):
            settings = {**defaults, **group_kw[0 if k < half else 1]}
            if decoupled is None:
                masters[k], *state[k] = numpy_sgd(masters[k], g, *state[k], lr=settings["lr"],
                                                  momentum=settings.get("momentum", 0.0),
                                                  weight_decay=settings.get("weight_decay", 0.0))
            else:
                masters[k], *state[k] = numpy_adam(masters[k], g, *state[k], step, settings["lr"], settings["betas"],
                                                   settings["eps"], settings.get("weight_decay", 0.01 if decoupled
                                                                                 else 0.0), decoupled)
    for k, (p, expected) in enumerate(zip(params, masters)):
        if dtypes[k] == "f16":
            np.testing.assert_allclose(opt.master[id(p)].numpy(), expected, rtol=2e-5, atol=2e-6, err_msg=f"master {k}")
            np.testing.assert_allclose(p.numpy().astype(np.float32), expected, rtol=1e-3, atol=1e-3, err_msg=f"f16 {k}")
        else:
            np.testing.assert_allclose(p.numpy(), expected, rtol=2e-5, atol=2e-6, err_msg=f"parameter {k}")


def test_f32_and_f64_parameters_share_one_update_on_the_cpu():
    shapes = [(3, 2), (1, 1), (40, 1), (5, 5)]
    dtypes = ["f64", "f32", "f64", "f32"]
    initial = _arrays(shapes, 1)
    params = [rc.param(w, dtype=d) for w, d in zip(initial, dtypes)]
    opt = rc.optim.Adam(params, **ADAM)
    masters = [w.astype(np.float64) for w in initial]
    moments = [[np.zeros_like(w), np.zeros_like(w)] for w in masters]
    for step in range(1, 4):
        coefficients = _arrays(shapes, 300 + step)
        with rc.grad_tape():
            loss = _linear_loss(params, coefficients)
        opt.step(rc.backward(loss))
        for k, g in enumerate(coefficients):
            masters[k], *moments[k] = numpy_adam(masters[k], g, *moments[k], step, **ADAM)
    for k, (p, expected) in enumerate(zip(params, masters)):
        assert p.dtype == dtypes[k]
        tolerance = 1e-12 if dtypes[k] == "f64" else 2e-6
        np.testing.assert_allclose(p.numpy(), expected, rtol=tolerance * 10, atol=tolerance, err_msg=f"parameter {k}")


@pytest.mark.requires_gpu
def test_an_eager_step_is_one_dispatch_per_group(on_gpu):
    shapes = _many_shapes(40, 3)
    params = [rc.param(w) for w in _arrays(shapes, 1)]
    opt = rc.optim.Adam([{"params": params[:25]}, {"params": params[25:], "lr": 0.1}])
    with rc.grad_tape():
        loss = _linear_loss(params, _arrays(shapes, 2))
    grads = rc.backward(loss)
    rc.synchronize()
    before = rc.gpu_stats()["dispatches"]
    opt.step(grads)
    assert rc.gpu_stats()["dispatches"] - before == 2


# ---- captured steps --------------------------------------------------------------------------------

def _captured_problem(shapes, opt_cls, **kw):
    """Parameters of `shapes`, an optimizer over two groups, and a captured step minimising
    sum_k sum((p_k - x_k)^2) (inputs x0, x1, ...) with the gradient norm clipped to 1."""
    params = [rc.param(w) for w in _arrays(shapes, 1)]
    half = len(params) // 2
    opt = opt_cls([{"params": params[:half]}, {"params": params[half:], "lr": 0.02}], **kw)

    def loss(**x):
        total = None
        for k, p in enumerate(params):
            term = rc.sum(rc.square(p - x[f"x{k}"]))
            total = term if total is None else total + term
        return total

    return params, opt, rc.capture_step(loss, params, opt, max_grad_norm=1.0)


def _numpy_captured_steps(shapes, inputs, lrs, **kw):
    """numpy's clipped Adam on sum_k sum((p_k - x_k)^2), one entry of `inputs` per step."""
    params = [w.astype(np.float64) for w in _arrays(shapes, 1)]
    moments = [[np.zeros_like(w), np.zeros_like(w)] for w in params]
    for t, x in enumerate(inputs, start=1):
        grads = [2 * (p - x[f"x{k}"]) for k, p in enumerate(params)]
        norm = np.sqrt(sum(float(np.sum(g * g)) for g in grads))
        factor = min(1.0 / (norm + 1e-6), 1.0)
        for k, g in enumerate(grads):
            params[k], *moments[k] = numpy_adam(params[k], g * factor, *moments[k], t, lrs[k], **kw)
    return params


def _inputs(shapes, steps):
    return [{f"x{k}": x for k, x in enumerate(_arrays(shapes, 400 + t))} for t in range(steps)]


def test_a_captured_step_over_awkward_sizes_matches_numpy(device):
    shapes = AWKWARD_SHAPES
    params, opt, step = _captured_problem(shapes, rc.optim.Adam, lr=0.05, betas=(0.9, 0.99), eps=1e-6)
    inputs = _inputs(shapes, 4)
    for x in inputs:
        step(**x)
    assert step.captured.traces == 1 and opt.state[id(params[0])]["step"] == 4
    lrs = [0.05 if k < len(shapes) // 2 else 0.02 for k in range(len(shapes))]
    expected = _numpy_captured_steps(shapes, inputs, lrs, betas=(0.9, 0.99), eps=1e-6)
    for k, (p, e) in enumerate(zip(params, expected)):
        np.testing.assert_allclose(p.numpy(), e, rtol=2e-5, atol=2e-6, err_msg=f"parameter {k} {shapes[k]}")
    bad = {**inputs[0], "x3": np.full(shapes[3], np.nan, np.float32)}  # a NaN norm skips every group's update
    before = [p.numpy() for p in params]
    step(**bad)
    assert opt.state[id(params[0])]["step"] == 4
    for b, p in zip(before, params):
        np.testing.assert_array_equal(p.numpy(), b)


@pytest.mark.requires_gpu
def test_a_moved_parameter_or_moment_re_records_the_table(on_gpu):
    """The GPU update reads its tensors by the addresses in its table: after a parameter or a
    moment moves to new storage, the program records again (a new table) and goes on exactly."""
    shapes = [(5, 3), (1, 1), (1025, 1), (2, 7)]
    params, opt, step = _captured_problem(shapes, rc.optim.Adam, lr=0.05, betas=(0.9, 0.99), eps=1e-6)
    inputs = _inputs(shapes, 5)
    rc.gpu_stats(reset=True)
    step(**inputs[0])
    step(**inputs[1])
    _native.relocate(params[2]._impl)
    step(**inputs[2])
    _native.relocate(opt.state[id(params[0])]["v"]._impl)
    step(**inputs[3])
    step(**inputs[4])
    assert rc.gpu_stats()["recordings"] == 3 and step.captured.traces == 1
    lrs = [0.05, 0.05, 0.02, 0.02]
    expected = _numpy_captured_steps(shapes, inputs, lrs, betas=(0.9, 0.99), eps=1e-6)
    for k, (p, e) in enumerate(zip(params, expected)):
        np.testing.assert_allclose(p.numpy(), e, rtol=2e-5, atol=2e-6, err_msg=f"parameter {k} {shapes[k]}")


# ---- polyak updates and sums of squares over a set ------------------------------------------------

@pytest.mark.parametrize("tau", [0.005, 0.5, 1.0])
def test_a_polyak_update_over_a_set_matches_numpy(device, tau):
    sources, targets = _arrays(AWKWARD_SHAPES, 1), _arrays(AWKWARD_SHAPES, 2)
    targets[4][0, 0] = np.nan  # tau = 1 copies over it; otherwise it stays NaN
    source = {f"p{k}": rc.param(w) for k, w in enumerate(sources)}
    target = {f"p{k}": rc.param(w) for k, w in enumerate(targets)}
    polyak = Polyak(target, source)
    polyak(tau)
    polyak(tau)  # twice: (1 - tau)^2 of the old target is left
    for k, (t, s0, t0) in enumerate(zip(target.values(), sources, targets)):
        expected = (1 - (1 - tau) ** 2) * s0.astype(np.float64) + (1 - tau) ** 2 * t0
        if tau == 1.0:
            expected = s0
        np.testing.assert_allclose(t.numpy(), expected, rtol=1e-5, atol=1e-6, err_msg=f"parameter {k}")
        np.testing.assert_array_equal(source[f"p{k}"].numpy(), s0)  # the source is only read


def test_a_captured_polyak_update_follows_the_sources_update(device):
    """A captured step as the agents make it: an SGD step of the source network on
    sum((p - x)^2), then the polyak update of the target from the updated source."""
    shapes = [(3, 2), (1025, 1), (1, 1)]
    source = {f"p{k}": rc.param(w) for k, w in enumerate(_arrays(shapes, 1))}
    target = {f"p{k}": rc.param(w) for k, w in enumerate(_arrays(shapes, 2))}
    polyak = Polyak(target, source)
    opt = rc.optim.SGD(list(source.values()), lr=0.1)

    def step(**x):
        loss, _ = rc.update_step(lambda: sum(rc.sum(rc.square(p - x[name])) for name, p in source.items()),
                                 list(source.values()), opt)
        polyak(0.25)
        return loss

    captured = rc.capture(step, list(source.values()) + list(target.values()))
    expected_source = [w.astype(np.float64) for w in _arrays(shapes, 1)]
    expected_target = [w.astype(np.float64) for w in _arrays(shapes, 2)]
    for replay in range(3):
        x = {f"p{k}": a for k, a in enumerate(_arrays(shapes, 50 + replay))}
        captured(**x)
        for k in range(len(shapes)):
            expected_source[k] = expected_source[k] - 0.1 * 2 * (expected_source[k] - x[f"p{k}"])
            expected_target[k] = 0.25 * expected_source[k] + 0.75 * expected_target[k]
    assert captured.traces == 1
    for k, (s, t) in enumerate(zip(source.values(), target.values())):
        np.testing.assert_allclose(s.numpy(), expected_source[k], rtol=1e-5, atol=1e-6, err_msg=f"source {k}")
        np.testing.assert_allclose(t.numpy(), expected_target[k], rtol=1e-5, atol=1e-6, err_msg=f"target {k}")


@pytest.mark.parametrize("shapes", [AWKWARD_SHAPES, _many_shapes(150, 7)], ids=["awkward", "150 tensors"])
def test_the_sum_of_squares_of_a_set_matches_numpy(device, shapes):
    arrays = _arrays(shapes, 3)
    got = rc.sum_squares([rc.tensor(a) for a in arrays]).numpy()
    expected = sum(float(np.sum(a.astype(np.float64) ** 2)) for a in arrays)
    assert got.shape == (1, 1)
    np.testing.assert_allclose(got[0, 0], expected, rtol=1e-5)


@pytest.mark.requires_gpu
def test_the_sum_of_squares_of_any_number_of_tensors_is_one_dispatch(on_gpu):
    """The partial sums and their total in one dispatch (the last workgroup done adds them up)."""
    for n in (1, 150):
        tensors = [rc.tensor(a) for a in _arrays(_many_shapes(n, 5), 4)]
        rc.synchronize()
        before = rc.gpu_stats()["dispatches"]
        rc.sum_squares(tensors)
        assert rc.gpu_stats()["dispatches"] - before == 1, f"{n} tensors"
