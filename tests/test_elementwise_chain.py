"""Chains of elementwise ops in one kernel (elementwise_chain): every op a chain can hold, run
inside a chain, equals the same ops run one by one on both backends; a captured GPU program
fuses its runs of elementwise ops into chains, with the same results as the CPU program, fewer
dispatches, and never across an in-place write or past a value read elsewhere."""

import numpy as np
import pytest

import rlkit.core as rc
from conftest import AVAILABLE_DEVICES
from rlkit import _native


OP_ID = {name: k for k, name in enumerate(_native.op_names())}

# The float attributes a chain step of an op gets, where the op takes any: these, else 0.3 each.
NUMBERS = {"scale": (0.75,), "pow": (3.0,), "clamp": (-0.5, 0.4), "huber": (0.4,), "clamp_back": (-0.5, 0.4)}


def _unfused(name, numbers):
    return lambda *inputs: rc.ops.apply(name, inputs, floats=numbers)


def _ops_of(kinds):
    """Every elementwise op of these kinds (a chain holds them all): its float attributes and its
    unfused call."""
    table = {}
    for name, kind, _, n_floats in _native.elementwise_ops():
        if kind in kinds:
            numbers = NUMBERS.get(name, (0.3,) * n_floats)
            table[name] = (numbers, _unfused(name, numbers))
    return table


UNARY = _ops_of({"unary"})
BINARY = _ops_of({"binary", "backward"})  # the backward helpers: (g, saved) of one shape
BACKWARD = {name for name, kind, _, _ in _native.elementwise_ops() if kind == "backward"}
SHAPE = (37, 29)  # not a multiple of a workgroup


def _chain(inputs, steps):
    """elementwise_chain over `inputs`: steps of (op name, a, b, floats), shaped like input 0."""
    shape = inputs[0].shape
    ints = [*shape, *(1,) * (4 - len(shape)), len(shape)]
    floats = []
    for name, a, b, numbers in steps:
        ints += [OP_ID[name], a, b]
        floats += [*numbers, *(0.0,) * (2 - len(numbers))]
    return rc.ops.apply("elementwise_chain", tuple(inputs), ints=ints, floats=floats)


def _arrays(n, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(n)]
    arrays[0][0, :4] = [0.0, -0.5, 0.4, np.nan]  # zero, the clamp bounds, NaN
    return arrays


@pytest.mark.parametrize("name", sorted(UNARY))
def test_a_unary_op_in_a_chain_equals_the_op(device, name):
    numbers, op = UNARY[name]
    x, y = (rc.tensor(a) for a in _arrays(2, 1))
    scalar = rc.tensor(np.array([[1.5]], np.float32))
    # op(x), then (value * y) + scalar: the op first, reading an input; then the value so far
    got = _chain([x, y, scalar], [(name, 0, -2, numbers), ("mul", -1, 1, ()), ("add", -1, 2, ())]).numpy()
    expected = rc.add(rc.mul(op(x), y), scalar).numpy()
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)
    again = _chain([x], [("abs", 0, -2, ()), (name, -1, -2, numbers)]).numpy()  # the op on the value so far
    np.testing.assert_allclose(again, op(rc.abs(x)).numpy(), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_a_binary_op_in_a_chain_equals_the_op(device, name):
    numbers, op = BINARY[name]
    x, y, z = (rc.tensor(a) for a in _arrays(3, 2))
    first = _chain([x, y], [(name, 0, 1, numbers)]).numpy()
    np.testing.assert_allclose(first, op(x, y).numpy(), rtol=2e-6, atol=1e-6)
    # the value so far as either operand, and an operand of one element (the backward helpers
    # take equal shapes only)
    third = rc.tensor(np.array([[0.3]], np.float32)) if name not in BACKWARD else rc.scale(z, -0.7)
    got = _chain([x, z, third], [("tanh", 0, -2, ()), (name, -1, 1, numbers), (name, 2, -1, numbers)]).numpy()
    expected = op(third, op(rc.tanh(x), z)).numpy()
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)


def _captured(fn, device, params=()):
    previous = rc.device(device)
    try:
        program = rc.capture(fn, params)
        return program
    finally:
        rc.device(previous)


def _run(program, device, **inputs):
    previous = rc.device(device)
    try:
        return program(**inputs)
    finally:
        rc.device(previous)


@pytest.mark.requires_gpu
def test_a_captured_gpu_program_fuses_runs_of_elementwise_ops():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 33)).astype(np.float32)
    b = rng.standard_normal((64, 33)).astype(np.float32)

    def huber_like(x, b):  # eleven elementwise ops, one reduction
        d = rc.sub(rc.tanh(rc.add(rc.scale(x, 2.0), b)), 0.5)  # d's only reader is the next op
        quadratic = rc.minimum(rc.abs(d), 1.0)
        loss = rc.add(rc.scale(rc.square(quadratic), 0.5), rc.sub(rc.abs(d), quadratic))
        return rc.sum(loss)

    results = {}
    for device in AVAILABLE_DEVICES:
        program = _captured(huber_like, device)
        _run(program, device, x=x, b=b)  # traces and records
        rc.gpu_stats(reset=True)
        results[device] = _run(program, device, x=x, b=b)
    dispatches = rc.gpu_stats()["dispatches"]
    np.testing.assert_allclose(results["gpu"], results["cpu"], rtol=1e-5)
    d = np.tanh(2 * x + b) - 0.5
    quadratic = np.minimum(np.abs(d), 1.0)
    np.testing.assert_allclose(results["cpu"], [[np.sum(0.5 * quadratic**2 + np.abs(d) - quadratic)]], rtol=1e-5)
    # d is read twice, so the ops before it are one chain and the rest others: far fewer than 12
    assert dispatches <= 5, dispatches


