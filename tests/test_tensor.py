"""Tensors: shapes, dtypes, zero-copy construction, numpy round trips and operators.

References are numpy: every value is checked against the same computation done by numpy on
the same arrays.
"""

import gc

import numpy as np
import pytest

import rlkit.core as rc


@pytest.fixture(autouse=True)
def _restore_default_dtype():
    previous = rc.dtype()
    yield
    rc.dtype(previous)


def fortran(shape, seed=0, dtype=np.float32, low=None):
    rng = np.random.default_rng(seed)
    arr = rng.standard_normal(shape)
    if low is not None:
        arr = np.abs(arr) + low
    return np.asfortranarray(arr.astype(dtype))


# ---- shapes and dtypes -----------------------------------------------------------------

@pytest.mark.parametrize(
    "np_dtype, expected",
    [(np.float32, "f32"), (np.float16, "f16"), (np.int32, "i32"), (np.float64, "f64")],
)
def test_explicit_dtype_round_trip(np_dtype, expected):
    arr = (np.arange(12).reshape(3, 4) - 5).astype(np_dtype)
    t = rc.tensor(arr, dtype=expected)
    assert t.dtype == expected
    assert t.shape == (3, 4)
    out = t.numpy()
    assert out.dtype == np_dtype
    assert out.flags.f_contiguous
    np.testing.assert_array_equal(out, arr)


def test_default_dtypes_of_numpy_data():
    assert rc.tensor(np.ones((2, 2), np.float64)).dtype == "f32"  # floats take the default dtype
    assert rc.tensor(np.ones((2, 2), np.float16)).dtype == "f32"
    assert rc.tensor(np.arange(4, dtype=np.int64)).dtype == "i32"  # integers become i32
    assert rc.tensor(np.arange(4, dtype=np.uint8)).dtype == "i32"
    assert rc.tensor(2.5).dtype == "f32"
    assert rc.tensor([1, 2, 3]).dtype == "i32"


def test_one_dimensional_becomes_one_column():
    arr = np.array([1.0, 2.0, 3.0], np.float32)
    t = rc.tensor(arr)
    assert t.shape == (3, 1)
    assert t.ndim == 2
    np.testing.assert_array_equal(t.numpy(), arr.reshape(3, 1))


@pytest.mark.parametrize("value", [np.float32(2.5), np.array(2.5), 2.5, 7])
def test_zero_dimensional_becomes_one_by_one(value):
    t = rc.tensor(value)
    assert t.shape == (1, 1)
    assert t.numel == 1
    assert t.item() == float(value)


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 3, 4, 5), (1, 1, 1, 2), (3, 1, 2)])
def test_three_and_four_dimensions_round_trip(shape):
    arr = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)  # C-ordered: copied
    t = rc.tensor(arr)
    assert t.shape == shape
    assert t.ndim == len(shape)
    assert t.numel == arr.size
    out = t.numpy()
    assert out.shape == shape and out.flags.f_contiguous
    np.testing.assert_array_equal(out, arr)


def test_more_than_four_dimensions_is_a_value_error():
    with pytest.raises(ValueError, match="at most 4 dimensions"):
        rc.tensor(np.ones((2, 1, 1, 1, 2), np.float32))
    with pytest.raises(ValueError, match="at most 4 dimensions"):
        rc.param(np.ones((1, 1, 1, 1, 1)))


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0), (2, 3, 0)])
def test_empty_dimensions_are_a_value_error(shape):
    with pytest.raises(ValueError, match="at least one element"):
        rc.tensor(np.ones(shape, np.float32))


def test_empty_list_is_a_value_error():
    with pytest.raises(ValueError):
        rc.tensor([])


@pytest.mark.parametrize(
    "data",
    ["abc", np.array(["a", "b"]), ["a", "b"], np.array([object()]), object(), None, {"a": 1},
     np.ones(3, dtype=complex), 1j],
)
def test_non_numeric_data_is_a_type_error(data):
    with pytest.raises(TypeError):
        rc.tensor(data)


