"""The op test suite: one table of cases, a few parametrised harnesses.

Every case names the public op it covers, an rlkit function, an independent numpy reference and
two or more input sets (generators of numpy arrays; integer arrays become i32 index tensors).
The harnesses check, for every case:

- the forward pass against the numpy reference, in f32 and f64;
- the gradient against central finite differences in float64 (``rc.gradcheck``), for every
  input set, with the output weighted by a fixed random tensor so that the upstream gradient
  is not all ones (a plain sum would hide layout mistakes in a backward rule and make the
  gradient of softmax identically zero);
Explicit tests add f16 storage, the documented tie and kink conventions, and the random ops (distribution and
reproducibility checks). The input generators and numpy references live in
tests/op_references.py; tests/test_op_table.py imports COVERED_OPS and CASES from here, tests/test_ops_bad_input.py
the table's cases for its bad arguments.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import pytest

import rlkit.core as rc
from conftest import DEVICES

from op_references import (  # tests/ is on sys.path when pytest imports a test module
    AWAY, CONST, DECAY, DISTINCT, GRID, IDX, N, ONEHOT, POS, RECURRENCE, RECURRENCE_SHAPES, RIDX, SOFT, SORTED, U,
    PERMUTED, WKV7, _align, binary, np_activation, np_conv2d, np_huber, np_huber_terms, np_linear, np_log_softmax, np_matmul, np_max_pool2d, np_randn_like,
    np_recurrence, np_reduce, np_reshape, np_rwkv_wkv7, np_scatter_cols, np_searchsorted, np_sigmoid,
    np_softmax, np_ssm_conv, np_ssm_scan, packed, to_bf16, to_f16,
)

NP_DTYPE = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "i32": np.int32}


# ---- the case table -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    id: str
    op: str  # the public op (or loss) this case covers
    fn: Callable  # rlkit: tensors -> tensor
    ref: Callable  # numpy: float64 (or int32) arrays -> array shaped like the result
    inputs: tuple  # input sets, each a tuple of generators
    grad: bool = True  # gradcheck every input set
    int_ok: bool = False  # the op is defined for i32 tensors too (layout ops, cast)
    index_args: tuple = ()  # positions where an i32 tensor is legal with another meaning (class indices)
    gc: dict = field(default_factory=dict)  # extra gradcheck arguments
    atol32: float = 1e-6  # absolute f32 tolerance (long f32 dot products need more)


BROADCAST_SHAPES = [
    ((3, 4), (3, 4)), ((3, 4), (3, 1)), ((3, 4), (1, 4)), ((3, 4), (1, 1)),
    ((3, 1), (3, 4)), ((1, 4), (3, 4)), ((1, 1), (3, 4)), ((3, 1), (1, 4)),
    ((2, 3, 2), (2, 3)), ((2, 1, 2), (1, 3, 1)),
]


def broadcast_sets(gen_a, gen_b):
    return tuple((gen_a(*sa), gen_b(*sb)) for sa, sb in BROADCAST_SHAPES)


UNARY_SHAPES = [(3, 4), (2, 5), (2, 3, 2)]


def unary_sets(gen):
    return tuple((gen(*s),) for s in UNARY_SHAPES)


def _unary(op, ref, gen, grad=True, **kw):
    return Case(op, op, getattr(rc, op), ref, unary_sets(gen), grad=grad, **kw)


def _grid_b(*shape):
    return GRID(*shape, offset=0.25)


CASES: list[Case] = [
    # elementwise binary, every broadcast pattern
    Case("add", "add", rc.add, binary(np.add), broadcast_sets(N, N)),
    Case("sub", "sub", rc.sub, binary(np.subtract), broadcast_sets(N, N)),
    Case("mul", "mul", rc.mul, binary(np.multiply), broadcast_sets(N, N)),
    Case("div", "div", rc.div, binary(np.divide), broadcast_sets(N, POS)),
    Case("div_neg_divisor", "div", rc.div, binary(np.divide), ((N(3, 4), CONST([[-0.5], [-2.0], [1.5]])), (N(2, 2), CONST([[-0.7]])))),
    Case("minimum", "minimum", rc.minimum, binary(np.minimum), broadcast_sets(GRID, _grid_b)),
    Case("maximum", "maximum", rc.maximum, binary(np.maximum), broadcast_sets(GRID, _grid_b)),
    Case("ge", "ge", rc.ge, binary(lambda a, b: (a >= b).astype(a.dtype)),
         broadcast_sets(GRID, _grid_b) + ((CONST([[1.0, 2.0, 3.0]]), CONST([[1.0, 2.5, 2.0]])),), grad=False),
    Case("gt", "gt", rc.gt, binary(lambda a, b: (a > b).astype(a.dtype)),
         broadcast_sets(GRID, _grid_b) + ((CONST([[1.0, 2.0, 3.0]]), CONST([[1.0, 2.5, 2.0]])),), grad=False),
    Case("minimum_nan", "minimum", rc.minimum, np.minimum, ((CONST([[np.nan, 1.0, 2.0]]), CONST([[0.0, np.nan, 1.0]])),), grad=False),
    Case("maximum_nan", "maximum", rc.maximum, np.maximum, ((CONST([[np.nan, 1.0, 2.0]]), CONST([[0.0, np.nan, 1.0]])),), grad=False),
    Case("add_scalar", "add", lambda a: rc.add(a, 2.5), lambda a: a + 2.5, ((N(3, 4),), (N(1, 2),))),
    Case("sub_from_scalar", "sub", lambda a: rc.sub(1.5, a), lambda a: 1.5 - a, ((N(3, 4),), (N(2, 1),))),
    Case("mul_numpy_constant", "mul", lambda a: rc.mul(a, np.array([[2.0], [-3.0]])),
         lambda a: a * np.array([[2.0], [-3.0]]), ((N(2, 3),), (N(2, 1),))),
    Case("operators", "add", lambda a, b: (a + b) * a - b / (a * a + 1.0) + (-a) @ b.T,
         lambda a, b: (a + b) * a - b / (a * a + 1.0) + (-a) @ b.T, ((N(3, 3), N(3, 3)), (N(2, 2), N(2, 2)))),
    # elementwise unary
    _unary("neg", np.negative, N),
    _unary("relu", lambda x: np.maximum(x, 0.0), AWAY),
    _unary("leaky_relu", lambda x: np.where(x > 0, x, 0.01 * x), AWAY),
    Case("leaky_relu_slope", "leaky_relu", lambda x: rc.leaky_relu(x, negative_slope=0.3),
         lambda x: np.where(x > 0, x, 0.3 * x), unary_sets(AWAY)),
    Case("leaky_relu_nonfinite", "leaky_relu", lambda x: rc.leaky_relu(x, 0.2), lambda x: np.where(x > 0, x, 0.2 * x),
         ((CONST([[np.nan, np.inf, -np.inf, 0.0, -3.0, 3.0]]),),), grad=False),
    _unary("sigmoid", np_sigmoid, lambda *s: U(-4, 4, *s)),
    Case("sigmoid_extreme", "sigmoid", rc.sigmoid, np_sigmoid, ((CONST([[-60.0, -20.0, 0.0, 20.0, 60.0]]),), (CONST([[-700.0], [700.0]]),)), grad=False),
    _unary("tanh", np.tanh, lambda *s: U(-3, 3, *s)),
    _unary("softplus", lambda x: np.logaddexp(0.0, x), lambda *s: U(-5, 5, *s)),
    Case("softplus_extreme", "softplus", rc.softplus, lambda x: np.logaddexp(0.0, x),
         ((CONST([[-40.0, -10.0, 0.0, 10.0, 40.0]]),), (CONST([[80.0], [-80.0]]),)), grad=False),
    _unary("silu", lambda x: x * np_sigmoid(x), lambda *s: U(-4, 4, *s)),
    _unary("exp", np.exp, lambda *s: U(-2, 2, *s)),
    _unary("log", np.log, POS),
    _unary("sqrt", np.sqrt, POS),
    _unary("square", np.square, N),
    _unary("abs", np.abs, AWAY),
    Case("sign", "sign", rc.sign, np.sign, unary_sets(AWAY) + ((CONST([[0.0, -0.0, 1e-30, -3.0]]),),), grad=False),
    Case("scale", "scale", lambda x: rc.scale(x, -1.7), lambda x: x * -1.7, unary_sets(N)),
    Case("scale_int_factor", "scale", lambda x: rc.scale(x, 3), lambda x: 3 * x, ((N(3, 4),), (N(1, 2),))),
    Case("pow", "pow", lambda x: rc.pow(x, 2.5), lambda x: x ** 2.5, unary_sets(POS)),
    Case("pow_negative", "pow", lambda x: rc.pow(x, -1.5), lambda x: x ** -1.5, unary_sets(POS)),
    Case("pow_cube", "pow", lambda x: rc.pow(x, 3), lambda x: x ** 3, unary_sets(N)),
    Case("pow_operator", "pow", lambda x: x ** 2, np.square, ((N(3, 4),), (N(2, 1),))),
    Case("clamp", "clamp", lambda x: rc.clamp(x, -0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5),
         unary_sets(lambda *s: GRID(*s, offset=0.25))),
    Case("clamp_low_only", "clamp", lambda x: rc.clamp(x, lo=-1.0), lambda x: np.maximum(x, -1.0),
         unary_sets(lambda *s: GRID(*s, offset=0.25))),
    Case("clamp_high_only", "clamp", lambda x: rc.clamp(x, hi=0.0), lambda x: np.minimum(x, 0.0),
         unary_sets(lambda *s: GRID(*s, offset=0.25))),
    Case("cast_f64", "cast", lambda x: rc.cast(x, "f64"), lambda x: x, unary_sets(N), int_ok=True),
    Case("cast_f32", "cast", lambda x: rc.cast(x, "f32"), lambda x: x.astype(np.float32), unary_sets(N),
         int_ok=True, gc=dict(eps=1e-2, atol=1e-4)),
    Case("cast_f16", "cast", lambda x: rc.cast(x, "f16"), lambda x: x.astype(np.float16), unary_sets(N),
         grad=False, int_ok=True),
    Case("cast_f16_rounding", "cast", lambda x: rc.cast(x, "f16"), to_f16,
         ((CONST([[1 + 2**-11 + 2**-40, -(1 + 2**-11 + 2**-40), 2049 + 2**-30, 1 + 2**-11, 1e-300, 70000.0]]),),
          (lambda r: r.normal(size=(50, 40)) * np.exp(r.uniform(-20, 12, size=(50, 40))),)), grad=False, int_ok=True),
    Case("cast_bf16", "cast", lambda x: rc.cast(x, "bf16"), to_bf16, unary_sets(N), grad=False, int_ok=True),
    Case("cast_bf16_rounding", "cast", lambda x: rc.cast(x, "bf16"), to_bf16,
         ((CONST([[1 + 2**-8 + 2**-40, -(1 + 2**-8 + 2**-40), 1 + 2**-8, 1 + 3 * 2**-8, 1e-300, 3.4e38, 2.0**-133]]),),
          (lambda r: r.normal(size=(50, 40)) * np.exp(r.uniform(-90, 88, size=(50, 40))),)), grad=False, int_ok=True),
    Case("cast_i32", "cast", lambda x: rc.cast(x, "i32"), lambda x: np.trunc(x).astype(np.int32),
         unary_sets(lambda *s: N(*s, s=5.0)), grad=False, int_ok=True),
    Case("cast_from_i32", "cast", lambda i: rc.cast(i, "f32"), lambda i: i.astype(np.float32).reshape(-1, 1),
         ((IDX(3, -7, 0, 2**20),), (IDX(5),)), grad=False, int_ok=True),
    Case("cast_from_i32_scaled", "cast", lambda i: rc.cast(i, "f32", scale=1 / 255),
         lambda i: (i.astype(np.float32) * np.float32(1 / 255)).reshape(-1, 1),
         ((IDX(3, -7, 0, 2**20, 2**24 + 1),), (IDX(255),)), grad=False, int_ok=True),
    # linear algebra
    Case("matmul", "matmul", rc.matmul, np_matmul,
         ((N(3, 2), N(2, 4)), (N(1, 3), N(3, 1)), (N(4, 3), N(3, 2)))),
    Case("matmul_ta", "matmul", lambda a, b: rc.matmul(a, b, transpose_a=True), lambda a, b: np_matmul(a, b, ta=True),
         ((N(2, 3), N(2, 4)), (N(3, 1), N(3, 2)))),
    Case("matmul_tb", "matmul", lambda a, b: rc.matmul(a, b, transpose_b=True), lambda a, b: np_matmul(a, b, tb=True),
         ((N(3, 2), N(4, 2)), (N(2, 3), N(1, 3)))),
    Case("matmul_ta_tb", "matmul", lambda a, b: rc.matmul(a, b, True, True), lambda a, b: np_matmul(a, b, True, True),
         ((N(2, 3), N(4, 2)), (N(3, 1), N(2, 3)))),
    Case("matmul_batched", "matmul", rc.matmul, np_matmul,
         ((N(3, 2, 4), N(2, 5, 1)), (N(3, 2, 1), N(2, 3, 2)), (N(2, 2, 3), N(2, 2, 3)), (N(3, 2), N(2, 2, 3)),
          (N(2, 2, 2, 1), N(2, 3, 1, 2)))),
    *[Case(f"linear_{activation}", "linear", lambda w, x, b, a=activation: rc.linear(w, x, b, a), np_linear(activation),
           ((N(3, 2), N(2, 4), N(3, 1)), (N(4, 3), N(3, 2, 2), N(4, 1)), (N(1, 5), N(5, 1), N(1, 1))))
      for activation in (None, "relu", "tanh", "sigmoid")],
    Case("matmul_batched_tb", "matmul", lambda a, b: rc.matmul(a, b, transpose_b=True),
         lambda a, b: np_matmul(a, b, tb=True), ((N(3, 2, 2), N(4, 2, 1)), (N(2, 3, 1), N(2, 3, 3)))),
    # reductions and broadcasting
    Case("sum", "sum", rc.sum, np_reduce(np.sum, None, False), ((N(3, 4),), (N(2, 3, 2),))),
    *[
        Case(f"sum_dim{d}", "sum", lambda x, d=d: rc.sum(x, dim=d), np_reduce(np.sum, d, False), ((N(3, 4),), (N(1, 5),)))
        for d in (0, 1, -1)
    ],
    *[
        Case(f"sum3d_dim{d}_keep{k}", "sum", lambda x, d=d, k=k: rc.sum(x, dim=d, keepdim=k),
             np_reduce(np.sum, d, k), ((N(2, 3, 2),), (N(3, 2, 4),)))
        for d in (0, 1, 2) for k in (False, True)
    ],
    Case("sum4d_dim3", "sum", lambda x: rc.sum(x, dim=3), np_reduce(np.sum, 3, False), ((N(2, 2, 2, 3),), (N(1, 3, 1, 2),))),
    Case("mean", "mean", rc.mean, np_reduce(np.mean, None, False), ((N(3, 4),), (N(2, 3, 2),))),
    *[
        Case(f"mean_dim{d}", "mean", lambda x, d=d: rc.mean(x, dim=d), np_reduce(np.mean, d, False), ((N(3, 4),), (N(2, 5),)))
        for d in (0, 1)
    ],
    *[
        Case(f"mean3d_dim{d}_keep{k}", "mean", lambda x, d=d, k=k: rc.mean(x, dim=d, keepdim=k),
             np_reduce(np.mean, d, k), ((N(2, 3, 2),), (N(3, 2, 4),)))
        for d, k in ((1, False), (2, True))
    ],
    Case("sum_to_rows", "sum_to", lambda x: rc.sum_to(x, (3, 1)), lambda x: x.sum(axis=1, keepdims=True),
         ((N(3, 4),), (N(3, 7),), (N(3, 1),))),
    Case("sum_to_cols", "sum_to", lambda x: rc.sum_to(x, (1, 4)), lambda x: x.sum(axis=0, keepdims=True),
         ((N(3, 4),), (N(5, 4),))),
    Case("sum_to_3d", "sum_to", lambda x: rc.sum_to(x, (2, 1, 4)), lambda x: x.sum(axis=1, keepdims=True),
         ((N(2, 3, 4),), (N(2, 1, 4),))),
    Case("sum_to_2d_of_3d", "sum_to", lambda x: rc.sum_to(x, (2, 1)), lambda x: x.sum(axis=(1, 2)).reshape(2, 1),
         ((N(2, 3, 4),), (N(2, 2, 2),))),
    Case("expand", "expand", lambda x: rc.expand(x, (3, 5)), lambda x: np.broadcast_to(x, (3, 5)).copy(),
         ((N(3, 1),), (N(1, 5),), (N(1, 1),))),
    Case("expand_3d", "expand", lambda x: rc.expand(x, (2, 4, 3)), lambda x: np.broadcast_to(_align(x, np.zeros((1, 1, 1)))[0], (2, 4, 3)).copy(),
         ((N(2, 1, 3),), (N(2, 1),), (N(1, 4, 1),))),
    Case("softmax", "softmax", rc.softmax, np_softmax, ((N(4, 3, s=2.0),), (N(3, 5),), (N(3, 2, 2),))),
    Case("softmax_large", "softmax", rc.softmax, np_softmax,
         ((CONST([[1000.0, -1000.0], [999.0, -1001.0], [0.0, -2000.0]]),), (CONST([[50.0], [-50.0]]),)), grad=False),
    Case("log_softmax", "log_softmax", rc.log_softmax, np_log_softmax, ((N(4, 3, s=2.0),), (N(3, 5),), (N(3, 2, 2),))),
    Case("log_softmax_large", "log_softmax", rc.log_softmax, np_log_softmax,
         ((CONST([[1000.0, -1000.0], [999.0, -1001.0], [0.0, -2000.0]]),), (CONST([[50.0], [-50.0]]),)), grad=False),
    Case("max", "max", rc.max, lambda x: x.max(axis=0, keepdims=True), ((DISTINCT(4, 3),), (DISTINCT(3, 5),), (DISTINCT(3, 2, 2),))),
    Case("cumsum", "cumsum", rc.cumsum, lambda x: np.cumsum(x, axis=0), ((U(0, 1, 7, 1),), (N(5, 3),), (N(300, 2),)),
         grad=False),
    Case("searchsorted", "searchsorted", rc.searchsorted, np_searchsorted,
         ((SORTED(9), U(-3, 3, 1, 40)), (SORTED(1), N(3, 2)), (SORTED(50), U(-4, 4, 1, 300))), grad=False),
    Case("argmax", "argmax", rc.argmax, lambda x: np.argmax(x, axis=0)[None].astype(np.int32),
         ((DISTINCT(4, 3),), (DISTINCT(3, 2, 2),), (CONST([[1.0, 3.0, -1.0], [3.0, 3.0, -1.0], [2.0, 1.0, -1.0]]),)),
         grad=False),
    # layout and indexing
    Case("transpose", "transpose", rc.transpose, lambda x: np.swapaxes(x, 0, 1).copy(),
         ((N(3, 4),), (N(1, 5),), (N(2, 3, 2),), (N(40, 70),)), int_ok=True),
    Case("transpose_T", "transpose", lambda x: x.T, lambda x: x.T.copy(), ((N(3, 4),), (N(2, 1),)), int_ok=True),
    Case("permute_4d", "permute", lambda x: rc.permute(x, (2, 0, 3, 1)), lambda x: np.transpose(x, (2, 0, 3, 1)).copy(),
         ((N(3, 4, 5, 2),), (N(1, 3, 2, 2),), (N(33, 2, 35, 3),)), int_ok=True),
    Case("permute_3d", "permute", lambda x: rc.permute(x, (1, 2, 0)), lambda x: np.transpose(x, (1, 2, 0)).copy(),
         ((N(3, 4, 5),), (N(40, 1, 37),)), int_ok=True),
    Case("permute_2d", "permute", lambda x: rc.permute(x, (1, 0)), lambda x: x.T.copy(), ((N(3, 4),), (N(1, 5),)), int_ok=True),
    Case("permute_method", "permute", lambda x: x.permute(1, 2, 0), lambda x: np.transpose(x, (1, 2, 0)).copy(),
         ((N(2, 3, 4),), (N(5, 1, 2),)), int_ok=True),
    Case("permute_identity", "permute", lambda x: rc.permute(x, (0, 1, 2)), lambda x: x.copy(), ((N(3, 4, 2),), (N(1, 5, 3),)), int_ok=True),
    Case("reshape", "reshape", lambda x: rc.reshape(x, (2, 6)), np_reshape((2, 6)), ((N(3, 4),), (N(12, 1),)), int_ok=True),
    Case("reshape_infer", "reshape", lambda x: rc.reshape(x, (-1, 2)), np_reshape((-1, 2)), ((N(3, 4),), (N(2, 3, 2),)), int_ok=True),
    Case("reshape_flat", "reshape", lambda x: rc.reshape(x, -1), np_reshape((-1,)), ((N(3, 4),), (N(2, 1, 3),)), int_ok=True),
    Case("reshape_3d", "reshape", lambda x: rc.reshape(x, (2, -1, 3)), np_reshape((2, -1, 3)), ((N(3, 4),), (N(6, 2),)), int_ok=True),
    Case("slice_rows", "slice_rows", lambda x: rc.slice_rows(x, 1, 2), lambda x: x[1:3].copy(),
         ((N(5, 3),), (N(3, 1),), (N(4, 2, 2),)), int_ok=True),
    Case("slice_rows_all", "slice_rows", lambda x: rc.slice_rows(x, 0, 3), lambda x: x[0:3].copy(),
         ((N(3, 4),), (N(3, 2, 2),)), int_ok=True),
    Case("pad_rows", "pad_rows", lambda x: rc.pad_rows(x, 1, 2),
         lambda x: np.pad(x, [(1, 2)] + [(0, 0)] * (x.ndim - 1)), ((N(3, 4),), (N(1, 2),), (N(2, 3, 2),))),
    Case("pad_rows_after", "pad_rows", lambda x: rc.pad_rows(x, 0, 1),
         lambda x: np.pad(x, [(0, 1)] + [(0, 0)] * (x.ndim - 1)), ((N(3, 4),), (N(2, 1),))),
    Case("concat_rows", "concat_rows", rc.concat_rows, lambda a, b: np.concatenate(_align(a, b), axis=0),
         ((N(2, 3), N(3, 3)), (N(1, 4), N(2, 4)), (N(2, 2, 2), N(1, 2, 2))), int_ok=True),
    Case("gather", "gather", rc.gather, lambda x, i: x[i.ravel(), np.arange(x.shape[1])][None],
         ((N(3, 4), IDX(2, 0, 1, 2)), (N(5, 2), IDX(4, 4)), (N(1, 3), IDX(0, 0, 0)))),
    Case("one_hot", "one_hot", lambda i: rc.one_hot(i, 3), lambda i: np.eye(3, dtype=np.float32)[i.ravel()].T.copy(),
         ((IDX(2, 0, 1, 2),), (IDX(1),)), grad=False),
    Case("one_hot_f64", "one_hot", lambda i: rc.one_hot(i, 5, dtype="f64"), lambda i: np.eye(5)[i.ravel()].T.copy(),
         ((IDX(4, 0, 0),), (IDX(3, 1),)), grad=False),
    Case("get_rows", "get_rows", rc.get_rows, lambda x, i: x[:, i.ravel()],
         ((N(3, 4), IDX(3, 0, 3, 1, 1)), (N(2, 5), IDX(4)), (N(1, 3), IDX(2, 2, 2, 0))), int_ok=True),
    Case("scatter_cols", "scatter_cols", lambda g, i: rc.scatter_cols(g, i, 5), lambda g, i: np_scatter_cols(g, i, 5),
         ((N(3, 4), IDX(0, 2, 0, 4)), (N(2, 3), IDX(1, 1, 1)), (N(1, 5), IDX(4, 3, 2, 1, 0)))),
    # random with a gradient: the noise is the same in every call because the function reseeds
    Case("sample_normal", "sample_normal", lambda mu, ls: (rc.manual_seed(11), rc.sample_normal(mu, ls))[1],
         lambda mu, ls: mu + np.exp(ls) * np_randn_like(np.broadcast_shapes(mu.shape, ls.shape), 11),
         ((N(3, 4), N(3, 4, s=0.5)), (N(3, 4), N(3, 1, s=0.5)), (N(2, 5), N(1, 1)), (N(3, 1), N(3, 4, s=0.5)))),
    Case("stop_gradient", "stop_gradient", rc.stop_gradient, lambda x: x, ((N(3, 4),), (N(2, 1),)), grad=False, int_ok=True),
    Case("where", "where", rc.where, lambda c, x, y: np.where(c > 0.5, x, y),
         ((CONST([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]]), N(2, 3), N(2, 3)), (CONST([[0.0, 1.0]]), N(1, 2), N(1, 1))),
         grad=False),
    # losses
    Case("mse_loss", "mse_loss", rc.mse_loss, lambda p, t: np.mean((p - t) ** 2).reshape(1, 1),
         ((N(3, 4), N(3, 4)), (N(1, 5), N(1, 5)), (N(4, 1), N(4, 1)))),
    Case("huber_loss", "huber_loss", rc.huber_loss, lambda p, t: np_huber(p, t, 1.0),
         ((CONST([[0.3, -2.0, 1.7, -0.6]]), CONST([[0.0, 0.5, -0.4, 0.2]])), (GRID(3, 4), _grid_b(3, 4)), (GRID(2, 2), _grid_b(2, 2)))),
    Case("huber_loss_delta", "huber_loss", lambda p, t: rc.huber_loss(p, t, delta=0.5), lambda p, t: np_huber(p, t, 0.5),
         ((CONST([[0.3, -2.0, 1.7, -0.6]]), CONST([[0.0, 0.5, -0.4, 0.2]])), (GRID(3, 4), _grid_b(3, 4)))),
    Case("huber_loss_none", "huber_loss", lambda p, t: rc.huber_loss(p, t, delta=0.5, reduction="none"),
         lambda p, t: np_huber_terms(p, t, 0.5),
         ((CONST([[0.3, -2.0, 1.7, -0.6]]), CONST([[0.0, 0.5, -0.4, 0.2]])), (GRID(3, 4), _grid_b(3, 4)))),
    Case("cross_entropy_loss", "cross_entropy_loss", rc.cross_entropy_loss,
         lambda p, t: (-np.sum(t * np.log(p)) / p.shape[1]).reshape(1, 1),
         ((U(0.05, 0.95, 3, 4), U(0, 1, 3, 4)), (SOFT(4, 2), ONEHOT(4, 2)), (U(0.05, 0.95, 2, 5), SOFT(2, 5)))),
    Case("cross_entropy_loss_clamped", "cross_entropy_loss", rc.cross_entropy_loss,
         lambda p, t: (-np.sum(t * np.log(np.clip(p, 1e-7, 1 - 1e-7))) / p.shape[1]).reshape(1, 1),
         ((CONST([[0.0, 1.0], [1.0, 0.0]]), CONST([[1.0, 0.0], [0.0, 1.0]])),
          (CONST([[0.0, 0.5], [1.0, 0.5]]), CONST([[0.5, 0.5], [0.5, 0.5]]))), grad=False),
    Case("softmax_cross_entropy_loss", "softmax_cross_entropy_loss", rc.softmax_cross_entropy_loss,
         lambda x, t: (-np.sum(t * np_log_softmax(x)) / x.shape[1]).reshape(1, 1),
         ((N(4, 3, s=2.0), ONEHOT(4, 3)), (N(2, 5), ONEHOT(2, 5))), index_args=(1,)),
    Case("softmax_cross_entropy_loss_soft", "softmax_cross_entropy_loss", rc.softmax_cross_entropy_loss,
         lambda x, t: (-np.sum(t * np_log_softmax(x)) / x.shape[1]).reshape(1, 1),
         ((N(4, 3, s=2.0), SOFT(4, 3)), (N(3, 1), SOFT(3, 1)))),
    Case("softmax_cross_entropy_loss_index", "softmax_cross_entropy_loss", rc.softmax_cross_entropy_loss,
         lambda x, i: (-np_log_softmax(x)[i.ravel(), np.arange(x.shape[1])].sum() / x.shape[1]).reshape(1, 1),
         ((N(4, 3, s=2.0), IDX(3, 0, 3)), (N(2, 5), IDX(0, 1, 1, 0, 1)))),
    # Mamba's causal depthwise conv: sx [d_conv - 1 + n_t, d_inner, n_s], c [d_conv, d_inner]
    Case("ssm_conv", "ssm_conv", rc.ssm_conv, lambda sx, c: np_ssm_conv(sx, c),
         ((N(5, 3, 2), N(4, 3)), (N(4, 2, 1), N(4, 2)), (N(7, 1, 3), N(1, 1)), (N(6, 4, 2), N(3, 4)))),
    # Mamba's selective scan: s [d_state, head_dim, n_head, n_rs], x [head_dim, n_head, n_tok, n_seqs],
    # dt [n_head, n_tok, n_seqs], A [1 or d_state, n_head], B and C [d_state, n_group, n_tok, n_seqs], ids
    Case("ssm_scan", "ssm_scan", lambda *a: packed(*rc.ssm_scan(*a)), lambda *a: packed(*np_ssm_scan(*a)),
         ((N(3, 2, 4, 3), N(2, 4, 7, 2), N(4, 7, 2), DECAY(1, 4), N(3, 2, 7, 2), N(3, 2, 7, 2), IDX(2, 0)),  # Mamba-2
          (N(4, 1, 3, 1), N(1, 3, 5, 1), N(3, 5, 1), DECAY(4, 3), N(4, 1, 5, 1), N(4, 1, 5, 1), IDX(0)),  # Mamba-1
          (N(2, 3, 2, 2), N(3, 2, 10, 2), N(2, 10, 2, s=3.0), DECAY(1, 2), N(2, 2, 10, 2), N(2, 2, 10, 2), IDX(1, 1)))),
    # its chunked form (SSD, Mamba-2's A only; chunks of 3, the last short: one op, ssd_chunks)
    Case("ssm_scan_chunked", "ssm_scan", lambda *a: packed(*rc.ssm_scan(*a, chunk_size=3)),
         lambda *a: packed(*np_ssm_scan(*a)),
         ((N(3, 2, 4, 3), N(2, 4, 7, 2), N(4, 7, 2), DECAY(1, 4), N(3, 2, 7, 2), N(3, 2, 7, 2), IDX(2, 0)),
          (N(2, 3, 2, 2), N(3, 2, 10, 2), N(2, 10, 2, s=3.0), DECAY(1, 2), N(2, 2, 10, 2), N(2, 2, 10, 2), IDX(1, 1)))),
    Case("rwkv_wkv6", "rwkv_wkv6", lambda *a: packed(*rc.rwkv_wkv6(*a)),
         lambda k, v, r, tf, td, s: packed(*np_recurrence(k, v, r, td, s, u=tf)),
         tuple(RECURRENCE(*shape, bonus=True) for shape in RECURRENCE_SHAPES)),
    Case("gated_linear_attn", "gated_linear_attn", lambda *a: packed(*rc.gated_linear_attn(*a, scale=0.7)),
         lambda k, v, q, g, s: packed(*np_recurrence(k, v, q, g, s, scale=0.7)),
         tuple(RECURRENCE(*shape, bonus=False) for shape in RECURRENCE_SHAPES)),
    # its chunked form (chunks of 4, one op: gla_chunks); gates in [0.5, 2): positive, as log(g) needs
    Case("gated_linear_attn_chunked", "gated_linear_attn",
         lambda k, v, q, g, s: packed(*rc.gated_linear_attn(k, v, q, g, s, scale=0.7, chunk_size=4)),
         lambda k, v, q, g, s: packed(*np_recurrence(k, v, q, g, s, scale=0.7)),
         ((N(2, 2, 6), N(2, 2, 6), N(2, 2, 6), POS(2, 2, 6), N(8, 2)), (N(3, 1, 5), N(3, 1, 5), N(3, 1, 5), POS(3, 1, 5), N(9, 1)))),
    # RWKV-7: r, w, k, v, a, b [S, H, T], state [S*S*H, n_seqs]; 18 tokens per sequence cross the
    # backward's 16-token checkpoint chunk
    Case("rwkv_wkv7", "rwkv_wkv7", lambda *a: packed(*rc.rwkv_wkv7(*a)), lambda *a: packed(*np_rwkv_wkv7(*a)),
         (WKV7(2, 2, 3, 1), WKV7(2, 1, 36, 2), WKV7(3, 2, 4, 2)), atol32=1e-5),
    # its chunked form (chunks of 2 tokens, the last short where 5 tokens) through wkv7_chunk_states
    Case("rwkv_wkv7_chunked", "rwkv_wkv7", lambda *a: packed(*rc.rwkv_wkv7(*a, chunk_size=2)),
         lambda *a: packed(*np_rwkv_wkv7(*a)), (WKV7(2, 2, 5, 1), WKV7(3, 1, 8, 2)), atol32=1e-5),
    # images [W, H, C, N] and kernels [KW, KH, C_in, C_out]; stride, padding, dilation in PyTorch's (h, w) order
    Case("conv2d", "conv2d", rc.conv2d, np_conv2d,
         ((N(7, 5, 3, 3), N(3, 2, 3, 4)), (N(6, 6, 2, 1), N(1, 1, 2, 3)), (N(5, 4, 1, 2), N(5, 4, 1, 1)), (N(5, 6, 2), N(2, 3, 2, 2)))),
    Case("conv2d_strided", "conv2d", lambda x, w: rc.conv2d(x, w, stride=(2, 3), padding=(1, 2), dilation=(2, 1)),
         lambda x, w: np_conv2d(x, w, stride=(2, 3), padding=(1, 2), dilation=(2, 1)),
         ((N(9, 11, 3, 3), N(3, 2, 3, 4)), (N(8, 7, 2, 2), N(2, 3, 2, 5)))),
    Case("conv2d_stride3_dilation2", "conv2d", lambda x, w: rc.conv2d(x, w, stride=3, padding=2, dilation=2),
         lambda x, w: np_conv2d(x, w, stride=3, padding=2, dilation=2), ((N(10, 9, 2, 3), N(3, 3, 2, 3)), (N(7, 8, 3, 1), N(2, 3, 3, 2)))),
    Case("conv2d_bias", "conv2d", lambda x, w, b: rc.conv2d(x, w, b, stride=2, padding=1),
         lambda x, w, b: np_conv2d(x, w, b, stride=2, padding=1),
         ((N(7, 6, 3, 3), N(3, 3, 3, 4), N(4)), (N(5, 9, 2, 2), N(2, 4, 2, 5), N(5, 1)))),
    # the bias and the activation in the convolution's kernel (conv2d's epilogue), with and without a bias
    *[Case(f"conv2d_bias_{activation}", "conv2d",
           lambda x, w, b, a=activation: rc.conv2d(x, w, b, stride=(1, 2), padding=1, activation=a),
           lambda x, w, b, a=activation: np_activation(a)(np_conv2d(x, w, b, stride=(1, 2), padding=1)),
           ((N(7, 6, 3, 3), N(3, 3, 3, 4), N(4)), (N(5, 9, 2, 2), N(2, 4, 2, 5), N(5, 1))))
      for activation in ("relu", "tanh", "sigmoid")],
    Case("conv2d_relu", "conv2d", lambda x, w: rc.conv2d(x, w, activation="relu"),
         lambda x, w: np_activation("relu")(np_conv2d(x, w)), ((N(7, 5, 3, 3), N(3, 2, 3, 4)), (N(6, 6, 2, 1), N(1, 1, 2, 3)))),
    Case("max_pool2d", "max_pool2d", lambda x: rc.max_pool2d(x, 3, stride=2, padding=1),
         lambda x: np_max_pool2d(x, 3, stride=2, padding=1), ((PERMUTED(7, 9, 2, 3),), (PERMUTED(6, 5, 3, 1),))),
    Case("max_pool2d_rect", "max_pool2d", lambda x: rc.max_pool2d(x, (2, 3), stride=(1, 2), padding=(1, 1)),
         lambda x: np_max_pool2d(x, (2, 3), stride=(1, 2), padding=(1, 1)), ((PERMUTED(8, 5, 2, 3),), (PERMUTED(3, 4, 1, 2),))),
    Case("max_pool2d_default_stride", "max_pool2d", lambda x: rc.max_pool2d(x, 2), lambda x: np_max_pool2d(x, 2),
         ((PERMUTED(7, 6, 3, 2),), (PERMUTED(4, 5, 2),))),
    Case("max_pool2d_nonfinite", "max_pool2d", lambda x: rc.max_pool2d(x, 2, stride=1),
         lambda x: np_max_pool2d(x, 2, stride=1),
         ((CONST([[1.0, np.nan, 3.0], [4.0, 2.0, -np.inf], [np.inf, 0.5, -1.0]]),),), grad=False),
    Case("softmax_cross_entropy_loss_large", "softmax_cross_entropy_loss", rc.softmax_cross_entropy_loss,
         lambda x, t: (-np.sum(t * np_log_softmax(x)) / x.shape[1]).reshape(1, 1),
         ((CONST([[1000.0, -500.0], [0.0, 500.0]]), CONST([[0.0, 1.0], [1.0, 0.0]])),
          (CONST([[-1000.0], [1000.0]]), CONST([[0.3], [0.7]]))), grad=False),
]

# Inputs above the kernels' parallel grain (2**15 elements): the chunked, multi-threaded paths.
CASES += [
    Case("ssm_conv_large", "ssm_conv", rc.ssm_conv, lambda sx, c: np_ssm_conv(sx, c),
         ((N(67, 96, 16), N(4, 96)),), grad=False, atol32=5e-5),
    Case("conv2d_large", "conv2d", lambda x, w: rc.conv2d(x, w, stride=(1, 2), padding=(2, 1)),
         lambda x, w: np_conv2d(x, w, stride=(1, 2), padding=(2, 1)),
         ((N(61, 57, 8, 8), N(5, 5, 8, 37)), (N(23, 19, 5, 3), N(3, 3, 5, 70))), grad=False, atol32=5e-5),
    Case("conv2d_large_bias_relu", "conv2d", lambda x, w, b: rc.conv2d(x, w, b, stride=2, activation="relu"),
         lambda x, w, b: np_activation("relu")(np_conv2d(x, w, b, stride=2)),
         ((N(84, 84, 4, 5), N(8, 8, 4, 32), N(32)), (N(20, 20, 32, 9), N(4, 4, 32, 64), N(64, 1))), grad=False, atol32=5e-5),
    Case("max_pool2d_large", "max_pool2d", lambda x: rc.max_pool2d(x, 3, stride=2, padding=1),
         lambda x: np_max_pool2d(x, 3, stride=2, padding=1), ((N(64, 64, 16, 5),),), grad=False),
    Case("add_large", "add", rc.add, binary(np.add),
         ((N(300, 200), N(300, 1)), (N(300, 200), N(1, 200)), (N(2, 3, 7000), N(2, 1, 7000)), (N(1, 40000), N(1, 1))), grad=False),
    Case("mul_large", "mul", rc.mul, binary(np.multiply), ((N(200, 300), N(200, 300)), (N(7, 1, 5000), N(1, 3, 1))), grad=False),
    Case("sigmoid_large", "sigmoid", rc.sigmoid, np_sigmoid, ((N(300, 200, s=3.0),),), grad=False),
    Case("softmax_many_columns", "softmax", rc.softmax, np_softmax, ((N(4, 20000),), (N(300, 200),)), grad=False),
    Case("log_softmax_many_columns", "log_softmax", rc.log_softmax, np_log_softmax, ((N(4, 20000),),), grad=False),
    Case("max_many_columns", "max", rc.max, lambda x: x.max(axis=0, keepdims=True), ((N(3, 30000),),), grad=False),
    Case("argmax_many_columns", "argmax", rc.argmax, lambda x: np.argmax(x, axis=0)[None].astype(np.int32), ((N(3, 30000),),), grad=False),
    Case("sum_large", "sum", lambda x: rc.sum(x, dim=1), np_reduce(np.sum, 1, False), ((N(300, 200),), (N(2, 40000),)), grad=False),
    Case("sum_to_large", "sum_to", lambda x: rc.sum_to(x, (1, 200)), lambda x: x.sum(axis=0, keepdims=True), ((N(300, 200),),), grad=False),
    Case("expand_large", "expand", lambda x: rc.expand(x, (300, 200)), lambda x: np.broadcast_to(x, (300, 200)).copy(),
         ((N(300, 1),), (N(1, 200),)), grad=False),
    Case("transpose_large", "transpose", rc.transpose, lambda x: np.swapaxes(x, 0, 1).copy(),
         ((N(300, 200),), (N(7, 5000, 2),)), grad=False, int_ok=True),
    Case("permute_large", "permute", lambda x: rc.permute(x, (1, 3, 0, 2)), lambda x: np.transpose(x, (1, 3, 0, 2)).copy(),
         ((N(70, 300, 3, 4),),), grad=False, int_ok=True),
    Case("concat_rows_large", "concat_rows", rc.concat_rows, lambda a, b: np.concatenate([a, b]),
         ((N(2, 30000), N(1, 30000)),), grad=False, int_ok=True),
    Case("get_rows_large", "get_rows", rc.get_rows, lambda x, i: x[:, i.ravel()], ((N(8, 500), RIDX(6000, 500)),),
         grad=False, int_ok=True),
    Case("scatter_cols_large", "scatter_cols", lambda g, i: rc.scatter_cols(g, i, 500), lambda g, i: np_scatter_cols(g, i, 500),
         ((N(8, 6000), RIDX(6000, 500)),), grad=False),
    Case("sum_squares", "sum_squares", lambda *xs: rc.sum_squares(xs), lambda *xs: np.array([[sum((x * x).sum() for x in xs)]]),
         ((N(3, 4), N(5, 1)), (N(2, 3, 2),), (N(1, 1), N(4, 1), N(2, 2, 2, 2)))),
    Case("sum_squares_large", "sum_squares", lambda *xs: rc.sum_squares(xs),
         lambda *xs: np.array([[sum((x * x).sum() for x in xs)]]), ((N(300, 201), N(1, 1), N(1025, 3)),), grad=False, atol32=5e-2),
    Case("matmul_large", "matmul", rc.matmul, np_matmul, ((N(64, 100), N(100, 80)), (N(30, 20, 4), N(20, 50, 1))),
         grad=False, atol32=5e-5),
]

CASE_BY_ID = {c.id: c for c in CASES}
assert len(CASE_BY_ID) == len(CASES), "case ids must be unique"

# Ops covered by dedicated tests below rather than by table cases.
# Ops the optimizers apply inside captured steps (not public functions): test_capture.py checks
# them against eager updates; the bad-input table below covers their checks.
# polyak_step: tests/test_optim_fused.py checks it against numpy on both devices;
# cast_into: tests/test_mixed_precision.py, against numpy's rounding and eager master-weight steps;
# elementwise_chain: tests/test_elementwise_chain.py, against the ops it chains.
# matmul_relu_mask: tests/test_product_epilogues.py, against numpy's product and relu_back (f32 only).
INTERNAL_OPS = {"adam_step", "sgd_step", "polyak_step", "cast_into", "put_cols", "elementwise_chain",  # put_cols: the device prioritized buffer
                "matmul_relu_mask",
                "randint"}  # rc.ops.randint: the replay buffers' sampling on the device (tests/test_random_ops.py)
# polyak_update and put_cols (in place, returning nothing): test_polyak_update_and_put_cols_write_in_place below
DEDICATED = {"rand", "randn", "sample_categorical", "full", "arange", "polyak_update"} | INTERNAL_OPS  # tests/test_random_ops.py
COVERED_OPS = {c.op for c in CASES} | DEDICATED
GRAD_COVERED_OPS = {c.op for c in CASES if c.grad}


# ---- helpers ---------------------------------------------------------------------------------------

def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32("/".join(map(str, key)).encode()))


def _arrays(case: Case, k: int) -> list[np.ndarray]:
    r = _rng(case.id, k)
    return [gen(r) for gen in case.inputs[k]]


def _is_index(a: np.ndarray) -> bool:
    return a.dtype.kind in "iu"


def _tensor(a: np.ndarray, dtype: str) -> rc.Tensor:
    if _is_index(a):
        return rc.tensor(np.asfortranarray(a, dtype=np.int32))
    return rc.tensor(np.asfortranarray(a, dtype=NP_DTYPE[dtype]), dtype=dtype)


def _assert_matches(out: rc.Tensor, expected: np.ndarray, dtype: str, atol32: float = 1e-6) -> None:
    got = out.numpy()
    assert got.shape == expected.shape, f"shape {got.shape}, expected {expected.shape}"
    if out.dtype == "i32":
        np.testing.assert_array_equal(got, expected)
    elif out.dtype == "f16":
        np.testing.assert_array_equal(got, expected.astype(np.float16))
    elif out.dtype == "bf16":  # expected is already rounded (to_bf16)
        np.testing.assert_array_equal(got.view(np.uint16), expected.astype(ml_dtypes.bfloat16).view(np.uint16))
    elif out.dtype == "f32" or dtype == "f32":
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=atol32)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def _params(cases, grad_only=False):
    return [
        pytest.param(c, k, id=f"{c.id}-{k}") for c in cases if c.grad or not grad_only for k in range(len(c.inputs))
    ]


# ---- forward ---------------------------------------------------------------------------------------

# Ops whose result dtype is not their input's: the reference's dtype says which it must be.
OWN_OUTPUT_DTYPE = {"argmax", "one_hot", "cast", "searchsorted"}


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("case, k", _params(CASES))
def test_forward(case: Case, k: int, dtype: str):
    arrays = _arrays(case, k)
    # the reference sees exactly the values the engine sees (rounded to dtype), in float64
    rounded = [a if _is_index(a) else a.astype(NP_DTYPE[dtype]).astype(np.float64) for a in arrays]
    out = case.fn(*[_tensor(a, dtype) for a in arrays])
    assert isinstance(out, rc.Tensor)
    expected = case.ref(*rounded)
    if case.op in OWN_OUTPUT_DTYPE:
        assert out.numpy().dtype == expected.dtype, f"{case.id} gave {out.dtype}, expected {expected.dtype}"
    else:
        assert out.dtype == dtype, f"{case.op} on {dtype} gave {out.dtype}"
    _assert_matches(out, expected, dtype, case.atol32)


@pytest.mark.parametrize("case, k", [p for p in _params(CASES) if p.values[0].int_ok and p.values[0].op != "cast"])
def test_forward_i32(case: Case, k: int):
    """Layout ops are defined for i32 tensors too; they move values without changing them."""
    arrays = [a if _is_index(a) else np.round(a * 100).astype(np.int32) for a in _arrays(case, k)]
    out = case.fn(*[rc.tensor(np.asfortranarray(a)) for a in arrays])
    assert out.dtype == "i32"
    np.testing.assert_array_equal(out.numpy(), case.ref(*arrays))


# ---- gradients -------------------------------------------------------------------------------------

@pytest.mark.parametrize("case, k", _params(CASES, grad_only=True))
def test_gradient(case: Case, k: int):
    arrays = _arrays(case, k)
    inputs = [rc.tensor(a) if _is_index(a) else np.asfortranarray(a, dtype=np.float64) for a in arrays]
    out = case.fn(*[_tensor(a, "f64") for a in arrays])
    # a fixed random upstream gradient: sum(w * f(x)) instead of sum(f(x))
    weight = rc.tensor(_rng("weight", case.id, k).normal(size=out.shape), dtype=out.dtype)
    assert rc.gradcheck(lambda *xs: rc.mul(case.fn(*xs), weight), inputs, **case.gc)


def test_differentiable_cases_check_two_shapes_or_more():
    for c in CASES:
        if c.grad:
            shapes = {tuple(np.shape(a) for a in _arrays(c, k)) for k in range(len(c.inputs))}
            assert len(shapes) >= 2, f"{c.id}: gradcheck at {len(shapes)} distinct shape(s)"


def test_gradcheck_detects_a_wrong_gradient():
    """The harness can fail: stop_gradient inside fn makes the analytic gradient differ."""
    with pytest.raises(rc.GradcheckError, match="input 0"):
        rc.gradcheck(lambda x: rc.mul(x, rc.stop_gradient(x)), [np.asfortranarray(np.ones((2, 2)) * 0.7)])


def _grads_of(fn, *arrays):
    params = [rc.param(np.asfortranarray(a, dtype=np.float64), dtype="f64") for a in arrays]
    with rc.grad_tape():
        loss = rc.sum(fn(*params))
    grads = rc.backward(loss)
    return [grads[p] if p in grads else None for p in params]


def test_stop_gradient_blocks_the_gradient():
    x = np.array([[0.5, -1.5], [2.0, 3.0]])
    (g,) = _grads_of(lambda p: rc.mul(p, rc.stop_gradient(p)), x)
    np.testing.assert_allclose(g, x)  # d/dx (x * c) with c = x held constant; 2x without the stop
    (g,) = _grads_of(lambda p: rc.add(rc.scale(rc.stop_gradient(p), 3.0), p), x)
    np.testing.assert_array_equal(g, np.ones_like(x))


def test_stop_gradient_alone_gives_no_gradient():
    p = rc.param(np.ones((2, 2)), dtype="f64")
    with rc.grad_tape():
        out = rc.sum(rc.stop_gradient(p))
    assert not out.requires_grad


def test_sample_normal_gradient_is_the_noise():
    """d(mu + exp(ls) eps)/d mu = 1 and d/d ls = exp(ls) eps, with eps the same stream."""
    mu, ls = np.zeros((2, 3)), np.full((2, 1), 0.3)
    eps = np_randn_like((2, 3), 5)
    rc.manual_seed(5)
    g_mu, g_ls = _grads_of(rc.sample_normal, mu, ls)
    np.testing.assert_allclose(g_mu, np.ones((2, 3)))
    np.testing.assert_allclose(g_ls, (np.exp(0.3) * eps).sum(axis=1, keepdims=True), rtol=1e-12)


# Documented conventions at the points gradcheck avoids (hand-computed values).
def test_tie_and_kink_conventions():
    x = np.array([[1.0, 3.0], [3.0, 3.0], [2.0, 1.0]])
    np.testing.assert_array_equal(_grads_of(rc.max, x)[0], [[0, 1], [1, 0], [0, 0]])  # first maximum
    a, b = np.array([[1.0, 2.0, 3.0]]), np.array([[1.0, 0.0, 5.0]])
    ga, gb = _grads_of(rc.minimum, a, b)
    np.testing.assert_array_equal(ga, [[1, 0, 1]])  # ties go to a
    np.testing.assert_array_equal(gb, [[0, 1, 0]])
    ga, gb = _grads_of(rc.maximum, a, b)
    np.testing.assert_array_equal(ga, [[1, 1, 0]])
    np.testing.assert_array_equal(gb, [[0, 0, 1]])
    z = np.array([[0.0, -1.0, 2.0]])
    np.testing.assert_array_equal(_grads_of(rc.relu, z)[0], [[0, 0, 1]])
    np.testing.assert_array_equal(_grads_of(rc.abs, z)[0], [[0, -1, 1]])
    c = np.array([[-1.0, -0.5, 0.0, 0.5, 1.0]])
    np.testing.assert_array_equal(_grads_of(lambda p: rc.clamp(p, -0.5, 0.5), c)[0], [[0, 0, 1, 0, 0]])
    # PyTorch's: the negative slope at 0, and at NaN
    leaky = np.array([[0.0, -1.0, 2.0, np.nan]])
    np.testing.assert_array_equal(_grads_of(lambda p: rc.leaky_relu(p, 0.25), leaky)[0], [[0.25, 0.25, 1, 0.25]])


def test_nan_propagates_and_cast_to_i32_saturates():
    x = np.array([[np.nan, -1.0, 2.0]])
    np.testing.assert_array_equal(rc.relu(rc.tensor(x)).numpy(), np.maximum(x, 0))  # NaN stays NaN
    big = np.array([[np.nan, 1e20, -1e20, -2.7, 2.7]])
    np.testing.assert_array_equal(rc.cast(rc.tensor(big, dtype="f64"), "i32").numpy(),
                                  [[0, 2**31 - 1, -(2**31), -2, 2]])


@pytest.mark.parametrize("device", DEVICES)
def test_cast_with_a_scale_gives_the_bits_of_cast_then_scale(device):
    """Images: bytes (every value 0-255, an odd element count: the GPU reads u8 by 32-bit words)
    and i32 to f32 (and f64 on the CPU) times 1/255, bit for bit what cast then scale give."""
    images = np.random.default_rng(3).integers(0, 256, size=(7, 5, 3, 3)).astype(np.uint8)
    images.flat[:256] = np.arange(256)
    ints = np.array([[0, 1, -7, 255, 2**20, 2**24 + 1, -(2**31)]], np.int32)
    for values, kind in ((images, "u8"), (ints, "i32")):
        x = rc.tensor(values, dtype=kind, device=device)
        for dtype in ("f32", "f64") if device == "cpu" else ("f32",):
            fused = rc.cast(x, dtype, scale=1 / 255).numpy()
            np.testing.assert_array_equal(fused, rc.scale(rc.cast(x, dtype), 1 / 255).numpy())
            width = NP_DTYPE[dtype]
            np.testing.assert_array_equal(fused, values.astype(width) * width(1 / 255))


def test_cast_with_a_scale_from_floats_or_to_halves_is_a_type_error():
    with pytest.raises(TypeError, match=r"cast: a scale applies to casts from u8 or i32 to f32 or f64.*f32 to f64"):
        rc.cast(rc.tensor(np.ones((2, 2))), "f64", scale=0.5)
    with pytest.raises(TypeError, match=r"cast: a scale applies.*u8 to f16"):
        rc.cast(rc.tensor(np.ones((2, 2), np.uint8), dtype="u8"), "f16", scale=0.5)


@pytest.mark.parametrize("dtype", ["u8", "f16", "i32", "f64"])
def test_transpose_and_permute_move_every_element_size(device, dtype):
    """Layout ops copy elements of 1, 2, 4 and 8 bytes (one typed loop per size), at shapes that
    end tiles of 32 partway, in slices."""
    numpy_dtype = {"u8": np.uint8, "f16": np.float16, "i32": np.int32, "f64": np.float64}[dtype]
    if device == "gpu" and dtype in ("u8", "f64"):  # (a NativeTypeError there names what they take)
        pytest.skip("the GPU's u8 tensors take get_rows, reshape and a cast alone; f64 ones are CPU-only")
    rng = np.random.default_rng(3)
    for shape in ((33, 65), (1, 7), (70, 3, 5), (31, 45, 2, 3)):
        x = (rng.random(shape) * 200).astype(numpy_dtype)
        got = rc.transpose(rc.tensor(x, dtype=dtype)).numpy()
        assert got.dtype == numpy_dtype
        np.testing.assert_array_equal(got, np.swapaxes(x, 0, 1))
    x = (rng.random((5, 33, 3, 34)) * 200).astype(numpy_dtype)
    np.testing.assert_array_equal(rc.permute(rc.tensor(x, dtype=dtype), (1, 3, 0, 2)).numpy(), np.transpose(x, (1, 3, 0, 2)))


def test_get_rows_gradient_sums_repeated_indices():
    x = np.arange(6.0).reshape(2, 3)
    (g,) = _grads_of(lambda p: rc.get_rows(p, [2, 0, 2, 2]), x)
    np.testing.assert_array_equal(g, [[1, 0, 3], [1, 0, 3]])


def test_gradients_accumulate_through_shared_inputs():
    x = np.array([[0.5, -2.0]])
    (g,) = _grads_of(lambda p: rc.add(rc.mul(p, p), rc.scale(p, 3.0)), x)
    np.testing.assert_allclose(g, 2 * x + 3)


# ---- backward helper ops (their formulas, directly; test_op_table maps them to gradients) ----------

def _sig(x):
    return 1 / (1 + np.exp(-x))


BACKWARD_HELPERS = {
    "relu_back": (lambda g, x: g * (x > 0), AWAY),
    "sigmoid_back": (lambda g, y: g * y * (1 - y), lambda *s: U(0.05, 0.95, *s)),
    "tanh_back": (lambda g, y: g * (1 - y * y), lambda *s: U(-0.9, 0.9, *s)),
    "silu_back": (lambda g, x: g * _sig(x) * (1 + x * (1 - _sig(x))), N),
    "softmax_back": (lambda g, y: y * (g - (y * g).sum(axis=0, keepdims=True)), lambda *s: lambda r: np_softmax(r.normal(size=s))),
    "log_softmax_back": (lambda g, y: g - np.exp(y) * g.sum(axis=0, keepdims=True), lambda *s: lambda r: np_log_softmax(r.normal(size=s))),
}


@pytest.mark.parametrize("name", sorted(BACKWARD_HELPERS))
def test_backward_helper_formula(name):
    from rlkit.core import ops

    formula, gen = BACKWARD_HELPERS[name]
    r = _rng(name)
    g, v = r.normal(size=(3, 4)), gen(3, 4)(r)
    out = ops.apply(name, (_tensor(g, "f64"), _tensor(v, "f64")))
    np.testing.assert_allclose(out.numpy(), formula(g, v), rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match=rf"^{name}: .*\[3, 4\].*\[3, 1\]"):
        ops.apply(name, (_tensor(g, "f64"), _tensor(v[:, :1], "f64")))


def test_clamp_back_formula():
    from rlkit.core import ops

    g, x = np.array([[1.0, 2.0, 3.0, 4.0, 5.0]]), np.array([[-1.0, -0.5, 0.0, 0.5, 0.7]])
    out = ops.apply("clamp_back", (_tensor(g, "f64"), _tensor(x, "f64")), floats=(-0.5, 0.5))
    np.testing.assert_array_equal(out.numpy(), [[0, 0, 3, 0, 0]])


# ---- f16 and bf16 storage: computed in f32, rounded once -------------------------------------------

F16_CASES = ["add", "mul", "div", "maximum", "relu", "leaky_relu", "sigmoid", "tanh", "exp", "log", "sqrt", "silu", "softplus",
             "clamp", "matmul", "matmul_batched", "sum", "sum_dim0", "sum_to_rows", "softmax", "log_softmax", "max",
             "transpose", "concat_rows", "get_rows", "gather", "softmax_cross_entropy_loss", "conv2d", "max_pool2d"]


def _ordered(h: np.ndarray) -> np.ndarray:
    """f16 or bf16 bit patterns as integers ordered like the values (one step = one ulp)."""
    bits = h.view(np.int16).astype(np.int64)
    return np.where(bits < 0, -(bits & 0x7FFF), bits)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("case, k", [p for p in _params(CASES) if p.values[0].id in F16_CASES and p.values[1] < 2])
def test_half_storage(case: Case, k: int, dtype: str):
    half = NP_DTYPE[dtype]
    arrays = [a if _is_index(a) else a.astype(half) for a in _arrays(case, k)]
    out = case.fn(*[_tensor(a, dtype) for a in arrays])
    assert out.dtype == dtype
    with np.errstate(over="ignore"):
        expected = case.ref(*[a if _is_index(a) else a.astype(np.float32) for a in arrays]).astype(np.float32)
        expected = expected.astype(half)
    got = out.numpy()
    assert got.shape == expected.shape
    # the engine and numpy compute in float32 and round once: at most one ulp apart
    assert np.abs(_ordered(got) - _ordered(expected)).max() <= 1, (got, expected)


def test_f16_default_dtype():
    previous = rc.dtype("f16")
    try:
        t = rc.tensor(np.array([[1.0, 2.0], [3.0, 4.0]]))
        y = rc.sigmoid(t)
    finally:
        rc.dtype(previous)
    assert t.dtype == y.dtype == "f16"
    expected = (1 / (1 + np.exp(-np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)))).astype(np.float16)
    assert np.abs(_ordered(y.numpy()) - _ordered(expected)).max() <= 1


# ---- operators and reflected operands ---------------------------------------------------------------

def test_operators_with_numbers_and_arrays():
    a = np.array([[1.0, -2.0], [0.5, 4.0]])
    t = rc.tensor(a, dtype="f64")
    m = np.array([[2.0], [3.0]])
    for got, want in [
        (2.0 - t, 2.0 - a), (3.0 / t, 3.0 / a), (t * 2, a * 2), (m * t, m * a), (m - t, m - a),
        (t + m, a + m), (-t, -a), (t ** 2, a ** 2), (t @ t, a @ a), (t.T, a.T), (1.0 + t, 1.0 + a),
    ]:
        assert isinstance(got, rc.Tensor)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


def test_polyak_update_and_put_cols_write_in_place(device):
    """Against numpy: every pair's target moves tau of the way to its source, and put_cols
    writes columns in index order (a repeated index keeps the last value); neither returns."""
    rng = np.random.default_rng(0)
    targets = [rng.standard_normal((3, 4)), rng.standard_normal((5, 1))]
    sources = [rng.standard_normal((3, 4)), rng.standard_normal((5, 1))]
    t = [rc.param(a) for a in targets]
    assert rc.polyak_update(t, [rc.tensor(a) for a in sources], 0.25) is None
    for tensor, target, source in zip(t, targets, sources):
        np.testing.assert_allclose(tensor.numpy(), 0.25 * source + 0.75 * target, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="as many targets as sources"):
        rc.polyak_update(t, t[:1], 0.5)
    with pytest.raises(ValueError, match="tau"):
        rc.polyak_update(t, t, 1.5)
    x = rc.param(np.zeros((2, 4)))
    values = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert rc.put_cols(x, rc.tensor(np.array([[3, 0, 3]], np.int32)), rc.tensor(values)) is None
    np.testing.assert_array_equal(x.numpy(), [[2.0, 0.0, 0.0, 3.0], [5.0, 0.0, 0.0, 6.0]])
    with pytest.raises(IndexError):
        rc.put_cols(x, np.array([4], np.int32), rc.tensor(values[:, :1]))  # checked on the host


def test_where_keeps_nan_and_infinity_of_the_branch_not_taken_out(device):
    condition = rc.tensor(np.array([[1.0, 0.0, 1.0, 0.0]]))
    x = rc.tensor(np.array([[1.0, np.nan, np.inf, np.nan]]))
    y = rc.tensor(np.array([[np.nan, 2.0, np.nan, -np.inf]]))
    np.testing.assert_array_equal(rc.where(condition, x, y).numpy(), [[1.0, 2.0, np.inf, -np.inf]])
    w = rc.param(np.ones((1, 4)))
    with rc.grad_tape(), pytest.raises(ValueError, match="where: not differentiable"):
        rc.where(condition, w, y)


@pytest.mark.parametrize("wide", [True, False], ids=["avx2", "baseline"])
def test_exp_and_sigmoid_are_accurate_over_the_float_range(wide):
    """The CPU's float exp is a polynomial of its own (native/kernel_util.hpp, exp_of): within 2
    ulp of float64's exp rounded, across the range, the subnormal results included; inf from
    88.72284 up, 0 below the smallest subnormal, NaN for NaN, as numpy. sigmoid, built on it,
    within 4 ulp. Both builds of their loops: AVX2 with FMA (where the CPU has them) and the
    baseline's."""
    from rlkit import _native

    previous = _native.set_wide_elementwise(wide)
    try:
        _check_exp_and_sigmoid()
    finally:
        _native.set_wide_elementwise(previous)


