"""LR schedules: the conformance values of ggmlR's scheduler tests (reference/ggmlR.md section 4),
the closed forms written out here, and bad input."""

import math

import numpy as np
import pytest

import rlkit.core as rc
from rlkit.core import sched


def _opt(kind="adam", lr=1e-3):
    p = rc.param(np.zeros((2, 1)))
    return rc.optim.SGD([p], lr=lr) if kind == "sgd" else rc.optim.Adam([p], lr=lr)


def _run(scheduler, n):
    return np.array([scheduler.step() for _ in range(n)])


def test_step_lr_multiplies_every_step_size():
    opt = _opt(lr=0.1)
    lrs = _run(sched.StepLR(opt, step_size=3, gamma=0.5), 7)
    np.testing.assert_allclose(lrs, [0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025])
    assert opt.lr == pytest.approx(0.025)


def test_cosine_without_restart_decreases_then_holds():
    opt = _opt(lr=0.1)
    lrs = _run(sched.CosineLR(opt, T_max=6, lr_min=0.01), 8)
    assert lrs[0] == pytest.approx(0.1)  # the first step gives lr_max
    assert np.all(np.diff(lrs[:6]) < 0)
    assert lrs[6] == lrs[5] == lrs[7]
    expected = 0.01 + 0.5 * 0.09 * (1 + math.cos(math.pi * 5 / 6))
    assert lrs[5] == pytest.approx(expected)


def test_cosine_restart_period_repeats_exactly():
    lrs = _run(sched.CosineLR(_opt(lr=0.1), T_max=4, lr_min=0.0, restart=True), 12)
    np.testing.assert_array_equal(lrs[:4], lrs[4:8])
    np.testing.assert_array_equal(lrs[:4], lrs[8:12])


def test_cosine_restart_with_t_mult_doubles_each_cycle():
    lrs = _run(sched.CosineLR(_opt(lr=0.1), T_max=4, lr_min=0.0, restart=True, T_mult=2), 28)
    restarts = [i + 1 for i, lr in enumerate(lrs) if lr == pytest.approx(0.1)]
    assert restarts == [1, 5, 13]  # cycles of 4, 8, 16
    for start, length in ((0, 4), (4, 8), (12, 16)):
        assert np.all(np.diff(lrs[start:start + length]) < 0)


def test_onecycle_conformance_sgd_momentum():
    opt = _opt("sgd", lr=0.5)
    s = sched.OneCycleLR(opt, max_lr=0.1, total_steps=100)
    assert opt.lr == pytest.approx(0.1 / 25)
    assert opt.momentum == pytest.approx(0.95)
    lrs, moms = [], []
    for _ in range(100):
        lrs.append(s.step())
        moms.append(opt.momentum)
    lrs = np.array(lrs)
    assert lrs.max() == pytest.approx(0.1) and int(np.argmax(lrs)) == 29  # peak at step 30
    assert np.all(np.diff(lrs[:30]) > 0) and np.all(np.diff(lrs[29:]) < 0)
    assert lrs[99] == pytest.approx(0.1 / 1e4)
    assert min(moms) == pytest.approx(0.85) and max(moms) <= 0.95 + 1e-12
    assert s.step() == pytest.approx(lrs[99])  # past total_steps the rate holds


def test_onecycle_moves_adam_beta1_and_linear_peaks():
    opt = _opt("adam")
    s = sched.OneCycleLR(opt, max_lr=0.1, total_steps=100, anneal="linear")
    assert opt.betas[0] == pytest.approx(0.95)
    lrs = _run(s, 100)
    assert opt.betas[0] > 0.85
    assert lrs.max() == pytest.approx(0.1)
    assert lrs[9] == pytest.approx(0.004 + (0.1 - 0.004) * 10 / 30)  # linear ramp, by hand


def test_onecycle_without_momentum_cycling_leaves_momentum():
    opt = _opt("sgd")
    opt.momentum = 0.5
    _run(sched.OneCycleLR(opt, max_lr=0.1, total_steps=10, cycle_momentum=False), 10)
    assert opt.momentum == 0.5