def test_unknown_dtype_name_is_a_value_error():
    with pytest.raises(ValueError, match="unknown dtype"):
        rc.tensor(np.ones(3), dtype="float32")


def test_param_must_be_float():
    with pytest.raises(TypeError, match="float"):
        rc.param(np.arange(3), dtype="i32")
    # integer data without a dtype becomes a float parameter of the default dtype
    p = rc.param(np.arange(3))
    assert p.dtype == "f32" and p.requires_grad
    np.testing.assert_array_equal(p.numpy().ravel(), [0.0, 1.0, 2.0])


def test_integers_that_do_not_fit_in_i32_are_rejected():
    with pytest.raises(ValueError, match="i32"):
        rc.tensor(np.array([2**40]))
    with pytest.raises(ValueError, match="i32"):
        rc.tensor(np.array([2**32 - 1], dtype=np.uint32))
    edge = np.array([2**31 - 1, -(2**31)])
    np.testing.assert_array_equal(rc.tensor(edge).numpy().ravel(), edge)


@pytest.mark.parametrize("data, dtype, message", [
    ([3e9, np.nan], "i32", r"^tensor: value 3000000000.0 at position 0 does not convert to i32 "
                           r"\(whole numbers from -2147483648 to 2147483647\)$"),
    ([1.0, np.nan], "i32", "value nan at position 1 does not convert to i32"),
    ([np.inf], "i32", "value inf does not convert to i32"),
    ([-np.inf, 0.0], "i32", "value -inf at position 0"),
    ([1.0, 2.5], "i32", "value 2.5 at position 1"),
    (np.array([300, -1]), "u8", r"^tensor: value 300 at position 0 does not convert to u8 "
                                r"\(whole numbers from 0 to 255\)$"),
    (np.array([0, -1]), "u8", "value -1 at position 1"),
    ([255.5], "u8", "value 255.5 does not convert to u8"),
])
def test_values_that_an_integer_dtype_cannot_hold_are_rejected(data, dtype, message):
    with pytest.raises(ValueError, match=message):
        rc.tensor(data, dtype=dtype)


def test_whole_numbers_in_range_convert_to_integer_dtypes_unchanged():
    np.testing.assert_array_equal(rc.tensor([2.0**31 - 1, -2.0**31, -0.0, 7.0], dtype="i32").numpy().ravel(),
                                  [2**31 - 1, -(2**31), 0, 7])
    np.testing.assert_array_equal(rc.tensor(np.array([0, 255], np.int64), dtype="u8").numpy().ravel(), [0, 255])
    np.testing.assert_array_equal(rc.tensor(np.array([0.0, 255.0], np.float32), dtype="u8").numpy().ravel(), [0, 255])
    position = np.array([[1.0, 2.0], [3.0, np.nan]])  # Fortran order, as the tensor holds it: nan is element 3
    with pytest.raises(ValueError, match="value nan at position 3"):
        rc.tensor(position, dtype="i32")


def test_bool_data_becomes_float():
    t = rc.tensor(np.array([True, False, True]))
    assert t.dtype == "f32"
    np.testing.assert_array_equal(t.numpy().ravel(), [1.0, 0.0, 1.0])


# ---- zero copy --------------------------------------------------------------------------

def test_fortran_float32_array_is_shared_without_a_copy():
    arr = fortran((5, 7))
    t = rc.tensor(arr)
    assert t._impl.data_ptr == arr.ctypes.data
    arr[2, 3] = 123.0  # writes after construction are visible through the tensor
    assert t.numpy()[2, 3] == 123.0
    np.testing.assert_array_equal(t.numpy(), arr)