def _unary_on_the_cpu(op, x: np.ndarray, wide: bool) -> np.ndarray:
    """op of the 1-D float32 array x on the CPU, its loop's AVX2 + FMA build on or off."""
    from rlkit import _native

    previous = _native.set_wide_elementwise(wide)
    try:
        return op(rc.tensor(x.reshape(-1, 1))).numpy().ravel()
    finally:
        _native.set_wide_elementwise(previous)


@pytest.mark.parametrize("wide", [True, False], ids=["avx2", "baseline"])
def test_tanh_is_accurate_over_the_float_range(wide):
    """The CPU's float tanh is built on exp_of's reduction (native/kernel_util.hpp, tanh_of):
    within 3 ulp of float64's tanh rounded across the range, tiny and subnormal inputs included
    (where tanh x = x), +-1 far out, the sign of zero kept, NaN for NaN; the fused linear's tanh
    the same function. Both builds of the loop."""
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-12.0, 12.0, 200_000), rng.uniform(-0.5, 0.5, 100_000),
                        rng.uniform(-1e-3, 1e-3, 20_000), np.linspace(-0.4, 0.4, 20_001), np.linspace(8.5, 10.5, 5_000),
                        [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-42, 0.3465736, 0.3465737, 9.01, 9.5, 20.0]])
    x = x.astype(np.float32)
    got = _unary_on_the_cpu(rc.tanh, x, wide)
    exact = np.tanh(x.astype(np.float64))
    rounded = exact.astype(np.float32)
    finite = np.isfinite(x)
    ulps = np.abs(got[finite] - exact[finite]) / np.spacing(np.abs(rounded[finite])).astype(np.float64)
    assert ulps.max() <= 3.0, (x[finite][ulps.argmax()], ulps.max())
    np.testing.assert_array_equal(np.signbit(got[finite]), np.signbit(x[finite]))
    np.testing.assert_array_equal(got[~finite], rounded[~finite])  # +-1 and NaN
    linear = rc.linear(rc.tensor(np.ones((1, 1), np.float32)), rc.tensor(x.reshape(1, -1)),
                       rc.tensor(np.zeros((1, 1), np.float32)), activation="tanh").numpy().ravel()
    np.testing.assert_allclose(linear[finite], exact[finite], rtol=4e-7, atol=0)