@pytest.mark.requires_gpu
def test_a_chain_never_moves_a_read_past_an_in_place_write_or_hides_a_value_read_elsewhere():
    target = rc.param(np.full((3, 4), 2.0, np.float32), device="gpu")
    columns = rc.tensor(np.arange(4, dtype=np.int32)[None, :], device="gpu")

    def step(x):
        doubled = rc.scale(target, 2.0)  # reads target before the write below
        rc.ops.apply("put_cols", (target, columns, rc.stop_gradient(x)))
        before = rc.add(doubled, 1.0)  # the run continues after the write: it must not move the read
        shared = rc.exp(rc.scale(x, 0.5))  # read by two ops below, and an output
        after = rc.mul(rc.add(target, shared), shared)
        return [before, shared, after]

    program = _captured(step, "gpu", [target])
    for value in (5.0, 7.0):
        old = target.numpy().copy()
        x = np.full((3, 4), value, np.float32)
        before, shared, after = _run(program, "gpu", x=x)
        np.testing.assert_allclose(before, 2 * old + 1, rtol=1e-6)
        np.testing.assert_allclose(shared, np.exp(0.5 * x), rtol=1e-6)
        np.testing.assert_allclose(after, (x + np.exp(0.5 * x)) * np.exp(0.5 * x), rtol=1e-6)


def test_an_eager_chain_checks_its_inputs():
    x = rc.tensor(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="step 0 must read an input of the output's shape"):
        _chain([x, rc.tensor(np.ones((1, 1), np.float32))], [("neg", 1, -2, ())])
    with pytest.raises(ValueError, match="a unary op's operand b must be -2"):
        _chain([x], [("neg", 0, 0, ())])


def _level_labels(program) -> list[str]:
    """The kernels of each level of a captured GPU program's last replay (run with GPU profiling
    on from its first: a program records its timestamps when it is built)."""
    (captured,) = program._programs.values()
    return [label for _, label in captured.native.level_times()]


@pytest.fixture
def gpu_profiling():
    assert _native.set_gpu_profiling(True)
    yield
    _native.set_gpu_profiling(False)


@pytest.mark.requires_gpu
@pytest.mark.parametrize("shape", [(1, 256), (512, 512)], ids=["small", "large"])
def test_a_small_result_read_by_two_chains_is_computed_again_in_each(shape, gpu_profiling):
    """q - y read by a loss's square and by its gradient, as in a critic's loss: where it is
    small, each reader's chain computes it again from q and y, so both run in the level of the
    inputs, a level fewer than after it; a large one is computed once and read (computing it
    again would cost more than the level). The values are numpy's either way."""
    rng = np.random.default_rng(5)
    q, y = (np.asfortranarray(rng.standard_normal(shape).astype(np.float32)) for _ in range(2))

    def loss_and_gradient(q, y):
        d = rc.sub(q, y)
        return [rc.sum(rc.square(d)), rc.scale(d, 2.0 / shape[1])]

    program = _captured(loss_and_gradient, "gpu")
    loss, gradient = _run(program, "gpu", q=q, y=y)
    d = q.astype(np.float64) - y
    np.testing.assert_allclose(loss, [[np.sum(d * d)]], rtol=1e-5)
    np.testing.assert_allclose(gradient, 2.0 / shape[1] * d, rtol=1e-6)
    levels = _level_labels(program)  # the first is the inputs' upload
    if shape == (1, 256):  # the square and the scale each after a copy of the subtraction
        assert levels[1].split() == ["elementwise_chain[1]"] * 2 and "binary_sub" not in " ".join(levels), levels
    else:
        assert levels[1].split() == ["binary_sub[1024]"] and "elementwise_chain" not in " ".join(levels), levels
        assert sorted(levels[2].split()) == ["unary_scale[1024]", "unary_square[1024]"], levels


@pytest.mark.requires_gpu
def test_a_binary_op_on_two_runs_extends_the_later_one(gpu_profiling):
    """add(early, late), where the run `early` reads the inputs and the run `late` a reduction's
    result: the add extends `late`, taking `early`'s result as an input, so the sum runs in the
    level after the reduction; extending `early` (the first operand) had made `late` a level of
    its own before it (skipped_count's flags: the critic's norm early, the actor's late)."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 1)).astype(np.float32)
    y = np.asfortranarray(rng.standard_normal((8, 16)).astype(np.float32))

    def combined(x, y):
        early = rc.neg(rc.exp(x))  # [1, 1], from the inputs
        late = rc.scale(rc.sqrt(rc.sum(rc.square(y))), 2.0)  # [1, 1], after the reduction
        return rc.add(early, late)

    program = _captured(combined, "gpu")
    (total,) = np.asarray(_run(program, "gpu", x=x, y=y)).reshape(-1)
    y64 = y.astype(np.float64)
    np.testing.assert_allclose(total, -np.exp(x[0, 0]) + 2.0 * np.sqrt(np.sum(y64 * y64)), rtol=1e-5)
    levels = _level_labels(program)
    reduction = next(k for k, label in enumerate(levels) if "sum" in label)
    assert levels[reduction + 1].split() == ["elementwise_chain[1]"], levels  # sqrt, scale and the add
    assert levels[reduction + 2] == "outputs", levels