@pytest.mark.parametrize("dtype, np_dtype", [("f64", np.float64), ("i32", np.int32), ("f16", np.float16)])
def test_fortran_arrays_of_every_dtype_are_shared(dtype, np_dtype):
    arr = np.asfortranarray((np.arange(20).reshape(4, 5) - 7).astype(np_dtype))
    t = rc.tensor(arr, dtype=dtype)
    assert t.dtype == dtype
    assert t._impl.data_ptr == arr.ctypes.data
    arr[3, 4] = 9
    assert t.numpy()[3, 4] == 9


def test_transposed_c_order_batch_features_array_is_shared():
    batch_features = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)  # C order
    t = rc.tensor(batch_features.T)
    assert t.shape == (4, 6)
    assert t._impl.data_ptr == batch_features.ctypes.data
    batch_features[5, 1] = -9.0
    assert t.numpy()[1, 5] == -9.0
    np.testing.assert_array_equal(t.numpy(), batch_features.T)


def test_c_ordered_array_is_copied_with_the_right_values():
    arr = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)  # C order
    t = rc.tensor(arr)
    assert t._impl.data_ptr != arr.ctypes.data
    np.testing.assert_array_equal(t.numpy(), arr)
    arr[0, 0] = 42.0
    assert t.numpy()[0, 0] != 42.0


def test_array_of_another_dtype_is_converted_and_copied():
    arr = np.asfortranarray(np.random.default_rng(3).standard_normal((3, 5)))  # f64 -> f32 default
    t = rc.tensor(arr)
    assert t.dtype == "f32"
    assert t._impl.data_ptr != arr.ctypes.data
    np.testing.assert_array_equal(t.numpy(), arr.astype(np.float32))


def test_strided_views_are_copied_correctly():
    base = fortran((8, 9))
    view = base[1::2, ::-3]
    t = rc.tensor(view)
    np.testing.assert_array_equal(t.numpy(), view)


def test_shared_array_stays_alive_with_the_tensor():
    arr = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    expected = arr.copy()
    t = rc.tensor(arr)
    del arr
    gc.collect()
    junk = [np.full((3, 4), -1.0, np.float32) for _ in range(50)]  # reuse freed memory if any
    np.testing.assert_array_equal(t.numpy(), expected)
    del junk


def test_param_always_copies():
    arr = fortran((3, 4))
    p = rc.param(arr, name="w")
    assert p.requires_grad and p.name == "w" and p.is_leaf
    assert p._impl.data_ptr != arr.ctypes.data
    original = arr.copy()
    arr[:] = 0.0
    np.testing.assert_array_equal(p.numpy(), original)


def test_param_name_must_be_a_string():
    with pytest.raises(TypeError):
        rc.param(np.ones(3), name=3)


# ---- numpy round trip ---------------------------------------------------------------

@pytest.mark.parametrize("dtype, np_dtype", [("f32", np.float32), ("f64", np.float64), ("i32", np.int32)])
def test_numpy_round_trip_is_exact_and_fortran_ordered(dtype, np_dtype):
    rng = np.random.default_rng(4)
    arr = (rng.standard_normal((7, 3)) * 1e3).astype(np_dtype)
    out = rc.tensor(arr, dtype=dtype).numpy()
    assert out.dtype == np_dtype
    assert out.flags.f_contiguous
    assert out.shape == (7, 3)
    np.testing.assert_array_equal(out, arr)
    # the result is a copy: changing it does not change the tensor
    t = rc.tensor(arr, dtype=dtype)
    first = t.numpy()
    first[0, 0] += 1
    assert t.numpy()[0, 0] == arr[0, 0]


def test_f16_round_trip_matches_numpy_float16():
    rng = np.random.default_rng(5)
    arr = np.concatenate([
        rng.standard_normal(200) * 100,
        rng.standard_normal(50) * 1e-5,  # subnormals of f16
        [65504.0, -65504.0, 1e-8, 0.0, -0.0, 2.0**-24, 3 * 2.0**-25, 1.0 + 2.0**-11],
    ]).astype(np.float32)
    t = rc.tensor(arr, dtype="f16")
    assert t.dtype == "f16"
    out = t.numpy()
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out.ravel().view(np.uint16), arr.astype(np.float16).view(np.uint16))


