"""NaN and infinities are never hidden by fusion: the fused linear op, with each activation,
gives what its unfused ops give, and a captured program's chains of elementwise ops (fused
into one kernel on the GPU) give what the same ops give eagerly, NaN and +-inf included, on
both backends; where NaN and +-inf land is checked against numpy in float64 as well."""

import numpy as np
import pytest

import rlkit.core as rc
from test_elementwise_chain import BINARY, UNARY

ACTIVATIONS = {None: lambda z: z, "relu": rc.relu, "tanh": rc.tanh, "sigmoid": rc.sigmoid}
NP_ACTIVATIONS = {None: lambda z: z, "relu": lambda z: np.maximum(z, 0.0), "tanh": np.tanh,
                  "sigmoid": lambda z: 1.0 / (1.0 + np.exp(-z))}


def _assert_same_values(got, expected, rtol=1e-6, atol=1e-7):
    """Equal NaN and +-inf positions, and close elsewhere."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(expected))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(expected))
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True)


def _linear_operands(seed):
    """W [5, 7], x [7, 9], b [5, 1] with NaN and +-inf in x, in W and in b, and zeros that
    multiply a NaN or an infinity (a product a kernel must not skip)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((5, 7)).astype(np.float32)
    x = rng.standard_normal((7, 9)).astype(np.float32)
    b = rng.standard_normal((5, 1)).astype(np.float32)
    x[:, 0] = np.nan  # a whole observation
    x[2, 1] = np.nan
    x[3, 2], x[4, 3] = np.inf, -np.inf
    x[1, 4], x[5, 4] = np.inf, np.inf  # +inf times weights of both signs: NaN or +-inf
    w[0, :] = np.inf  # a row of +inf: every column hits inf * x
    w[1, 6] = np.nan
    w[2, 3] = 0.0  # 0 * x[3, 2] = 0 * inf
    x[5, 5] = 0.0
    w[3, 5] = np.nan  # NaN * 0
    b[4, 0] = np.nan
    return w, x, b


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_fused_linear_propagates_nan_and_infinities_as_its_unfused_ops(device, activation, dtype):
    w, x, b = (rc.tensor(a, dtype=dtype).numpy().astype(np.float64) for a in _linear_operands(seed=4))
    W, X, B = (rc.tensor(a.astype(np.float32), dtype=dtype) for a in (w, x, b))
    fused = rc.linear(W, X, B, activation).numpy().astype(np.float64)
    unfused = ACTIVATIONS[activation](rc.add(rc.matmul(W, X), B)).numpy().astype(np.float64)
    tolerance = {"f32": 1e-6, "f16": 2e-3, "bf16": 2e-2}[dtype]  # the unfused ops round after each op
    _assert_same_values(fused, unfused, rtol=tolerance, atol=tolerance)
    with np.errstate(all="ignore"):
        reference = NP_ACTIVATIONS[activation](w @ x + b)
    _assert_same_values(fused, reference, rtol=max(tolerance, 1e-5), atol=max(tolerance, 1e-5))
    assert np.all(np.isnan(fused[:, 0]))  # the NaN observation's column stays NaN through every activation


def test_fused_linear_layers_give_nan_for_a_nan_observation(device):
    """The issue's case: a relu MLP (fused linear layers) turned an all-NaN observation into
    finite outputs; now they are NaN, as the unfused ops give."""
    rc.manual_seed(0)
    net = rc.nn.Sequential(rc.nn.Linear(4, 8, activation="relu"), rc.nn.Linear(8, 2))
    obs = np.full((4, 3), np.nan, np.float32)
    obs[:, 1] = 0.5
    out = net(rc.tensor(obs)).numpy()
    assert np.all(np.isnan(out[:, [0, 2]])) and np.all(np.isfinite(out[:, 1]))


def _nonfinite_arrays(n, seed, shape=(37, 29)):
    """Normal values with NaN, +inf and -inf at scattered places, different in each array."""
    rng = np.random.default_rng(seed)
    arrays = []
    for _ in range(n):
        a = rng.standard_normal(shape).astype(np.float32)
        flat = a.reshape(-1)
        spots = rng.choice(flat.size, 30, replace=False)
        flat[spots[:10]], flat[spots[10:20]], flat[spots[20:]] = np.nan, np.inf, -np.inf
        a[0, :3] = [np.nan, np.inf, -np.inf]  # at the same places in every array too
        arrays.append(a)
    return arrays


def _captured_and_eager(fn, device, arrays):
    """fn on device tensors of `arrays`, eagerly and as a captured program (whose runs of
    elementwise ops are chains, one kernel each, on the GPU)."""
    eager = fn(*(rc.tensor(a) for a in arrays)).numpy()
    names = [f"a{k}" for k in range(len(arrays))]
    program = rc.capture(lambda **inputs: fn(*(inputs[n] for n in names)))
    inputs = dict(zip(names, arrays))
    program(**inputs)  # traces
    captured = np.asarray(program(**inputs))
    return captured.reshape(eager.shape), eager


@pytest.mark.parametrize("name", sorted(UNARY))
def test_a_captured_chain_with_a_unary_op_propagates_nan_as_eager_ops(device, name):
    _, op = UNARY[name]

    def fn(x, y):  # a run of four elementwise ops around the op: one chain
        return rc.add(rc.mul(op(rc.scale(x, 1.5)), y), 0.25)

    captured, eager = _captured_and_eager(fn, device, _nonfinite_arrays(2, seed=5))
    _assert_same_values(captured, eager)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_a_captured_chain_with_a_binary_op_propagates_nan_as_eager_ops(device, name):
    _, op = BINARY[name]

    def fn(x, y, z):
        return rc.sub(op(rc.tanh(x), op(y, z)), 0.5)

    captured, eager = _captured_and_eager(fn, device, _nonfinite_arrays(3, seed=6))
    _assert_same_values(captured, eager)


def test_activations_propagate_nan_as_numpy(device):
    x = np.array([[np.nan, np.inf, -np.inf, 0.0, -2.0, 3.0]], np.float32)
    X = rc.tensor(x)
    with np.errstate(all="ignore"):
        expected = {"relu": np.maximum(x, 0.0), "tanh": np.tanh(x), "sigmoid": 1.0 / (1.0 + np.exp(-x)),
                    "softplus": np.logaddexp(x, 0.0), "silu": x / (1.0 + np.exp(-x))}
    for name, values in expected.items():
        _assert_same_values(getattr(rc, name)(X).numpy(), values.astype(np.float32))
