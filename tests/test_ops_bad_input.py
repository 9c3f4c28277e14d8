"""Bad input to every op: a clear TypeError or ValueError that names the op, never a crash or
a wrong number.

- Bad arguments, derived from the case table of tests/test_ops.py (the first case of each op):
  a wrong kind of argument, empty arrays, integer or mixed float dtypes.
- An explicit table of each op's bad shapes and values (out-of-range indices, sizes that do not
  fit, ...), each checked for the op's name and the words that say what was wrong; a test that
  fails until every op of the table has bad-input checks.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import rlkit.core as rc
from rlkit import _native

from test_ops import CASES, COVERED_OPS, NP_DTYPE, Case, _arrays, _is_index, _tensor  # tests/ is on sys.path


# ---- bad arguments, derived from the table (first case of each op) ----------------------------------

def _first_case_per_op():
    seen = {}
    for c in CASES:
        seen.setdefault(c.op, c)
    return list(seen.values())


def _bad_variants():
    """(case, position, replacement, exception, label) for every input of the first case of each op."""
    out = []
    for c in _first_case_per_op():
        arrays = _arrays(c, 0)
        floats = [k for k, a in enumerate(arrays) if not _is_index(a)]
        for k, a in enumerate(arrays):
            if _is_index(a):
                out += [
                    (c, k, "abc", TypeError, "str"),
                    (c, k, {"a": 1}, TypeError, "dict"),
                    (c, k, _tensor(a.astype(np.float64), "f32"), TypeError, "f32_index"),
                    (c, k, np.zeros((0,), np.int32), ValueError, "empty"),
                ]
                continue
            out += [
                (c, k, "abc", TypeError, "str"),
                (c, k, [[1.0, 2.0]], TypeError, "list"),
                (c, k, {"a": 1}, TypeError, "dict"),
                (c, k, None, TypeError, "None"),
                (c, k, np.zeros((0, 3)), ValueError, "empty"),
                (c, k, np.zeros((3, 0)), ValueError, "empty_cols"),
            ]
            if not c.int_ok and k not in c.index_args:
                out.append((c, k, rc.tensor(np.ones(a.shape, np.int32)), TypeError, "i32"))
            if len(floats) >= 2:
                out.append((c, k, "f64_among_f32", TypeError, "mixed"))
    return [pytest.param(*v[:4], id=f"{v[0].op}-arg{v[1]}-{v[4]}") for v in out]


@pytest.mark.parametrize("case, k, replacement, exc", _bad_variants())
def test_bad_argument(case: Case, k: int, replacement, exc):
    arrays = _arrays(case, 0)
    args = [_tensor(a, "f32") for a in arrays]
    if isinstance(replacement, str) and replacement == "f64_among_f32":
        args[k] = _tensor(arrays[k], "f64")
    else:
        args[k] = replacement
    with pytest.raises(exc, match=rf"^{case.op}:"):
        case.fn(*args)


# ---- bad shapes and values, by op -------------------------------------------------------------------

def _t(*shape, dtype="f32"):
    return rc.tensor(np.asfortranarray(np.ones(shape), dtype=NP_DTYPE[dtype]), dtype=dtype)


_BAD_IDS = itertools.count()


def _bad(op, call, exc, *needles):
    return pytest.param(op, call, exc, needles, id=f"{op}-{next(_BAD_IDS)}")


def _polyak_step_into_a_source():
    a, b, c = rc.zeros((2, 2)), rc.ones((2, 2)), rc.ones((2, 2))
    return rc.ops.apply("polyak_step", (a, b, b, c), floats=(0.5,))


def _cast_into_one_target_twice():
    target = _t(2, 2, dtype="f16")
    return rc.ops.apply("cast_into", (target, _t(2, 2), target, _t(2, 2)))


def _chain(inputs, steps):
    """elementwise_chain on `inputs` with (op name, a, b) steps, floats 0, shaped like input 0."""
    op_id = {name: k for k, name in enumerate(_native.op_names())}
    shape = inputs[0].shape
    ints = [*shape, *(1,) * (4 - len(shape)), len(shape)]
    for name, a, b in steps:
        ints += [op_id[name], a, b]
    return rc.ops.apply("elementwise_chain", tuple(inputs), ints=ints, floats=[0.0] * (2 * len(steps)))


def _sgd_step_listing_a_parameter_twice():
    w = rc.param(np.ones((2, 2)))
    return rc.ops.apply("sgd_step", (rc.zeros((8, 1)), rc.ones((1, 1)), w, rc.ones((2, 2)), rc.zeros((2, 2)),
                                     w, rc.ones((2, 2)), rc.zeros((2, 2))))


_BAD: list = []
for _op in ("add", "sub", "mul", "div", "minimum", "maximum", "ge", "gt"):
    _BAD.append(_bad(_op, lambda f=getattr(rc, _op): f(_t(3, 4), _t(2, 4)), ValueError, "[3, 4]", "[2, 4]"))
    _BAD.append(_bad(_op, lambda f=getattr(rc, _op): f(_t(3, 2, 2), _t(3, 2, 3)), ValueError, "[3, 2, 2]", "[3, 2, 3]"))
_BAD += [
    _bad("matmul", lambda: rc.matmul(_t(3, 2), _t(3, 4)), ValueError, "[3, 2]", "[3, 4]"),
    _bad("matmul", lambda: rc.matmul(_t(3, 2), _t(3, 4), transpose_a=True, transpose_b=True), ValueError, "[3, 2]", "[3, 4]"),
    _bad("linear", lambda: rc.linear(_t(3, 2), _t(3, 4), _t(3, 1)), ValueError, "W [3, 2]", "in = 2", "x [3, 4] has 3 rows"),
    _bad("linear", lambda: rc.linear(_t(3, 2), _t(2, 4), _t(2, 1)), ValueError, "b must be [out, 1] = [3, 1]", "[2, 1]"),
    _bad("linear", lambda: rc.linear(_t(3, 2, 2), _t(2, 4), _t(3, 1)), ValueError, "W must be 2-D"),
    _bad("linear", lambda: rc.linear(_t(3, 2), _t(2, 4), _t(3, 1), "gelu"), ValueError, "activation must be one of", "'gelu'"),
    _bad("matmul", lambda: rc.matmul(_t(3, 2, 2), _t(2, 4, 3)), ValueError, "[3, 2, 2]", "[2, 4, 3]"),
    _bad("scale", lambda: rc.scale(_t(2, 2), "2"), TypeError, "s"),
    _bad("scale", lambda: rc.scale(_t(2, 2), True), TypeError, "s"),
    _bad("pow", lambda: rc.pow(_t(2, 2), None), TypeError, "p"),
    _bad("clamp", lambda: rc.clamp(_t(2, 2), 1.0, -1.0), ValueError, "lo", "hi"),
    _bad("clamp", lambda: rc.clamp(_t(2, 2), "a"), TypeError, "lo"),
    _bad("cast", lambda: rc.cast(_t(2, 2), "f8"), ValueError, "f8"),
    _bad("sum", lambda: rc.sum(_t(3, 4), dim=2), ValueError, "dim 2", "(3, 4)"),
    _bad("sum", lambda: rc.sum(_t(2, 3, 2), dim=-4), ValueError, "dim -4", "(2, 3, 2)"),
    _bad("sum", lambda: rc.sum(_t(3, 4), dim=1.0), TypeError, "dim"),
    _bad("mean", lambda: rc.mean(_t(3, 4), dim=5), ValueError, "dim 5", "(3, 4)"),
    _bad("sum_to", lambda: rc.sum_to(_t(3, 4), (2, 1)), ValueError, "[3, 4]", "[2, 1]"),
    _bad("expand", lambda: rc.expand(_t(3, 2), (3, 5)), ValueError, "[3, 2]", "[3, 5]"),
    _bad("permute", lambda: rc.permute(_t(3, 4, 2), (0, 1)), ValueError, "permutation of 0..2", "(3, 4, 2)"),
    _bad("permute", lambda: rc.permute(_t(3, 4), (1, 1)), ValueError, "permutation of 0..1", "(1, 1)"),
    _bad("permute", lambda: rc.permute(_t(3, 4), (0, 2)), ValueError, "permutation"),
    _bad("permute", lambda: rc.permute(_t(3, 4), (0, 1.0)), TypeError, "dims must be a tuple of ints"),
    _bad("permute", lambda: rc.permute(_t(3, 4), 1), TypeError, "dims"),
    _bad("permute", lambda: rc.ops.apply("permute", (_t(3, 4),), ints=(1, 0, 3, 2)), ValueError, "permutation of 0..1",
         "got 3 at 2"),
    _bad("permute", lambda: rc.ops.apply("permute", (_t(3, 4),), ints=(1, 0)), ValueError, "expected 4 dims, got 2"),
    _bad("reshape", lambda: rc.reshape(_t(3, 4), (5, 2)), ValueError, "[3, 4]", "10"),
    _bad("reshape", lambda: rc.reshape(_t(3, 4), (5, -1)), ValueError, "(5, -1)", "12"),
    _bad("reshape", lambda: rc.reshape(_t(3, 4), (-1, -1)), ValueError, "-1"),
    _bad("reshape", lambda: rc.reshape(_t(3, 4), (0, 12)), ValueError, "(0, 12)"),
    _bad("reshape", lambda: rc.reshape(_t(3, 4), (1, 1, 1, 3, 4)), ValueError, "5"),
    _bad("reshape", lambda: rc.reshape(_t(3, 4), "12"), TypeError, "shape"),
    _bad("slice_rows", lambda: rc.slice_rows(_t(3, 4), 2, 2), ValueError, "[3, 4]"),
    _bad("slice_rows", lambda: rc.slice_rows(_t(3, 4), -1, 1), ValueError, "[3, 4]"),
    _bad("slice_rows", lambda: rc.slice_rows(_t(3, 4), 0, 0), ValueError, "[3, 4]"),
    _bad("slice_rows", lambda: rc.slice_rows(_t(3, 4), 0.5, 1), TypeError, "start"),
    _bad("pad_rows", lambda: rc.pad_rows(_t(3, 4), -1, 0), ValueError, "-1"),
    _bad("pad_rows", lambda: rc.pad_rows(_t(3, 4), 1, "2"), TypeError, "after"),
    _bad("concat_rows", lambda: rc.concat_rows(_t(2, 3), _t(2, 4)), ValueError, "[2, 3]", "[2, 4]"),
    _bad("concat_rows", lambda: rc.concat_rows(_t(2, 3, 2), _t(2, 3)), ValueError, "[2, 3, 2]", "[2, 3]"),
    _bad("gather", lambda: rc.gather(_t(3, 4), [0, 1, 2]), ValueError, "3 elements", "[3, 4]"),
    _bad("gather", lambda: rc.gather(_t(3, 2, 2), [0, 1]), ValueError, "[3, 2, 2]"),
    _bad("gather", lambda: rc.gather(_t(3, 4), [0, 1, 3, 0]), IndexError, "index 3", "valid: 0..2"),
    _bad("gather", lambda: rc.gather(_t(3, 4), [0, -1, 0, 0]), IndexError, "index -1", "valid: 0..2"),
    _bad("gather", lambda: rc.gather(_t(3, 4), np.array([0.0, 1.0, 2.0, 0.0])), TypeError, "index"),
    _bad("gather", lambda: rc.gather(_t(3, 2), [2**40, 0]), IndexError, "32 bits"),
    _bad("one_hot", lambda: rc.one_hot([0, 1], 0), ValueError, "classes"),
    _bad("one_hot", lambda: rc.one_hot([0, 3], 3), IndexError, "index 3", "valid: 0..2"),
    _bad("one_hot", lambda: rc.one_hot([-2], 3), IndexError, "index -2", "valid: 0..2"),
    _bad("one_hot", lambda: rc.one_hot([0, 1], 2.0), TypeError, "classes"),
    _bad("one_hot", lambda: rc.one_hot([0, 1], 2, dtype="i32"), ValueError, "dtype"),
    _bad("get_rows", lambda: rc.get_rows(_t(2, 3, 2), [0]), ValueError, "[2, 3, 2]"),
    _bad("get_rows", lambda: rc.get_rows(_t(3, 4), [1, 4]), IndexError, "index 4", "valid: 0..3"),
    _bad("get_rows", lambda: rc.get_rows(_t(3, 4), [-1]), IndexError, "index -1", "valid: 0..3"),
    _bad("get_rows", lambda: rc.get_rows(_t(3, 4), [0.5]), TypeError, "index"),
    _bad("scatter_cols", lambda: rc.scatter_cols(_t(3, 4), [0, 1, 2], 5), ValueError, "3 elements", "[3, 4]"),
    _bad("scatter_cols", lambda: rc.scatter_cols(_t(3, 4), [0, 1, 2, 5], 5), IndexError, "index 5", "valid: 0..4"),
    _bad("scatter_cols", lambda: rc.scatter_cols(_t(3, 1), [-1], 5), IndexError, "index -1", "valid: 0..4"),
    _bad("scatter_cols", lambda: rc.scatter_cols(_t(3, 2), [0, 1], 0), ValueError, "column"),
    _bad("scatter_cols", lambda: rc.scatter_cols(_t(3, 2), [0, 1], 2.5), TypeError, "columns"),
    _bad("sample_normal", lambda: rc.sample_normal(_t(3, 4), _t(2, 4)), ValueError, "(3, 4)", "(2, 4)"),
    _bad("mse_loss", lambda: rc.mse_loss(_t(3, 4), _t(4, 3)), ValueError, "(3, 4)", "(4, 3)"),
    _bad("mse_loss", lambda: rc.mse_loss(_t(4, 1), _t(1, 4)), ValueError, "(4, 1)", "(1, 4)"),
    _bad("huber_loss", lambda: rc.huber_loss(_t(3, 4), _t(3, 1)), ValueError, "(3, 4)", "(3, 1)"),
    _bad("huber_loss", lambda: rc.huber_loss(_t(3, 4), _t(3, 4), delta=0.0), ValueError, "delta"),
    _bad("huber_loss", lambda: rc.huber_loss(_t(3, 4), _t(3, 4), delta=-1.0), ValueError, "delta"),
    _bad("huber_loss", lambda: rc.huber_loss(_t(3, 4), _t(3, 4), reduction="sum"), ValueError,
         "reduction must be 'mean' or 'none'"),
    _bad("cross_entropy_loss", lambda: rc.cross_entropy_loss(_t(3, 4), _t(3, 5)), ValueError, "(3, 4)", "(3, 5)"),
    _bad("softmax_cross_entropy_loss", lambda: rc.softmax_cross_entropy_loss(_t(3, 4), _t(4, 4)), ValueError, "(3, 4)", "(4, 4)"),
    _bad("softmax_cross_entropy_loss", lambda: rc.softmax_cross_entropy_loss(_t(3, 4), [0, 1, 2]), ValueError, "3 class indices", "4 columns"),
    _bad("softmax_cross_entropy_loss", lambda: rc.softmax_cross_entropy_loss(_t(3, 2, dtype="i32"), [0, 1]), TypeError, "i32"),
    _bad("adam_step", lambda: rc.ops.apply("adam_step", (rc.zeros((8, 1)), rc.ones((1, 1)), rc.param(np.ones((2, 2))),
                                                          rc.ones((2, 2)), rc.zeros((2, 2)), rc.zeros((2, 2)),
                                                          rc.param(np.ones((3, 1))), rc.ones((2, 3)), rc.zeros((3, 1)),
                                                          rc.zeros((3, 1)))),
         ValueError, "parameter 1 is [3, 1]", "[2, 3]"),
    _bad("adam_step", lambda: rc.ops.apply("adam_step", (rc.zeros((8, 1)), rc.ones((1, 1)), rc.param(np.ones((2, 2))),
                                                          rc.ones((2, 2)), rc.zeros((2, 2)))),
         ValueError, "hyper, scale, then 4 tensors per parameter", "got 5 inputs"),
    _bad("adam_step", lambda: rc.ops.apply("adam_step", (rc.zeros((8, 1)), rc.ones((1, 1)), rc.param(np.ones((2, 2))),
                                                          rc.ones((2, 2), dtype="i32"), rc.zeros((2, 2)),
                                                          rc.zeros((2, 2)))),
         ValueError, "parameter 0 is [2, 2] f32", "[2, 2] i32"),
    _bad("sgd_step", lambda: rc.ops.apply("sgd_step", (rc.zeros((7, 1)), rc.ones((1, 1)), rc.param(np.ones((2, 2))),
                                                        rc.ones((2, 2)), rc.zeros((2, 2)))),
         ValueError, "hyper must be f32 with 8 values"),
    _bad("sgd_step", lambda: _sgd_step_listing_a_parameter_twice(), ValueError, "parameter 1 is listed twice"),
    _bad("put_cols", lambda: rc.put_cols(rc.zeros((2, 5)), rc.tensor(np.array([[1, 2]], np.int32)), rc.ones((3, 2))),
         ValueError, "put_cols", "[2, 2]"),
    _bad("sum_squares", lambda: rc.sum_squares([]), ValueError, "at least one tensor"),
    _bad("sum_squares", lambda: rc.sum_squares([_t(2, 2), _t(3, 1, dtype="f64")]), TypeError, "tensor 1 is f64", "f32"),
    _bad("polyak_step", lambda: rc.ops.apply("polyak_step", (rc.zeros((2, 2)), rc.ones((2, 2)), rc.zeros((3, 1))), floats=(0.5,)),
         ValueError, "(target, source) pairs", "3 inputs"),
    _bad("polyak_step", lambda: rc.ops.apply("polyak_step", (rc.zeros((2, 2)), rc.ones((2, 3))), floats=(0.5,)),
         ValueError, "parameter 0 is [2, 2]", "[2, 3]"),
    _bad("polyak_step", lambda: rc.ops.apply("polyak_step", (rc.zeros((2, 2)), rc.ones((2, 2))), floats=(1.5,)),
         ValueError, "tau must be one number in [0, 1]"),
    _bad("polyak_step", lambda: _polyak_step_into_a_source(), ValueError, "target 1 is also a source"),
    _bad("polyak_update", lambda: rc.polyak_update([rc.zeros((2, 2))], [rc.ones((2, 3))], 0.5), ValueError,
         "target 0 is [2, 2]", "source is [2, 3]"),
    _bad("polyak_update", lambda: rc.polyak_update([rc.zeros((2, 2))], [], 0.5), ValueError, "as many targets as sources"),
    _bad("polyak_update", lambda: rc.polyak_update([rc.zeros((2, 2))], [rc.ones((2, 2))], float("nan")), ValueError, "tau"),
    _bad("cast_into", lambda: rc.ops.apply("cast_into", (_t(2, 2), _t(2, 2), _t(2, 2))), ValueError,
         "(target, source) pairs", "3 inputs"),
    _bad("cast_into", lambda: rc.ops.apply("cast_into", (_t(2, 2, dtype="f16"), _t(2, 3))), ValueError,
         "pair 0: the target is [2, 2]", "the source [2, 3]"),
    _bad("cast_into", lambda: rc.ops.apply("cast_into", (_t(2, 2, dtype="i32"), _t(2, 2))), TypeError,
         "pair 0: expected float tensors, got i32 and f32"),
    _bad("cast_into", lambda: _cast_into_one_target_twice(), ValueError,
         "pair 1: its target is its source or the target of another pair"),
    _bad("matmul_relu_mask", lambda: rc.ops.apply("matmul_relu_mask", (_t(3, 2), _t(2, 5), _t(3, 4)), ints=[0, 0]),
         ValueError, "y is [3, 4]; expected the product's shape"),
    _bad("matmul_relu_mask", lambda: rc.ops.apply("matmul_relu_mask", (_t(3, 2), _t(2, 5), _t(3, 5, dtype="f64")),
                                                  ints=[0, 0]), TypeError, "a, b and y must be f32"),
    _bad("matmul_relu_mask", lambda: rc.ops.apply("matmul_relu_mask", (_t(3, 2), _t(3, 5), _t(3, 5)), ints=[0, 0]),
         ValueError, "inner dimensions differ"),
    _bad("elementwise_chain", lambda: _chain([_t(2, 3)], []), ValueError,
         "expected ints ne[0..3], ndim, then (op, a, b) per step; got 5 ints"),
    _bad("elementwise_chain", lambda: _chain([_t(2, 3)], [("matmul", 0, 0)]), ValueError,
         "step 0: op", "is not an elementwise op a chain can hold"),
    _bad("elementwise_chain", lambda: _chain([_t(2, 3)], [("neg", 0, -2), ("add", -1, 1)]), ValueError,
         "step 1: operand b is 1; expected an input index or -1"),
    _bad("elementwise_chain", lambda: _chain([_t(2, 3)], [("add", -1, 0)]), ValueError,
         "step 0: operand a is -1; expected an input index"),
    _bad("elementwise_chain", lambda: _chain([_t(2, 3), _t(3, 2)], [("add", 0, 1)]), ValueError,
         "input 1 is [3, 2]; inputs must have the output's shape or one element"),
    _bad("elementwise_chain", lambda: _chain([_t(2, 3, dtype="f64")], [("neg", 0, -2)]), TypeError, "input 0 must be f32, got f64"),
    _bad("conv2d", lambda: rc.conv2d(np.zeros((5, 5, 0, 1)), _t(3, 3, 1, 1)), ValueError, "x is empty"),
    _bad("conv2d", lambda: rc.conv2d(_t(4, 6, 1, 2), _t(5, 3, 1, 1)), ValueError, "x [4, 6, 1, 2], w [5, 3, 1, 1]",
         "spans 5 along the width", "padded input is only 4"),
    _bad("conv2d", lambda: rc.conv2d(_t(6, 4, 1, 2), _t(3, 4, 1, 1), padding=(0, 1), dilation=(2, 1)), ValueError,
         "spans 7 along the height", "only 4"),
    _bad("conv2d", lambda: rc.conv2d(_t(4, 4, 1, 1), _t(7, 3, 1, 1), padding=1), ValueError, "spans 7 along the width", "only 6"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 1, 1), _t(3, 3, 1, 1), stride=(1, 0)), ValueError, "stride (w 0, h 1) must be at least 1"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 1, 1), _t(3, 3, 1, 1), stride=-2), ValueError, "stride (w -2, h -2)"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 1, 1), _t(3, 3, 1, 1), dilation=(0, 1)), ValueError, "dilation (w 1, h 0) must be at least 1"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 1, 1), _t(3, 3, 1, 1), padding=(-1, 0)), ValueError, "padding (w 0, h -1) must be at least 0"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 1, 1), _t(3, 3, 1, 1), padding=2**62), ValueError, "conv2d: ", "[5, 5, 1, 1]"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 1, 1), _t(3, 3, 1, 1), padding=2**40), ValueError,  # W' H' past 2^48
         "is more than 2^48", "[3, 3, 1, 1]"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 1, 1), _t(3, 3, 1, 1), stride=(1, 1, 1)), ValueError, "pair (height, width)"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 1, 1), _t(3, 3, 1, 1), stride=1.5), TypeError, "stride must be an int"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 3, 2), _t(3, 3, 2, 4)), ValueError, "x [W, H, C, N] has C = 3",
         "expects C_in = 2"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 2, 2), _t(3, 3, 2, 4), _t(3)), ValueError, "C_out = 4 biases", "got [3, 1]"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 2, 2), _t(3, 3, 2, 4), _t(2, 2)), ValueError, "C_out = 4 biases", "got [2, 2]"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 1, 1, dtype="i32"), _t(3, 3, 1, 1)), TypeError, "x must be a float tensor", "i32"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 1, 1), _t(3, 3, 1, 1, dtype="i32")), TypeError, "w must be a float tensor", "i32"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 1, 1), _t(3, 3, 1, 1, dtype="f64")), TypeError, "x is f32 but w is f64"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 1, 1), _t(3, 3, 1, 1), _t(1, dtype="f64")), TypeError, "b is f64 but x and w are f32"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 1, 1), _t(3, 3, 1, 1), _t(1, dtype="i32")), TypeError, "b is i32"),
    _bad("conv2d", lambda: rc.conv2d(_t(5, 5, 1, 1), _t(3, 3, 1, 1), activation="gelu"), ValueError,
         "activation must be one of", "'gelu'"),
    _bad("conv2d", lambda: rc.ops.apply("conv2d", (_t(5, 5, 1, 1), _t(3, 3, 1, 1)), ints=(1, 1, 0, 0, 1, 1, 7)), ValueError,
         "the activation is 7", "expected 0 none, 1 relu, 2 tanh or 3 sigmoid"),
    _bad("conv2d", lambda: rc.ops.apply("conv2d", (_t(5, 5, 1, 1), _t(3, 3, 1, 2), _t(3, 1)), ints=(1, 1, 0, 0, 1, 1)),
         ValueError, "b must hold C_out = 2 biases", "[3, 1]"),
    _bad("conv2d", lambda: rc.ops.apply("conv2d", (_t(5, 5, 1, 1), _t(3, 3, 1, 1), _t(1, 1), _t(1, 1)), ints=(1, 1, 0, 0, 1, 1)),
         ValueError, "expected 2 inputs (x, w) or 3 (x, w, b), got 4"),
    _bad("conv2d", lambda: rc.ops.apply("conv2d", (_t(5, 5, 1, 1), _t(3, 3, 1, 1)), ints=(1, 1, 0, 0, 1, 1, 0, 0)), ValueError,
         "expected ints stride, padding, dilation", "got 8 ints"),
    _bad("conv2d_input_back", lambda: rc.ops.apply("conv2d_input_back", (_t(3, 3, 2, 1), _t(3, 3, 1, 2)),
                                                   ints=(1, 1, 0, 0, 1, 1, 6, 5)), ValueError,
         "g [3, 3, 2, 1] is not the convolution's output shape [4, 3, 2, 1]"),
    _bad("conv2d_weight_back", lambda: rc.ops.apply("conv2d_weight_back", (_t(3, 3, 2, 1), _t(5, 5, 1, 1)),
                                                    ints=(1, 1, 0, 0, 1, 1, 3)), ValueError, "expected ints", "got 7 ints"),
    _bad("max_pool2d", lambda: rc.max_pool2d(np.zeros((0, 4, 1, 1)), 2), ValueError, "x is empty"),
    _bad("max_pool2d", lambda: rc.max_pool2d(_t(4, 4, 1, 1), 3, padding=2), ValueError, "padding (w 2, h 2)",
         "at most half the kernel (w 3, h 3)"),
    _bad("max_pool2d", lambda: rc.max_pool2d(_t(4, 4, 1, 1), (1, 0)), ValueError, "kernel (w 0, h 1) must be at least 1"),
    _bad("max_pool2d", lambda: rc.max_pool2d(_t(4, 4, 1, 1), 2, stride=0), ValueError, "stride (w 0, h 0) must be at least 1"),
    _bad("max_pool2d", lambda: rc.max_pool2d(_t(4, 4, 1, 1), 2, padding=-1), ValueError, "padding (w -1, h -1) must be at least 0"),
    _bad("max_pool2d", lambda: rc.max_pool2d(_t(4, 6, 1, 1), (2, 5)), ValueError, "x [4, 6, 1, 1]", "spans 5 along the width",
         "only 4"),
    _bad("max_pool2d", lambda: rc.max_pool2d(_t(4, 4, 1, 1, dtype="i32"), 2), TypeError, "x must be a float tensor", "i32"),
    _bad("max_pool2d", lambda: rc.max_pool2d(_t(4, 4, 1, 1), (2, 2, 2)), ValueError, "pair (height, width)"),
    _bad("max_pool2d_back", lambda: rc.ops.apply("max_pool2d_back", (_t(3, 3, 1, 1), _t(4, 4, 1, 1)), ints=(2, 2, 2, 2, 0, 0)),
         ValueError, "g [3, 3, 1, 1] is not the pooling's output shape for x [4, 4, 1, 1]"),
    _bad("max_pool2d_back", lambda: rc.ops.apply("max_pool2d_back", (_t(2, 2, 1, 1, dtype="f64"), _t(4, 4, 1, 1)),
                                                 ints=(2, 2, 2, 2, 0, 0)), TypeError, "g is f64 but x is f32"),
    _bad("searchsorted", lambda: rc.searchsorted(_t(3, 2), _t(1, 4)), ValueError, "one column [n, 1]", "[3, 2]"),
    _bad("arange", lambda: rc.arange(0), ValueError, "n must be at least 1, got 0"),
    _bad("arange", lambda: rc.arange(2.5), TypeError, "n must be an int"),
    _bad("full", lambda: rc.full((0, 3), 1.0), ValueError, "(0, 3)"),
    _bad("full", lambda: rc.full((2, 3), [1.0]), TypeError, "value"),
    _bad("full", lambda: rc.full((2, 2), float("nan"), dtype="i32"), ValueError, "value nan", "to i32"),
    _bad("full", lambda: rc.full((2, 2), 3e9, dtype="i32"), ValueError, "3000000000.0", "-2147483648 to 2147483647"),
    _bad("full", lambda: rc.full((2, 2), 2.5, dtype="i32"), ValueError, "value 2.5", "whole numbers"),
    _bad("full", lambda: rc.full((2, 2), 256, dtype="u8"), ValueError, "value 256", "0 to 255"),
    _bad("full", lambda: rc.full((2, 2), -1, dtype="u8"), ValueError, "value -1", "0 to 255"),
    _bad("rand", lambda: rc.rand((0, 3)), ValueError, "(0, 3)"),
    _bad("rand", lambda: rc.rand((1, 2, 3, 4, 5)), ValueError, "(1, 2, 3, 4, 5)"),
    _bad("rand", lambda: rc.rand((3, "a")), TypeError, "shape"),
    _bad("rand", lambda: rc.rand((3, 2), dtype="i32"), ValueError, "dtype"),
    _bad("randn", lambda: rc.randn((3, -1)), ValueError, "(3, -1)"),
    _bad("randn", lambda: rc.randn("ab"), TypeError, "shape"),
    _bad("randn", lambda: rc.randn(4, dtype="f8"), ValueError, "dtype"),
    _bad("randint", lambda: rc.ops.randint(rc.full((1, 2), 3.0), (1, 4)), ValueError, "one-element float tensor"),
    _bad("randint", lambda: rc.ops.randint(rc.full((1, 1), 3, dtype="i32"), (1, 4)), ValueError, "i32"),
    _bad("randint", lambda: rc.ops.randint("3", (1, 4)), TypeError, "finite number"),
    _bad("randint", lambda: rc.ops.randint(float("inf"), (1, 4)), ValueError, "finite number > 0", "inf"),
    _bad("randint", lambda: rc.ops.randint(float("nan"), (1, 4)), ValueError, "finite number > 0", "nan"),
    _bad("randint", lambda: rc.ops.randint(0.0, (1, 4)), ValueError, "finite number > 0", "got 0.0"),
    _bad("randint", lambda: rc.ops.randint(-5.0, (1, 4)), ValueError, "finite number > 0", "got -5.0"),
    _bad("randint", lambda: rc.ops.randint(3, (0, 4)), ValueError, "(0, 4)"),
    _bad("sample_categorical", lambda: rc.sample_categorical(_t(3, 4, dtype="i32")), TypeError, "i32"),
    _bad("sample_categorical", lambda: rc.sample_categorical("logits"), TypeError, "str"),
    _bad("sample_categorical", lambda: rc.sample_categorical(np.zeros((0, 3))), ValueError, "(0, 3)"),
    _bad("sample_categorical", lambda: rc.sample_categorical([[0.0, 1.0]]), TypeError, "list"),
]


@pytest.mark.parametrize("op, call, exc, needles", _BAD)
def test_bad_shape_or_value(op, call, exc, needles):
    with pytest.raises(exc, match=rf"^{op}:") as info:
        call()
    for needle in needles:
        assert needle in str(info.value), f"{needle!r} not in {str(info.value)!r}"


def test_every_op_has_bad_input_checks():
    ops_with_bad = {p.values[0] for p in _BAD} | {c.op for c in _first_case_per_op()}
    assert COVERED_OPS <= ops_with_bad, COVERED_OPS - ops_with_bad