def test_cyclic_triangular_and_triangular2():
    opt = _opt(lr=0.3)
    s = sched.CyclicLR(opt, base_lr=0.0, max_lr=1.0, step_size_up=4)
    assert opt.lr == 0.0
    lrs = _run(s, 8)
    assert lrs[3] == 1.0 and lrs[7] == 0.0
    assert np.all(np.diff(lrs[:4]) > 0) and np.all(np.diff(lrs[3:8]) < 0)
    lrs2 = _run(sched.CyclicLR(_opt(), base_lr=0.0, max_lr=1.0, step_size_up=4, mode="triangular2"), 12)
    assert lrs2[3] == 1.0 and lrs2[11] == 0.5


def test_cyclic_exp_range_and_bounds():
    lrs = _run(sched.CyclicLR(_opt(), base_lr=0.001, max_lr=0.01, step_size_up=5), 30)
    assert np.all((lrs >= 0.001 - 1e-12) & (lrs <= 0.01 + 1e-12))
    lrs = _run(sched.CyclicLR(_opt(), base_lr=0.0, max_lr=1.0, step_size_up=2, mode="exp_range", gamma=0.9), 6)
    expected = [((s % 4) / 2 if s % 4 <= 2 else 1 - (s % 4 - 2) / 2) * 0.9**s for s in range(1, 7)]
    np.testing.assert_allclose(lrs, expected)


def test_warmup_cosine_conformance():
    opt = _opt(lr=1e-3)
    s = sched.WarmupCosineLR(opt, warmup_steps=10, total_steps=100)
    assert opt.lr == 0.0
    lrs = _run(s, 100)
    assert lrs[9] == pytest.approx(1e-3)
    assert np.all(np.diff(lrs[:10]) > 0) and np.all(np.diff(lrs[9:]) < 0)
    assert lrs[99] == pytest.approx(0.0, abs=1e-15)
    opt = _opt(lr=1e-3)
    sched.WarmupCosineLR(opt, warmup_steps=10, total_steps=100, warmup_start_lr=1e-5)
    assert opt.lr == 1e-5


def test_warmup_cosine_without_warmup_and_lr_min():
    opt = _opt(lr=0.1)
    s = sched.WarmupCosineLR(opt, warmup_steps=0, total_steps=20, lr_min=0.01)
    assert opt.lr == 0.1
    lrs = _run(s, 20)
    assert np.all(np.diff(lrs) < 0)
    assert lrs[19] == pytest.approx(0.01)


def test_state_dict_round_trip_restores_the_rate():
    opt = _opt(lr=0.1)
    s = sched.CosineLR(opt, T_max=10)
    _run(s, 4)
    state = s.state_dict()
    opt2 = _opt(lr=0.1)
    s2 = sched.CosineLR(opt2, T_max=10)
    s2.load_state_dict(state)
    assert opt2.lr == opt.lr
    assert s2.step() == s.step()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda o: sched.StepLR(o, step_size=0), "step_size"),
        (lambda o: sched.CosineLR(o, T_max=0), "T_max"),
        (lambda o: sched.CosineLR(o, T_max=4, T_mult=0.5), "T_mult"),
        (lambda o: sched.OneCycleLR(o, max_lr=0.1, total_steps=1), "total_steps"),
        (lambda o: sched.OneCycleLR(o, max_lr=0.1, total_steps=10, pct_start=0), "pct_start"),
        (lambda o: sched.OneCycleLR(o, max_lr=0.1, total_steps=10, pct_start=1), "pct_start"),
        (lambda o: sched.CyclicLR(o, base_lr=0.1, max_lr=0.01), "max_lr"),
        (lambda o: sched.CyclicLR(o, base_lr=0.0, max_lr=1.0, step_size_up=0), "step_size_up"),
        (lambda o: sched.CyclicLR(o, base_lr=0.0, max_lr=1.0, mode="sine"), "mode"),
        (lambda o: sched.WarmupCosineLR(o, warmup_steps=-1, total_steps=10), "warmup_steps"),
        (lambda o: sched.WarmupCosineLR(o, warmup_steps=10, total_steps=10), "total_steps"),
        (lambda o: sched.StepLR(o, step_size="3"), "step_size"),
    ],
)
def test_bad_settings_raise_clear_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make(_opt())


def test_scheduler_needs_an_optimizer():
    with pytest.raises(TypeError, match="optimizer"):
        sched.StepLR(object(), step_size=2)