def _check_exp_and_sigmoid():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-110.0, 95.0, 200_000), rng.uniform(-1.0, 1.0, 100_000),
                        np.linspace(-104.5, -85.0, 20_000), np.linspace(87.0, 89.5, 10_000),
                        [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72283, 88.72284, -103.97, -103.98, 1e-30]])
    x = x.astype(np.float32)
    got = rc.exp(rc.tensor(x.reshape(-1, 1))).numpy().ravel()
    exact = np.exp(x.astype(np.float64))
    with np.errstate(over="ignore"):
        rounded = exact.astype(np.float32)
    finite = np.isfinite(rounded) & (rounded > 0)
    ulps = np.abs(got[finite] - exact[finite]) / np.spacing(rounded[finite]).astype(np.float64)
    assert ulps.max() <= 2.0, (x[finite][ulps.argmax()], ulps.max())
    np.testing.assert_array_equal(got[~finite], rounded[~finite])  # inf, 0 and NaN where numpy gives them

    s = rc.sigmoid(rc.tensor(x.reshape(-1, 1))).numpy().ravel()
    exact = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    rounded = exact.astype(np.float32)
    tiny = np.finfo(np.float32).tiny
    normal = np.isfinite(rounded) & (rounded >= tiny)
    ulps = np.abs(s[normal] - exact[normal]) / np.spacing(rounded[normal]).astype(np.float64)
    assert ulps.max() <= 4.0, (x[normal][ulps.argmax()], ulps.max())
    assert np.isnan(s[np.isnan(x)]).all() and (s[x == np.inf] == 1.0).all() and (s[x == -np.inf] == 0.0).all()


