"""Gradient clipping and the anomaly check against numpy and hand-computed values."""

import warnings

import numpy as np
import pytest

import rlkit.core as rc
from rlkit.core.clip import check_grad_anomaly, clip_grad_norm, clip_grad_value


def _grads_of(loss_fn, params):
    with rc.grad_tape():
        loss = loss_fn()
    return rc.backward(loss)


@pytest.fixture
def two_params():
    rng = np.random.default_rng(0)
    W = rc.param(rng.standard_normal((3, 4)), name="W")
    b = rc.param(rng.standard_normal((3, 1)), name="b")
    x = rc.tensor(rng.standard_normal((4, 5)))
    grads = _grads_of(lambda: rc.sum(rc.square(W @ x + b)) * 10.0, [W, b])
    return W, b, grads


def test_clip_grad_norm_scales_all_gradients_by_one_factor(two_params):
    W, b, grads = two_params
    gW, gb = grads[W].copy(), grads[b].copy()
    norm = np.sqrt((gW**2).sum() + (gb**2).sum())
    returned = clip_grad_norm([W, b], grads, max_norm=1.0)
    assert returned == pytest.approx(norm, rel=1e-5)
    factor = 1.0 / (norm + 1e-6)
    np.testing.assert_allclose(grads[W], gW * factor, rtol=1e-5)
    np.testing.assert_allclose(grads["b"], gb * factor, rtol=1e-5)
    np.testing.assert_allclose(W.grad, gW * factor, rtol=1e-5)  # .grad held the same values
    new_norm = np.sqrt((grads[W] ** 2).sum() + (grads[b] ** 2).sum())
    assert new_norm == pytest.approx(1.0, rel=1e-4)


def test_clip_grad_norm_leaves_small_gradients(two_params):
    W, b, grads = two_params
    gW = grads[W].copy()
    clip_grad_norm([W, b], grads, max_norm=1e9)
    np.testing.assert_array_equal(grads[W], gW)


def test_clip_grad_value_clamps_each_element(two_params):
    W, b, grads = two_params
    gW, gb = grads[W].copy(), grads[b].copy()
    largest = clip_grad_value([W, b], grads, clip_value=0.5)
    assert largest == pytest.approx(max(np.abs(gW).max(), np.abs(gb).max()), rel=1e-6)
    np.testing.assert_allclose(grads[W], np.clip(gW, -0.5, 0.5))
    assert grads[b].shape == gb.shape


def test_clipping_uses_dot_grad_when_no_mapping_is_given(two_params):
    W, b, _ = two_params
    gW = W.grad.copy()
    clip_grad_value([W, b], None, clip_value=0.1)
    np.testing.assert_allclose(W.grad, np.clip(gW, -0.1, 0.1))


def test_optimizer_steps_with_clipped_gradients(two_params):
    W, b, grads = two_params
    w0 = W.numpy()
    clip_grad_value([W, b], grads, clip_value=1e-3)
    opt = rc.optim.SGD([W, b], lr=1.0)
    opt.step(grads)
    assert np.abs(W.numpy() - w0).max() <= 1e-3 + 1e-7


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "1", None])
def test_clip_rejects_bad_limits(two_params, bad):
    W, b, grads = two_params
    with pytest.raises(ValueError, match="clip_grad_norm"):
        clip_grad_norm([W, b], grads, bad)
    with pytest.raises(ValueError, match="clip_grad_value"):
        clip_grad_value([W, b], grads, bad)


def test_anomaly_report_statuses():
    ok = rc.param(np.ones((2, 1)), name="ok")
    nan = rc.param(np.ones((2, 1)), name="nan")
    inf = rc.param(np.ones((2, 1)), name="inf")
    both = rc.param(np.ones((3, 1)), name="both")
    missing = rc.param(np.ones((2, 1)), name="missing")
    ok.grad = np.array([[0.5], [-2.0]])
    nan.grad = np.array([[np.nan], [1.0]])
    inf.grad = np.array([[np.inf], [1.0]])
    both.grad = np.array([[np.nan], [-np.inf], [3.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = check_grad_anomaly([ok, missing], None)
    assert [r["status"] for r in rows] == ["ok", "missing"]
    assert rows[0] == {"name": "ok", "n_nan": 0, "n_inf": 0, "max_abs": 2.0, "status": "ok"}
    assert rows[1]["n_nan"] is None
    with pytest.warns(RuntimeWarning, match="anomaly detected in 3"):
        rows = check_grad_anomaly([ok, nan, inf, both], None)
    assert [r["status"] for r in rows] == ["ok", "nan", "inf", "nan+inf"]
    assert rows[3]["n_nan"] == 1 and rows[3]["n_inf"] == 1 and rows[3]["max_abs"] == 3.0
    with pytest.raises(FloatingPointError, match="anomaly"):
        check_grad_anomaly([nan], None, action="stop")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_grad_anomaly([nan], None, action="silent")[0]["status"] == "nan"
    with pytest.warns(RuntimeWarning):
        assert check_grad_anomaly([ok], None, max_abs=1.0)[0]["status"] == "large"


def test_anomaly_bad_arguments():
    p = rc.param(np.ones((2, 1)))
    with pytest.raises(ValueError, match="action"):
        check_grad_anomaly([p], None, action="explode")
    with pytest.raises(ValueError, match="max_abs"):
        check_grad_anomaly([p], None, max_abs=-1)
    with pytest.raises(TypeError, match="check_grad_anomaly"):
        check_grad_anomaly(["W"], None)
    with pytest.raises(TypeError, match="gradients"):
        check_grad_anomaly([p], {"W": 1})
