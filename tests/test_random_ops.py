"""The op table's random and constant ops: distributions, reproducibility after
rc.manual_seed, independence from the thread count, and full's constants of every dtype.
(test_ops.py covers the rest of the table; these have no numpy reference to compare against.)"""

import math

import numpy as np
import pytest

import rlkit.core as rc
from op_references import np_softmax
from test_ops import NP_DTYPE

# ---- random ops --------------------------------------------------------------------------------------

def test_rand_distribution():
    rc.manual_seed(123)
    t = rc.rand((100, 200), dtype="f64")
    assert t.shape == (100, 200) and t.dtype == "f64"
    x = t.numpy()
    assert x.min() >= 0.0 and x.max() < 1.0
    n = x.size
    assert abs(x.mean() - 0.5) < 4 * math.sqrt(1 / 12 / n)
    assert abs(x.std() - math.sqrt(1 / 12)) < 0.005
    counts = np.histogram(x, bins=10, range=(0, 1))[0]
    chi2 = ((counts - n / 10) ** 2 / (n / 10)).sum()
    assert chi2 < 40, chi2  # 9 degrees of freedom: p < 1e-5
    # neighbouring elements are not correlated
    assert abs(np.corrcoef(x.ravel()[:-1], x.ravel()[1:])[0, 1]) < 4 / math.sqrt(n)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_rand_stays_below_one_in_narrow_dtypes(dtype):
    rc.manual_seed(1)
    x = rc.rand((300, 300), dtype=dtype).numpy()
    assert x.dtype == NP_DTYPE[dtype]
    assert x.min() >= 0 and x.max() < 1, x.max()
    assert abs(x.astype(np.float64).mean() - 0.5) < 0.005


def test_randn_distribution():
    rc.manual_seed(321)
    x = rc.randn((100, 200), dtype="f64").numpy()
    n = x.size
    assert abs(x.mean()) < 4 / math.sqrt(n)
    assert abs(x.std() - 1) < 0.02
    assert abs(np.mean(np.abs(x) < 1) - 0.6827) < 0.015
    assert abs(np.mean(x ** 4) - 3) < 0.2  # kurtosis of a normal
    assert abs(np.mean(x ** 3)) < 0.1


@pytest.mark.parametrize("op", ["rand", "randn"])
def test_random_reproducible_and_advancing(op):
    f = getattr(rc, op)
    rc.manual_seed(7)
    a, b = f((3, 5)).numpy(), f((3, 5)).numpy()
    rc.manual_seed(7)
    a2, b2 = f((3, 5)).numpy(), f((3, 5)).numpy()
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)
    assert not np.array_equal(a, b)  # every call draws a fresh stream
    rc.manual_seed(8)
    assert not np.array_equal(f((3, 5)).numpy(), a)
    assert f(4).shape == (4, 1) and f((2, 3, 2)).shape == (2, 3, 2)
    assert f((2, 2)).dtype == "f32" and f((2, 2), dtype="f16").dtype == "f16"


@pytest.mark.parametrize("op", ["rand", "randn"])
def test_random_values_do_not_depend_on_threads(op):
    before = rc.get_num_threads()
    try:
        rc.set_num_threads(1)
        rc.manual_seed(3)
        one = getattr(rc, op)((300, 200)).numpy()
        rc.set_num_threads(2)
        rc.manual_seed(3)
        two = getattr(rc, op)((300, 200)).numpy()
    finally:
        rc.set_num_threads(before)
    np.testing.assert_array_equal(one, two)