def test_f16_storage_computes_and_rounds_like_numpy():
    # On the CPU an f16 op computes in f32 and rounds once: a + b in f16 equals
    # float16(float32(a) + float32(b)).
    rng = np.random.default_rng(6)
    a = rng.standard_normal((16, 9)).astype(np.float16)
    b = rng.standard_normal((16, 9)).astype(np.float16)
    out = (rc.tensor(a, dtype="f16") + rc.tensor(b, dtype="f16")).numpy()
    assert out.dtype == np.float16
    expected = (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(out, expected)


def test_all_f16_bit_patterns_widen_exactly():
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    widened = rc.cast(rc.tensor(halves, dtype="f16"), "f32").numpy().ravel()
    expected = halves.astype(np.float32)
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(widened), nan)
    np.testing.assert_array_equal(widened[~nan], expected[~nan])


def test_f32_to_f16_cast_rounds_like_numpy():
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, size=100_000, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)
    values = values[np.isfinite(values)]
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16)
    got = rc.cast(rc.tensor(values), "f16").numpy().ravel()
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


# ---- operators ------------------------------------------------------------------------

A = fortran((3, 4), seed=10)
B = fortran((3, 4), seed=11, low=0.5)  # positive: safe as a divisor and a pow base
COL = np.arange(1, 4, dtype=np.float32)  # [3] -> [3, 1]
ROW = np.arange(1, 5, dtype=np.float32).reshape(1, 4)


def _check(result, expected, rtol=1e-6, atol=1e-6):
    assert isinstance(result, rc.Tensor), f"expected a Tensor, got {type(result).__name__}"
    out = result.numpy()
    assert out.shape == np.shape(expected)
    np.testing.assert_allclose(out, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "name, fn, ref",
    [
        ("t+t", lambda a, b: a + b, lambda a, b: a + b),
        ("t-t", lambda a, b: a - b, lambda a, b: a - b),
        ("t*t", lambda a, b: a * b, lambda a, b: a * b),
        ("t/t", lambda a, b: a / b, lambda a, b: a / b),
    ],
)
def test_binary_operators_between_tensors(name, fn, ref):
    _check(fn(rc.tensor(A), rc.tensor(B)), ref(A, B))


@pytest.mark.parametrize("op", ["+", "-", "*", "/"])
@pytest.mark.parametrize("other_kind", ["array", "array_f64", "float", "int", "np_scalar", "column", "row"])
def test_binary_operators_with_arrays_and_scalars_on_both_sides(op, other_kind):
    other = {
        "array": B,
        "array_f64": B.astype(np.float64),
        "float": 1.5,
        "int": 3,
        "np_scalar": np.float32(2.5),
        "column": COL,
        "row": ROW,
    }[other_kind]
    ref_other = COL.reshape(3, 1) if other_kind == "column" else np.asarray(other, dtype=np.float32)
    fn = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y, "/": lambda x, y: x / y}[op]
    t = rc.tensor(A)
    _check(fn(t, other), fn(A, ref_other))
    if op == "/":  # other / A: A has values near zero, so divide by B's tensor instead
        _check(fn(other, rc.tensor(B)), fn(ref_other, B), rtol=1e-5)
    else:
        _check(fn(other, t), fn(ref_other, A))


def test_matmul_operator_with_tensors_and_arrays():
    a = fortran((3, 5), seed=12)
    b = fortran((5, 4), seed=13)
    expected = a.astype(np.float64) @ b
    _check(rc.tensor(a) @ rc.tensor(b), expected, rtol=1e-5, atol=1e-5)
    _check(rc.tensor(a) @ b, expected, rtol=1e-5, atol=1e-5)
    _check(a @ rc.tensor(b), expected, rtol=1e-5, atol=1e-5)


def test_matmul_operator_shape_mismatch_is_a_value_error():
    with pytest.raises(ValueError, match="matmul"):
        rc.tensor(A) @ rc.tensor(A)


