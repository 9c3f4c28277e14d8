"""Property-based tests (hypothesis) over the public API: random shapes, broadcast patterns,
NaN and Inf, huge and negative indices, wrong types and freed objects. Every case ends in the
numpy result or a documented exception (TypeError, ValueError, IndexError, RuntimeError) —
never a crash or a hang. The number of cases each property ran is printed at the end."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rlkit.core as rc
from rlkit.buffers import DeviceBuffer

CASES_RUN: collections.Counter = collections.Counter()  # reported by conftest's terminal summary
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# float32 values with the awkward ones well represented
FLOATS = st.one_of(st.floats(-1e6, 1e6, width=32), st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0]))
DOCUMENTED = (TypeError, ValueError, IndexError, RuntimeError)


def _broadcast_pair(draw):
    """Two shapes of 1-4 dims that broadcast (some dims 1 on either side), or do not."""
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    a = [n if draw(st.booleans()) else 1 for n in shape]
    b = [n if draw(st.booleans()) else 1 for n in shape]
    if draw(st.integers(0, 9)) == 0:  # sometimes a clash: sizes that are neither equal nor 1
        i = draw(st.integers(0, len(shape) - 1))
        a[i], b[i] = 2, 3
    return tuple(a), tuple(b)


@st.composite
def binary_inputs(draw):
    a_shape, b_shape = _broadcast_pair(draw)
    a = draw(hnp.arrays(np.float32, a_shape, elements=FLOATS))
    b = draw(hnp.arrays(np.float32, b_shape, elements=FLOATS))
    op = draw(st.sampled_from(["add", "sub", "mul", "maximum", "minimum"]))
    return op, a, b


NUMPY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum}


@SETTINGS
@given(binary_inputs())
def test_binary_ops_broadcast_as_numpy_or_refuse(case):
    CASES_RUN["binary ops, broadcasting, NaN/Inf"] += 1
    op, a, b = case
    try:
        with np.errstate(all="ignore"):  # inf - inf and the like: NaN, as rlkit gives
            expected = NUMPY[op](a, b)
    except ValueError:
        with pytest.raises(ValueError, match="broadcast"):
            getattr(rc, op)(rc.tensor(np.asfortranarray(a)), rc.tensor(np.asfortranarray(b)))
        return
    got = getattr(rc, op)(rc.tensor(np.asfortranarray(a)), rc.tensor(np.asfortranarray(b))).numpy()
    np.testing.assert_array_equal(got.reshape(expected.shape), expected)  # NaN where numpy has NaN


@SETTINGS
@given(hnp.array_shapes(min_dims=1, max_dims=4, max_side=4), st.sampled_from(["f32", "f64", "f16", "i32"]),
       st.sampled_from(["f32", "f64", "f16", "i32"]), st.sampled_from(["add", "mul", "maximum"]))
def test_dtype_pairs_compute_in_their_dtype_or_refuse(shape, dtype_a, dtype_b, op):
    """The same float dtype computes in it (f16 stored, computed in f32); integers and mixed
    dtypes are TypeErrors that name both."""
    CASES_RUN["dtype pairs"] += 1
    rng = np.random.default_rng(len(shape))
    a_values, b_values = rng.uniform(-4, 4, shape), rng.uniform(-4, 4, shape)
    whole = {"i32": np.trunc}  # i32 data must be whole numbers
    a = rc.tensor(whole.get(dtype_a, np.asarray)(a_values), dtype=dtype_a)
    b = rc.tensor(whole.get(dtype_b, np.asarray)(b_values), dtype=dtype_b)
    if dtype_a != dtype_b or dtype_a == "i32":
        with pytest.raises(TypeError, match="dtypes differ|must be a float tensor"):
            getattr(rc, op)(a, b)
        return
    out = getattr(rc, op)(a, b)
    assert out.dtype == dtype_a
    as_stored = {"f32": np.float32, "f64": np.float64, "f16": np.float16}[dtype_a]
    expected = NUMPY[op](a_values.astype(as_stored).astype(np.float64), b_values.astype(as_stored).astype(np.float64))
    tolerance = {"f32": 1e-6, "f64": 1e-12, "f16": 1e-3}[dtype_a]
    np.testing.assert_allclose(out.numpy().astype(np.float64).reshape(expected.shape), expected, rtol=tolerance,
                               atol=tolerance)


@SETTINGS
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=6), elements=FLOATS),
       st.lists(st.integers(-2**40, 2**40) | st.integers(-3, 8), min_size=0, max_size=8))
def test_get_rows_with_any_indices(x, index):
    CASES_RUN["get_rows, huge/negative/empty indices"] += 1
    columns = x.shape[1]
    t = rc.tensor(np.asfortranarray(x))
    if not index:
        with pytest.raises(ValueError, match="empty"):
            rc.get_rows(t, np.array(index, np.int64))
        return
    index = np.array(index, np.int64)
    if index.min() < 0 or index.max() >= columns:
        with pytest.raises(IndexError, match="out of range|32 bits"):
            rc.get_rows(t, index)
        return
    np.testing.assert_array_equal(rc.get_rows(t, index).numpy(), x[:, index])


@SETTINGS
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=4, max_side=5), elements=FLOATS),
       st.sampled_from([None, 0, 1]), st.sampled_from(["sum", "mean", "max"]))
def test_reductions_as_numpy(x, dim, op):
    CASES_RUN["reductions, NaN/Inf"] += 1
    t = rc.tensor(np.asfortranarray(x))
    if op == "max":
        if x.ndim > 2:
            return
        x2 = x.reshape(x.shape[0], -1)
        got, expected = rc.max(rc.tensor(np.asfortranarray(x2))).numpy(), x2.max(axis=0, keepdims=True)
        np.testing.assert_array_equal(got, expected)
        return
    x = x.reshape(t.shape, order="F")  # as rlkit holds it: at least 2 dimensions
    if dim is not None and dim >= x.ndim:
        with pytest.raises(ValueError):
            getattr(rc, op)(t, dim=dim)
        return
    with np.errstate(all="ignore"):
        expected = getattr(np, op)(x.astype(np.float64), axis=dim, keepdims=True)
    got = getattr(rc, op)(t, dim=dim).numpy().astype(np.float64)
    scale = 1.0 + float(np.max(np.abs(np.where(np.isfinite(x), x, 0.0))))  # f32 sums of values up to 1e6
    np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-4, atol=1e-4 * scale)


WRONG = st.one_of(st.text(max_size=3), st.none(), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
                  st.lists(st.text(max_size=2), min_size=1, max_size=3), st.just(object()), st.just(1j))


@SETTINGS
@given(st.sampled_from(["add", "mul", "relu", "exp", "matmul", "sum", "softmax", "get_rows", "concat_rows", "ssm_conv"]),
       WRONG, st.integers(0, 1))
def test_wrong_types_raise_type_errors(op, wrong, position):
    CASES_RUN["wrong argument types"] += 1
    good = rc.tensor(np.ones((3, 3), np.float32))
    unary = op in ("relu", "exp", "sum", "softmax")
    args = [wrong] if unary else ([wrong, good] if position == 0 else [good, wrong])
    with pytest.raises(DOCUMENTED):
        getattr(rc, op)(*args)


@SETTINGS
@given(st.sampled_from(["write", "read", "get_rows", "free", "to"]), st.integers(1, 4), st.integers(1, 6))
def test_freed_buffers_refuse_every_use(action, rows, capacity):
    CASES_RUN["freed device buffers"] += 1
    buffer = DeviceBuffer(rows, capacity)
    buffer.free()
    calls = {"write": lambda: buffer.write(np.ones((rows, 1), np.float32)), "read": buffer.read,
             "get_rows": lambda: rc.get_rows(buffer, [0]), "free": buffer.free, "to": lambda: buffer.to("cpu")}
    if action == "free":
        buffer.free()  # freeing twice is allowed and does nothing
        return
    with pytest.raises(DOCUMENTED, match="freed"):
        calls[action]()