def test_randint_is_rand_times_high_cast_down(device):
    # the same stream as rand: floor(u * high) of the very uniforms rand draws, on either backend
    high = rc.full((1, 1), 1000.0, dtype="f32", device=device)
    rc.manual_seed(11)
    draws = rc.ops.randint(high, (1, 5000)).numpy()
    rc.manual_seed(11)
    uniforms = rc.rand((1, 5000), dtype="f32", device=device).numpy()
    assert draws.dtype == np.int32 and draws.shape == (1, 5000)
    np.testing.assert_array_equal(draws, np.floor(uniforms * np.float32(1000.0)).astype(np.int32))
    counts = np.bincount(draws.ravel() // 100, minlength=10)
    assert _chi2(counts, np.full(10, 0.1)) < 40  # 9 degrees of freedom: p < 1e-5


def test_randint_cpu_and_gpu_draw_the_same(on_gpu):
    rc.manual_seed(5)
    gpu = rc.ops.randint(rc.full((1, 1), 37.0, dtype="f32"), (3, 700)).numpy()
    rc.manual_seed(5)
    cpu = rc.ops.randint(rc.full((1, 1), 37.0, dtype="f32", device="cpu"), (3, 700)).numpy()
    np.testing.assert_array_equal(gpu, cpu)
    assert gpu.min() == 0 and gpu.max() == 36


@pytest.mark.parametrize("high, expected_max", [(1.0, 0), (0.5, 0), (-3.0, 0), (float("nan"), 0), (2.0**30, 2**30 - 1)])
def test_randint_stays_in_range_at_the_edges(device, high, expected_max):
    # below 1 (or NaN) every draw is 0; a huge bound still never reaches high
    draws = rc.ops.randint(rc.full((1, 1), high, dtype="f32", device=device), (64, 64)).numpy()
    assert draws.min() >= 0 and draws.max() <= expected_max
    if expected_max:
        assert draws.max() > expected_max // 2


def test_randint_in_a_capture_reads_its_bound_at_every_replay(device):
    captured = rc.capture(lambda high: rc.ops.randint(high, (1, 4000)))
    small = captured(high=np.array([[3.0]], np.float32))
    large = captured(high=np.array([[3000.0]], np.float32))
    assert captured.traces == 1
    assert set(np.unique(small)) == {0, 1, 2}
    assert large.max() > 2000 and large.min() >= 0 and large.max() < 3000
    assert rc.ops.randint(3, 4).shape == (4, 1)  # a number and a length, as rand takes them


def _chi2(counts, probs):
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_sample_categorical_frequencies():
    logits = np.array([[0.5], [-1.0], [2.0], [0.0]])
    n = 20000
    rc.manual_seed(99)
    s = rc.sample_categorical(rc.tensor(np.repeat(logits, n, axis=1))).numpy()
    assert s.shape == (1, n) and s.dtype == np.int32
    counts = np.bincount(s.ravel(), minlength=4)
    assert counts.size == 4
    assert _chi2(counts, np_softmax(logits).ravel()) < 25  # 3 degrees of freedom: p < 5e-5


def test_sample_categorical_per_column_logits():
    # columns alternate between two different distributions; each must follow its own
    groups = np.array([[3.0, -2.0], [0.0, 0.0], [-3.0, 1.0]])
    n = 6000
    logits = np.tile(groups, (1, n))
    rc.manual_seed(4)
    s = rc.sample_categorical(rc.tensor(logits, dtype="f64")).numpy().ravel()
    for g in range(2):
        counts = np.bincount(s[g::2], minlength=3)
        assert _chi2(counts, np_softmax(groups[:, g : g + 1]).ravel()) < 25


def test_sample_categorical_reproducible_and_certain():
    logits = rc.tensor(np.zeros((5, 50)))
    rc.manual_seed(12)
    a, b = rc.sample_categorical(logits).numpy(), rc.sample_categorical(logits).numpy()
    rc.manual_seed(12)
    np.testing.assert_array_equal(rc.sample_categorical(logits).numpy(), a)
    assert not np.array_equal(a, b)
    assert a.min() >= 0 and a.max() <= 4
    sure = np.full((3, 7), -1e4)
    sure[[2, 0, 1, 1, 0, 2, 2], np.arange(7)] = 0.0
    np.testing.assert_array_equal(rc.sample_categorical(rc.tensor(sure)).numpy(), [[2, 0, 1, 1, 0, 2, 2]])


def test_sample_normal_distribution():
    mu = np.array([[1.0], [-2.0]])
    log_std = np.array([[0.0], [np.log(0.5)]])
    n = 20000
    rc.manual_seed(31)
    x = rc.sample_normal(rc.tensor(np.repeat(mu, n, axis=1), dtype="f64"), rc.tensor(log_std, dtype="f64")).numpy()
    assert x.shape == (2, n)
    np.testing.assert_allclose(x.mean(axis=1), mu.ravel(), atol=4 / math.sqrt(n))
    np.testing.assert_allclose(x.std(axis=1), np.exp(log_std).ravel(), rtol=0.02)
    # a broadcast mu still draws independent noise for every element
    rc.manual_seed(31)
    y = rc.sample_normal(rc.tensor(mu, dtype="f64"), rc.tensor(np.zeros((2, n)), dtype="f64")).numpy()
    assert y.shape == (2, n)
    np.testing.assert_allclose(y.std(axis=1), [1.0, 1.0], rtol=0.02)


def test_arange_counts_on_the_device_and_inside_a_capture(device):
    np.testing.assert_array_equal(rc.arange(5).numpy(), np.arange(5, dtype=np.float32)[:, None])
    captured = rc.capture(lambda x: rc.add(x, rc.arange(3)))  # no host data: the trace holds it
    np.testing.assert_array_equal(captured(x=np.ones((3, 1))), [[1.0], [2.0], [3.0]])  # bad n: test_ops.py's table


def test_full_makes_constants_of_every_dtype():
    for dtype, np_dtype in (("f32", np.float32), ("f64", np.float64), ("f16", np.float16), ("i32", np.int32),
                            ("u8", np.uint8)):
        value = 7 if dtype in ("i32", "u8") else 2.5
        t = rc.full((3, 2), value, dtype=dtype)
        assert t.dtype == dtype and t.shape == (3, 2)
        np.testing.assert_array_equal(t.numpy(), np.full((3, 2), value, dtype=np_dtype))
    assert rc.full(4, -1.0).shape == (4, 1)
    np.testing.assert_array_equal(rc.zeros((2, 2, 3)).numpy(), np.zeros((2, 2, 3)))
    np.testing.assert_array_equal(rc.ones((2, 3)).numpy(), np.ones((2, 3)))
    with pytest.raises(ValueError, match="full: shape"):
        rc.full((0, 2), 1.0)
    with pytest.raises(TypeError, match="full: value"):
        rc.full((2, 2), "1")
    with pytest.raises(ValueError, match="full: unknown dtype"):
        rc.full((2, 2), 1.0, dtype="u16")
