"""The CPU's skinny products (native/skinny_product.cpp: AVX2 + FMA kernels for a C of at most 32
rows or columns, or a depth of at most 8, where the BLAS packed its wide operand for a few lines
of work): the float64 product at awkward sizes of each kernel (depth, few rows along the depth or
across columns, few columns written transposed, 8-row groups with a remainder, vector tails),
each transposition, in blocks of rows and of columns, NaN and infinities where numpy's float64
product has them, the same bits with 1, 2 and 3 threads; and the same results through the BLAS
(skinny products off), the path they replace."""

import numpy as np
import pytest

import rlkit.core as rc
from rlkit import _native


@pytest.fixture(params=["skinny", "blas"])
def cpu_products(request):
    """The CPU's products with the skinny kernels (where the CPU has AVX2 and FMA) and without."""
    previous = _native.set_skinny_products(request.param == "skinny")
    yield request.param
    _native.set_skinny_products(previous)


# (m, k, n): C [m, n] of depth k
SHAPES = [
    # depth at most 8: 1 and 8 deep, rows with a vector tail, one row block or several (256 rows a pack)
    (256, 6, 256), (300, 6, 256), (37, 1, 5), (261, 8, 3), (600, 3, 40), (9, 7, 1000),
    # few rows: 1-8 rows, 8-row groups with a remainder (23 = 8 + 8 + 7), depth tails, the deepest
    (6, 256, 256), (6, 300, 256), (1, 9, 70), (2, 31, 3), (5, 17, 33), (8, 1024, 12), (23, 256, 256),
    (32, 100, 40), (12, 9, 1),
    # few columns (C^T's rows): SAC's and TD3's first weight gradients, and odd ones
    (256, 256, 23), (400, 256, 23), (400, 256, 17), (100, 13, 7), (33, 1000, 32), (70, 9, 2),
    # not skinny, beside them: the BLAS either way
    (33, 9, 33), (8, 1025, 64),
]


def _operands(m, k, n, ta, tb, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    return a, b


def _product(a, b, ta, tb, device="cpu"):
    return rc.matmul(rc.tensor(np.asfortranarray(a), device=device), rc.tensor(np.asfortranarray(b), device=device),
                     transpose_a=ta, transpose_b=tb).numpy()


def _reference(a, b, ta, tb):
    with np.errstate(invalid="ignore", over="ignore"):
        return (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_skinny_products_equal_the_float64_product(cpu_products, shape, ta, tb):
    m, k, n = shape
    a, b = _operands(m, k, n, ta, tb, seed=m * 7 + k * 3 + n)
    got = _product(a, b, ta, tb)
    assert got.shape == (m, n)
    np.testing.assert_allclose(got, _reference(a, b, ta, tb), rtol=1e-5, atol=2e-6 * np.sqrt(k))


@pytest.mark.parametrize("shape", [(256, 6, 256), (6, 256, 256), (23, 256, 256), (400, 256, 23), (9, 7, 1000)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("ta, tb", [(False, False), (True, True)])
def test_skinny_products_propagate_nan_and_infinities(cpu_products, shape, ta, tb):
    m, k, n = shape
    a, b = _operands(m, k, n, ta, tb, seed=3)
    op_a = a.T if ta else a  # views: writing them writes a and b
    op_b = b.T if tb else b
    op_a[m // 2, k - 1] = np.nan  # row m // 2 of C is NaN
    op_b[0, n - 1] = np.inf  # column n - 1 is +-inf, or NaN where it meets the NaN row or a zero
    op_a[m - 1, 0] = 0.0  # 0 * inf: NaN at C[m - 1, n - 1]
    got, expected = _product(a, b, ta, tb), _reference(a, b, ta, tb)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(expected))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-5, atol=2e-6 * np.sqrt(k))


@pytest.mark.parametrize("shape", [(256, 6, 256), (300, 8, 61), (6, 256, 256), (6, 256, 301), (23, 256, 256),
                                   (400, 256, 23), (401, 256, 17), (19, 5, 300)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True)])
def test_skinny_products_do_not_depend_on_the_thread_count(cpu_products, shape, ta, tb):
    """The pool cuts C into other blocks with each thread count (of rows where C has few columns,
    of columns otherwise): every element is computed alike in any block."""
    m, k, n = shape
    a, b = _operands(m, k, n, ta, tb, seed=m + n)
    before = rc.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            rc.set_num_threads(threads)
            results.append(_product(a, b, ta, tb))
    finally:
        rc.set_num_threads(before)
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])


def test_a_linear_head_and_its_gradients_match_with_and_without_skinny_products():
    """SAC's Gaussian head on a batch (a [6, 256] output from 256 deep, its 6-deep input gradient
    and its weight gradient, all skinny): values and gradients within float32 rounding of the
    BLAS's."""
    rng = np.random.default_rng(5)
    w_np = (rng.standard_normal((6, 256)) / 16).astype(np.float32)
    x_np = rng.standard_normal((256, 256)).astype(np.float32)
    bias_np = rng.standard_normal((6, 1)).astype(np.float32)
    results = {}
    for skinny in (True, False):
        previous = _native.set_skinny_products(skinny)
        try:
            w, x, bias = (rc.param(v) for v in (w_np, x_np, bias_np))
            with rc.grad_tape():
                y = rc.linear(w, x, bias, activation="tanh")
                loss = rc.sum(rc.square(y))
            grads = rc.backward(loss)
            results[skinny] = [y.numpy()] + [grads.tensor(t).numpy() for t in (w, x, bias)]
        finally:
            _native.set_skinny_products(previous)
    for got, expected in zip(results[True], results[False]):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