def test_unary_negation():
    _check(-rc.tensor(A), -A)
    _check(-(-rc.tensor(A)), A)


@pytest.mark.parametrize("p", [2, 3.0, 0.5, -1.0, 0])
def test_power_with_a_scalar_exponent(p):
    _check(rc.tensor(B) ** p, B.astype(np.float64) ** p, rtol=1e-5)
    _check(rc.tensor(B) ** np.float64(p), B.astype(np.float64) ** p, rtol=1e-5)


@pytest.mark.parametrize("base", [2, 0.5, np.float64(3.0), np.e])
def test_power_with_a_scalar_base(base):
    _check(base ** rc.tensor(A), float(base) ** A.astype(np.float64), rtol=1e-5)


def test_power_with_an_array_base():
    base = B.astype(np.float64) + 1.0
    _check(base ** rc.tensor(A), base ** A.astype(np.float64), rtol=1e-5)


def test_power_with_a_non_positive_base_is_an_error():
    with pytest.raises(ValueError, match="positive"):
        (-2.0) ** rc.tensor(A)


def test_operators_with_unsupported_operands_are_type_errors():
    t = rc.tensor(A)
    with pytest.raises(TypeError):
        t + "x"
    with pytest.raises(TypeError):
        t * None
    with pytest.raises(TypeError):
        t ** rc.tensor(B)  # the exponent of pow is a number


def test_operator_shape_mismatch_is_a_value_error():
    with pytest.raises(ValueError, match="broadcast"):
        rc.tensor(A) + rc.tensor(np.ones((4, 3), np.float32))


def test_operators_keep_the_dtype_of_the_tensor():
    t = rc.tensor(A, dtype="f64")
    assert (t + 1).dtype == "f64"
    assert (1.5 * t).dtype == "f64"
    assert (t - B).dtype == "f64"  # an f32 array becomes a constant of the tensor's dtype
    np.testing.assert_allclose((t - B).numpy(), A.astype(np.float64) - B.astype(np.float64))
    h = rc.tensor(A, dtype="f16")
    assert (h * 2).dtype == "f16"


def test_transpose_property():
    _check(rc.tensor(A).T, A.T)


# ---- item and grad ---------------------------------------------------------------------

def test_item():
    assert rc.tensor(np.array([[3.25]], np.float32)).item() == 3.25
    assert rc.tensor(np.array([7], np.int32)).item() == 7
    assert isinstance(rc.tensor(np.array([7], np.int32)).item(), int)
    assert rc.sum(rc.tensor(A)).item() == pytest.approx(float(A.astype(np.float64).sum()), rel=1e-5)
    with pytest.raises(ValueError, match="exactly 1"):
        rc.tensor(A).item()


def test_grad_is_none_before_backward():
    p = rc.param(A)
    assert p.grad is None
    assert rc.tensor(A).grad is None


def test_grad_setter_copies_and_checks_the_shape():
    p = rc.param(A)
    g = np.asfortranarray(np.ones((3, 4), np.float32))
    p.grad = g
    g[0, 0] = 5.0  # the caller's array is not aliased
    np.testing.assert_array_equal(p.grad, np.ones((3, 4)))
    with pytest.raises(ValueError, match="shape"):
        p.grad = np.ones((4, 3))
    p.grad = None
    assert p.grad is None


def test_zeros_and_ones():
    z = rc.zeros((2, 3))
    o = rc.ones((2, 3, 2), dtype="f64")
    assert z.dtype == "f32" and z.shape == (2, 3)
    assert o.dtype == "f64" and o.shape == (2, 3, 2)
    np.testing.assert_array_equal(z.numpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(o.numpy(), np.ones((2, 3, 2)))


def test_device_argument():
    assert rc.tensor(A, device="cpu").device == "cpu"
    with pytest.raises(ValueError, match="unknown device"):
        rc.param(A, device="tpu")
    assert rc.device() == "cpu"  # making a tensor never changes the default device