@pytest.mark.parametrize("wide", [True, False], ids=["avx2", "baseline"])
def test_softplus_is_accurate_over_the_float_range(wide):
    """The CPU's float softplus, max(x, 0) + log1p(exp(-|x|)), is built on exp_of and a log1p of
    its own (native/kernel_util.hpp, log1p_of; glibc's log1pf was a call per element): within 2
    ulp of float64's log(1 + e^x) rounded, from the arguments whose result underflows to 0 to
    those where it is x; inf for inf, 0 for -inf, NaN for NaN. Both builds of the loop."""
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.uniform(-110.0, 100.0, 200_000), rng.uniform(-20.0, 20.0, 200_000),
                        rng.uniform(-1.0, 1.0, 50_000), rng.uniform(-1e-3, 1e-3, 10_000), np.linspace(-0.6, 0.6, 20_001),
                        [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-42, 88.0, -88.0, -103.9, -104.5, 1e30, -1e30]])
    x = x.astype(np.float32)
    got = _unary_on_the_cpu(rc.softplus, x, wide)
    with np.errstate(invalid="ignore"):
        exact = np.logaddexp(0.0, x.astype(np.float64))
    rounded = exact.astype(np.float32)
    normal = np.isfinite(rounded) & (rounded != 0)
    ulps = np.abs(got[normal] - exact[normal]) / np.spacing(np.abs(rounded[normal])).astype(np.float64)
    assert ulps.max() <= 2.0, (x[normal][ulps.argmax()], ulps.max())
    np.testing.assert_array_equal(got[~normal], rounded[~normal])  # 0 far below, inf, NaN


