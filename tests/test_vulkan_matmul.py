"""GPU matmul and linear kernels against the CPU backend at sizes that are not multiples of any
tile (edges, k remainders), with transposes, batch broadcasting and the LINEAR epilogue; each
kernel variant (16 x 16, 64 x 64 and 128 x 128 f32 SIMT tiles, the 16 x 16 tiles with their
reduction split into slices summed afterwards, and f16 and bf16 cooperative matrices where the
device has them) is reached, and the choice reported by rlkit.

Lavapipe (CI) has no cooperative matrices: there f16 and bf16 operands are widened to the f32
kernels, and the cooperative-matrix kernel is exercised on a GPU that lists them (the H200; bf16
where the build's shader compiler knows GL_EXT_bfloat16).
"""

import os

import ml_dtypes
import numpy as np
import pytest

import rlkit.core as rc
from rlkit import _native
from rlkit.cli import info_lines

pytestmark = pytest.mark.requires_gpu

# (m, n, k): one element; primes around the 16, 64 and 128 tiles and the 16 / 32 k slices; exact
# tiles; multiples of 8 that the f16 kernel reads in 16-byte chunks. Their outputs are small: the
# f32 ones take the 16 x 16 tiles.
SHAPES = [(1, 1, 1), (17, 33, 65), (100, 257, 31), (129, 130, 257), (64, 64, 64), (136, 24, 40), (5, 200, 1)]
TRANSPOSES = [(False, False), (True, False), (False, True), (True, True)]
# m, n, k whose output has enough 64 x 64 tiles for the middle kernel, and enough 128 x 128 tiles
# for the large-tile kernel
MEDIUM = (401, 331, 70)
LARGE = (1409, 1500, 37)


@pytest.fixture
def poisoned_gpu_memory():
    """Poisons new GPU memory (NaN) for the test, so that unwritten output elements show."""
    _native.set_gpu_poison(True)
    yield
    _native.set_gpu_poison(False)


def _operands(m, n, k, ta, tb, dtype, seed, batch_a=(), batch_b=()):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(((k, m) if ta else (m, k)) + batch_a).astype(dtype)
    b = rng.standard_normal(((n, k) if tb else (k, n)) + batch_b).astype(dtype)
    return a, b


def _matmul_on(device, a, b, ta, tb, dtype):
    ta_t = rc.tensor(np.asfortranarray(a), dtype=dtype, device=device)
    tb_t = rc.tensor(np.asfortranarray(b), dtype=dtype, device=device)
    out = rc.matmul(ta_t, tb_t, transpose_a=ta, transpose_b=tb)
    assert out.device == device and out.dtype == dtype
    return out.numpy()


def _linear_on(device, w, x, bias, activation, dtype):
    args = [rc.tensor(np.asfortranarray(v), dtype=dtype, device=device) for v in (w, x, bias)]
    out = rc.linear(*args, activation=activation)
    assert out.device == device and out.dtype == dtype
    return out.numpy()


NP_HALF = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