@pytest.mark.parametrize("rows", [1, 7, 8, 9, 65, 400, 401])
@pytest.mark.parametrize("columns", [1, 3, 256])
def test_cpu_sum_to_over_columns_is_the_ordered_double_sum(rows, columns):
    """A bias gradient's sum_to on the CPU ([rows, columns] -> [rows, 1], and [rows, columns, 2] ->
    [rows, 1, 2] or [rows, 1, 1]) is each row's sum in float64 over its columns in order, rounded
    once: the same bits as that loop in numpy, NaN and infinities included, with 1, 2 and 3
    threads (the CPU kernel cuts the rows into blocks where there are few outputs)."""
    rng = np.random.default_rng(rows * 1000 + columns)
    x = (rng.standard_normal((rows, columns, 2)) * 10.0 ** rng.integers(-3, 4, (rows, columns, 2))).astype(np.float32)
    x[rows // 2, columns - 1, 0] = np.nan
    x[rows - 1, 0, 1] = np.inf
    cases = {(rows, 1): x[:, :, :1].reshape(rows, columns, 1), (rows, 1, 2): x, (rows, 1, 1): x}
    before = rc.get_num_threads()
    try:
        for out_shape, source in cases.items():
            flat = source.reshape(rows, -1, order="F")  # the columns in the kernel's order: dim 1, then dim 2
            groups = 2 if out_shape == (rows, 1, 2) else 1  # outputs along dim 2
            per_group = flat.shape[1] // groups
            expected = np.zeros((rows, groups))
            with np.errstate(invalid="ignore"):
                for g in range(groups):
                    for j in range(per_group):
                        expected[:, g] += flat[:, g * per_group + j].astype(np.float64)
            expected = expected.astype(np.float32).reshape(out_shape, order="F")
            tensor = rc.tensor(np.asfortranarray(source if len(out_shape) == 3 else source[:, :, 0]))
            for threads in (1, 2, 3):
                rc.set_num_threads(threads)
                got = rc.sum_to(tensor, out_shape).numpy()
                np.testing.assert_array_equal(got, expected, err_msg=f"{out_shape}, {threads} threads")
    finally:
        rc.set_num_threads(before)