def _assert_half_close(got, expected):
    # the CPU rounds an f32 sum once to f16 (bf16); the GPU sums in another order, so the rounded
    # results may differ by an ulp or two (relative 2^-10, bf16 2^-7), never by a lost or doubled
    # product
    assert got.dtype == expected.dtype
    tolerance = 5e-3 if got.dtype == np.float16 else 3e-2
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("ta, tb", TRANSPOSES)
def test_f32_matmul_matches_cpu(m, n, k, ta, tb, poisoned_gpu_memory):
    a, b = _operands(m, n, k, ta, tb, np.float32, seed=m + n + k)
    expected = _matmul_on("cpu", a, b, ta, tb, "f32")
    np.testing.assert_allclose(_matmul_on("gpu", a, b, ta, tb, "f32"), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ta, tb", TRANSPOSES)
@pytest.mark.parametrize("shape, tile", [(SHAPES[3], "16x16"), (MEDIUM, "64x64"), (LARGE, "128x128")])
def test_f32_matmul_each_tile_size_matches_cpu(shape, tile, ta, tb, poisoned_gpu_memory):
    m, n, k = shape
    assert tile in _native.gpu_matmul_kernel("f32", m, n)
    a, b = _operands(m, n, k, ta, tb, np.float32, seed=3)
    expected = _matmul_on("cpu", a, b, ta, tb, "f32")
    np.testing.assert_allclose(_matmul_on("gpu", a, b, ta, tb, "f32"), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_batched_matmul_broadcasts_like_the_cpu(dtype, poisoned_gpu_memory):
    # a has 3 slices along dim 2, b 2 along dim 3: the output has 3 x 2 slices
    a, b = _operands(19, 45, 70, False, True, NP_HALF.get(dtype, np.float32), seed=8,
                     batch_a=(3, 1), batch_b=(1, 2))
    expected = _matmul_on("cpu", a, b, False, True, dtype)
    got = _matmul_on("gpu", a, b, False, True, dtype)
    assert got.shape == (19, 45, 3, 2)
    if dtype in NP_HALF:
        _assert_half_close(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, n, k", SHAPES + [(264, 136, 48), (136, 17, 40), (272, 264, 200)])
@pytest.mark.parametrize("ta, tb", TRANSPOSES)
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_matmul_matches_cpu(m, n, k, ta, tb, dtype, poisoned_gpu_memory):
    a, b = _operands(m, n, k, ta, tb, NP_HALF[dtype], seed=m * n + k)
    _assert_half_close(_matmul_on("gpu", a, b, ta, tb, dtype), _matmul_on("cpu", a, b, ta, tb, dtype))


@pytest.mark.parametrize("activation", [None, "relu", "tanh", "sigmoid"])
@pytest.mark.parametrize("out_features, in_features, n",
                         [(1, 1, 1), (33, 65, 17), (130, 31, 257), (MEDIUM[0], MEDIUM[2], MEDIUM[1]),
                          (LARGE[0], LARGE[2], LARGE[1])])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_linear_matches_cpu(activation, out_features, in_features, n, dtype, poisoned_gpu_memory):
    rng = np.random.default_rng(out_features + n)
    np_dtype = NP_HALF.get(dtype, np.float32)
    w = rng.standard_normal((out_features, in_features)).astype(np_dtype)
    x = rng.standard_normal((in_features, n)).astype(np_dtype)
    bias = rng.standard_normal((out_features, 1)).astype(np_dtype)
    expected = _linear_on("cpu", w, x, bias, activation, dtype)
    got = _linear_on("gpu", w, x, bias, activation, dtype)
    if dtype in NP_HALF:
        _assert_half_close(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


# Products large enough for the cooperative-matrix kernel to read an operand whose k is not
# contiguous (A untransposed, B transposed) from a k-contiguous copy (coopmat_transpose.comp): both
# sides past 512 and m n k past 2^30, no side a multiple of the copy's 64 x 64 tiles or the
# product's 128 x 256 ones; even sides (copied two halves a word) and odd ones (one at a time).
COPIED = [(1030, 1100, 1000), (1031, 1101, 1001)]


def _assert_copy_reported(dtype: str, m: int, n: int, k: int) -> None:
    """The kernel named for this shape says it reads a k-contiguous copy; skips where the device
    has no cooperative matrices (lavapipe: f16 and bf16 are widened to the f32 kernels, which the
    tests above cover at their sizes, and no copy is made)."""
    kernel = _native.gpu_matmul_kernel(dtype, m, n, k=k)
    if "cooperative" not in kernel:
        pytest.skip(f"{dtype} runs on {kernel}: no k-contiguous copies on this device")
    assert "k-contiguous copy" in kernel, kernel


@pytest.mark.parametrize("m, n, k", COPIED)
@pytest.mark.parametrize("ta, tb", TRANSPOSES)
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_large_half_products_read_k_contiguous_copies(m, n, k, ta, tb, dtype, poisoned_gpu_memory):
    _assert_copy_reported(dtype, m, n, k)
    a, b = _operands(m, n, k, ta, tb, NP_HALF[dtype], seed=5)
    _assert_half_close(_matmul_on("gpu", a, b, ta, tb, dtype), _matmul_on("cpu", a, b, ta, tb, dtype))


@pytest.mark.parametrize("out_features, n, in_features", COPIED)
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_large_half_linear_reads_a_copy_of_its_weight(out_features, n, in_features, dtype, poisoned_gpu_memory):
    _assert_copy_reported(dtype, out_features, n, in_features)
    rng = np.random.default_rng(9)
    w, x, bias = (rng.standard_normal(shape).astype(NP_HALF[dtype])
                  for shape in ((out_features, in_features), (in_features, n), (out_features, 1)))
    _assert_half_close(_linear_on("gpu", w, x, bias, "relu", dtype), _linear_on("cpu", w, x, bias, "relu", dtype))


# (m, n, k, batch) whose 16 x 16 tiles are few over a long k: the reduction is cut into slices
# (NatureCNN's 3136 x 512 layer at batch 32; a 4-action head over 1100 features; a batched
# product with a last, shorter slice)
SPLIT_SHAPES = [(512, 32, 3136, ()), (4, 32, 1100, ()), (37, 19, 1201, (3,))]


@pytest.mark.parametrize("m, n, k, batch", SPLIT_SHAPES)
@pytest.mark.parametrize("ta, tb", TRANSPOSES)
def test_split_reductions_match_cpu(m, n, k, batch, ta, tb, poisoned_gpu_memory):
    assert "k split in" in _native.gpu_matmul_kernel("f32", m, n, batch=int(np.prod(batch)), k=k)
    a, b = _operands(m, n, k, ta, tb, np.float32, seed=k, batch_a=batch, batch_b=batch)
    expected = _matmul_on("cpu", a, b, ta, tb, "f32")
    np.testing.assert_allclose(_matmul_on("gpu", a, b, ta, tb, "f32"), expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("activation", [None, "relu", "tanh"])
def test_split_linear_applies_its_epilogue_after_the_sum(activation, poisoned_gpu_memory):
    # each slice's partial output holds no bias and no activation: only their sum does
    rng = np.random.default_rng(11)
    w, x = rng.standard_normal((512, 3136)).astype(np.float32), rng.random((3136, 32)).astype(np.float32)
    bias = rng.standard_normal((512, 1)).astype(np.float32) * 5
    x[:, 3] = np.nan  # a NaN input gives NaN outputs through the split sum and the activation
    expected, got = _linear_on("cpu", w, x, bias, activation, "f32"), _linear_on("gpu", w, x, bias, activation, "f32")
    assert np.isnan(got[:, 3]).all() and np.isnan(expected[:, 3]).all()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)


def test_few_tiles_over_a_long_reduction_take_the_small_tiles():
    # 49 tiles of 64 x 64, each over k = 512: 392 tiles of 16 x 16 instead (not split: enough of them)
    kernel = _native.gpu_matmul_kernel("f32", 3136, 32, k=512)
    assert "16x16" in kernel and "split" not in kernel
    assert "64x64" in _native.gpu_matmul_kernel("f32", 3136, 32, k=256)  # a short reduction keeps them
    with pytest.raises(ValueError, match="must be >= 1"):
        _native.gpu_matmul_kernel("f32", 4, 4, k=0)


def test_more_batched_products_than_one_dispatch_runs(poisoned_gpu_memory):
    # a dispatch counts at most 65535 batch slices (NVIDIA's and lavapipe's limit): more go in
    # several dispatches, each from its own slice on (the last one short); B broadcast along the
    # batch. About 15 s on lavapipe, a workgroup per slice.
    m, k, n, batch = 2, 3, 2, 65537
    rng = np.random.default_rng(batch)
    a = rng.standard_normal((k, m, batch)).astype(np.float32)
    b = rng.standard_normal((k, n, 1)).astype(np.float32)
    got = rc.matmul(rc.tensor(a, device="gpu"), rc.tensor(b, device="gpu"), transpose_a=True).numpy()
    expected = np.einsum("kib,kj->ijb", a.astype(np.float64), b[:, :, 0])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_a_batch_past_one_dispatch_along_two_dims_is_refused():
    a = rc.tensor(np.ones((2, 3, 300, 300), np.float32), device="gpu")
    b = rc.tensor(np.ones((3, 2, 300, 300), np.float32), device="gpu")
    with pytest.raises(ValueError, match="90000 batched products along dims 2 and 3"):
        rc.matmul(a, b)


def test_a_batch_of_small_products_takes_tiles_it_fills():
    # a chunked recurrence's products: 16384 chunks of [16, 64] @ [64, 16] and [64, 64] @ [64, 16]
    assert "16x16" in _native.gpu_matmul_kernel("f32", 16, 16, k=64, batch=16384)
    assert "16x16" in _native.gpu_matmul_kernel("f32", 64, 16, k=64, batch=16384)
    assert "64x64" in _native.gpu_matmul_kernel("f32", 64, 64, k=16, batch=16384)
    assert "128x128" in _native.gpu_matmul_kernel("f32", 100, 128, batch=256)  # padded to at most twice


def test_the_kernel_choice_is_reported():
    # f32 operands never go to cooperative matrices (they take no f32 inputs): f32 stays exact
    for n in (1, 256, 4096):
        assert _native.gpu_matmul_kernel("f32", n, n).startswith("f32 SIMT")
    assert "16x16" in _native.gpu_matmul_kernel("f32", 256, 64)  # a hidden layer at batch 64
    assert "64x64" in _native.gpu_matmul_kernel("f32", 400, 400)
    assert "128x128" in _native.gpu_matmul_kernel("f32", 4096, 4096)
    assert "128x128" in _native.gpu_matmul_kernel("f32", 512, 512, batch=16)  # batch slices fill the GPU too
    lines = info_lines()
    assert any(line.startswith("gpu matmul f32: ") and "SIMT" in line for line in lines)
    for dtype in ("f16", "bf16"):
        kernel = _native.gpu_matmul_kernel(dtype, 4096, 4096)
        assert (kernel.startswith("cooperative matrices") and f"16x16x16 {dtype} fragments" in kernel
                or kernel.endswith(f"({dtype} operands widened to f32)")), kernel
        assert any(line.startswith(f"gpu matmul {dtype}: ") and kernel in line for line in lines)
    if os.environ.get("RLKIT_EXPECT_BF16_COOPMAT") == "1":  # set where the device and the build have them
        assert _native.gpu_matmul_kernel("bf16", 4096, 4096).startswith("cooperative matrices")
    with pytest.raises(TypeError, match="dtype must be 'f32', 'f16' or 'bf16'"):
        _native.gpu_matmul_kernel("i32", 4, 4)
    with pytest.raises(ValueError, match="must be >= 1"):
        _native.gpu_matmul_kernel("f32", 0, 4)
