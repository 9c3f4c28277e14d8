"""Learning-rate schedules: each a pure function of the step, behind a thin object.

A scheduler object remembers only how many times ``step()`` was called; ``step()`` computes
the rate for that count with the schedule's function and writes it into the optimizer
(``optimizer.lr``; OneCycleLR also sets SGD's momentum or Adam's beta1). Call ``step()`` once
per epoch or per batch, after ``optimizer.step()``. Formulas and their conformance values
follow ggmlR (reference/ggmlR.md section 4); steps are counted from 1.
"""

from __future__ import annotations

import math
import numbers


def _check_int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _check_number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


# ---- the schedules, as pure functions of the step ----------------------------------------

def step_lr(step: int, base_lr: float, step_size: int, gamma: float) -> float:
    """base_lr * gamma ** (step // step_size)."""
    return base_lr * gamma ** (step // step_size)


def cosine_lr(step: int, lr_max: float, T_max: int, lr_min: float = 0.0, restart: bool = False,
              T_mult: float = 1.0) -> float:
    """Cosine annealing from lr_max (at step 1) towards lr_min over T_max steps.

    Without restart the position stops at T_max - 1 (so lr_min itself is never reached and
    the rate then holds); with restart each cycle is T_mult times longer than the last.
    """
    position, period = step - 1, T_max
    if not restart:
        position = min(position, T_max - 1)
    else:
        while position >= period:
            position -= period
            period = max(1, round(period * T_mult))
    return lr_min + 0.5 * (lr_max - lr_min) * (1 + math.cos(math.pi * position / period))


def _anneal(start: float, end: float, fraction: float, strategy: str) -> float:
    if strategy == "cos":
        return end + (start - end) * (1 + math.cos(math.pi * fraction)) / 2
    return start + (end - start) * fraction


def one_cycle(step: int, max_lr: float, total_steps: int, pct_start: float = 0.3, div_factor: float = 25.0,
              final_div_factor: float = 1e4, anneal: str = "cos", base_momentum: float = 0.85,
              max_momentum: float = 0.95) -> tuple[float, float]:
    """(lr, momentum) of the 1cycle policy: lr rises from max_lr / div_factor to max_lr over
    pct_start of the steps, then falls to max_lr / final_div_factor; momentum moves inversely.
    Steps past total_steps hold the last value."""
    initial_lr, final_lr = max_lr / div_factor, max_lr / final_div_factor
    step_up = max(1, round(pct_start * total_steps))
    s = min(step, total_steps)
    if s <= step_up:
        fraction = s / step_up
        return (_anneal(initial_lr, max_lr, fraction, anneal),
                _anneal(max_momentum, base_momentum, fraction, anneal))
    fraction = min(1.0, (s - step_up) / max(1, total_steps - step_up))
    return _anneal(max_lr, final_lr, fraction, anneal), _anneal(base_momentum, max_momentum, fraction, anneal)


def cyclic_lr(step: int, base_lr: float, max_lr: float, step_size_up: int, step_size_down: int,
              mode: str = "triangular", gamma: float = 1.0) -> float:
    """Triangular cycles between base_lr and max_lr; triangular2 halves the amplitude every
    cycle, exp_range scales it by gamma ** step."""
    total = step_size_up + step_size_down
    cycle = step // total
    position = step - cycle * total
    if position <= step_size_up:
        fraction = position / step_size_up
    else:
        fraction = 1 - (position - step_size_up) / step_size_down
    amplitude = max_lr - base_lr
    if mode == "triangular2":
        amplitude /= 2**cycle
    elif mode == "exp_range":
        amplitude *= gamma**step
    return base_lr + amplitude * fraction


def warmup_cosine(step: int, lr_max: float, warmup_steps: int, total_steps: int, lr_min: float = 0.0,
                  warmup_start_lr: float = 0.0) -> float:
    """Linear warmup from warmup_start_lr to lr_max over warmup_steps, then cosine decay to
    lr_min at total_steps (held afterwards)."""
    s = min(step, total_steps)
    if s <= warmup_steps:
        return warmup_start_lr + (lr_max - warmup_start_lr) * s / warmup_steps
    fraction = (s - warmup_steps) / (total_steps - warmup_steps)
    return lr_min + 0.5 * (lr_max - lr_min) * (1 + math.cos(math.pi * fraction))


# ---- the thin objects --------------------------------------------------------------------

class LRScheduler:
    """Counts ``step()`` calls and writes the schedule's rate into the optimizer."""

    def __init__(self, optimizer):
        if not hasattr(optimizer, "lr"):
            raise TypeError(f"a scheduler needs an optimizer with an lr, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.last_step = 0

    def lr_at(self, step: int) -> float:
        """The rate after ``step`` calls of step()."""
        raise NotImplementedError

    def step(self) -> float:
        """Advances one step; sets and returns the new learning rate."""
        self.last_step += 1
        lr = self.lr_at(self.last_step)
        self.optimizer.lr = lr
        return lr

    def get_lr(self) -> float:
        """The optimizer's current learning rate."""
        return self.optimizer.lr

    def state_dict(self) -> dict:
        """The step count (the schedule's settings come from its constructor)."""
        return {"last_step": self.last_step}

    def load_state_dict(self, state: dict) -> None:
        """Restores the step count and the rate that goes with it."""
        self.last_step = _check_int(state["last_step"], "last_step", 0)
        if self.last_step > 0:
            self.optimizer.lr = self.lr_at(self.last_step)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(step={self.last_step}, lr={self.get_lr():.6g})"


class StepLR(LRScheduler):
    """Multiplies the rate by gamma every step_size steps."""

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1):
        super().__init__(optimizer)
        self.step_size = _check_int(step_size, "StepLR: step_size", 1)
        self.gamma = _check_number(gamma, "StepLR: gamma")
        self.base_lr = optimizer.lr

    def lr_at(self, step: int) -> float:
        return step_lr(step, self.base_lr, self.step_size, self.gamma)


class CosineLR(LRScheduler):
    """Cosine annealing from the optimizer's rate to lr_min over T_max steps; with restart,
    warm restarts whose cycles grow by T_mult (SGDR)."""

    def __init__(self, optimizer, T_max: int, lr_min: float = 0.0, restart: bool = False, T_mult: float = 1):
        super().__init__(optimizer)
        self.T_max = _check_int(T_max, "CosineLR: T_max", 1)
        self.lr_min = _check_number(lr_min, "CosineLR: lr_min")
        if _check_number(T_mult, "CosineLR: T_mult") < 1:
            raise ValueError(f"CosineLR: T_mult must be >= 1, got {T_mult!r}")
        self.T_mult = float(T_mult)
        self.restart = bool(restart)
        self.lr_max = optimizer.lr

    def lr_at(self, step: int) -> float:
        return cosine_lr(step, self.lr_max, self.T_max, self.lr_min, self.restart, self.T_mult)


def _momentum_field(optimizer) -> str | None:
    """Which optimizer setting 1cycle moves inversely: SGD's momentum or Adam's beta1."""
    if hasattr(optimizer, "betas"):
        return "beta1"
    if hasattr(optimizer, "momentum"):
        return "momentum"
    return None


def _set_momentum(optimizer, field: str, value: float) -> None:
    if field == "beta1":
        optimizer.betas = (value, optimizer.betas[1])
    else:
        optimizer.momentum = value


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith, 2018); sets lr = max_lr / div_factor (and the momentum to
    max_momentum) at construction. Call per batch; total_steps is the number of calls."""

    def __init__(self, optimizer, max_lr: float, total_steps: int, pct_start: float = 0.3,
                 div_factor: float = 25.0, final_div_factor: float = 1e4, anneal: str = "cos",
                 cycle_momentum: bool = True, base_momentum: float = 0.85, max_momentum: float = 0.95):
        super().__init__(optimizer)
        self.max_lr = _check_number(max_lr, "OneCycleLR: max_lr")
        self.total_steps = _check_int(total_steps, "OneCycleLR: total_steps", 2)
        if not 0 < pct_start < 1:
            raise ValueError(f"OneCycleLR: pct_start must lie in (0, 1), got {pct_start!r}")
        if anneal not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal must be 'cos' or 'linear', got {anneal!r}")
        self.pct_start, self.anneal = float(pct_start), anneal
        self.div_factor = _check_number(div_factor, "OneCycleLR: div_factor")
        self.final_div_factor = _check_number(final_div_factor, "OneCycleLR: final_div_factor")
        self.base_momentum = _check_number(base_momentum, "OneCycleLR: base_momentum")
        self.max_momentum = _check_number(max_momentum, "OneCycleLR: max_momentum")
        self.momentum_field = _momentum_field(optimizer) if cycle_momentum else None
        optimizer.lr = self.max_lr / self.div_factor
        if self.momentum_field:
            _set_momentum(optimizer, self.momentum_field, self.max_momentum)

    def schedule_at(self, step: int) -> tuple[float, float]:
        """(lr, momentum) after ``step`` calls."""
        return one_cycle(step, self.max_lr, self.total_steps, self.pct_start, self.div_factor,
                         self.final_div_factor, self.anneal, self.base_momentum, self.max_momentum)

    def lr_at(self, step: int) -> float:
        return self.schedule_at(step)[0]

    def step(self) -> float:
        lr = super().step()
        if self.momentum_field:
            _set_momentum(self.optimizer, self.momentum_field, self.schedule_at(self.last_step)[1])
        return lr


class CyclicLR(LRScheduler):
    """Cyclical learning rates (Smith, 2017) between base_lr and max_lr; sets lr = base_lr at
    construction. Call per batch."""

    def __init__(self, optimizer, base_lr: float, max_lr: float, step_size_up: int = 2000,
                 step_size_down: int | None = None, mode: str = "triangular", gamma: float = 1.0):
        super().__init__(optimizer)
        self.base_lr = _check_number(base_lr, "CyclicLR: base_lr")
        self.max_lr = _check_number(max_lr, "CyclicLR: max_lr")
        if self.max_lr < self.base_lr:
            raise ValueError(f"CyclicLR: max_lr ({max_lr}) must be >= base_lr ({base_lr})")
        self.step_size_up = _check_int(step_size_up, "CyclicLR: step_size_up", 1)
        self.step_size_down = _check_int(
            self.step_size_up if step_size_down is None else step_size_down, "CyclicLR: step_size_down", 1
        )
        if mode not in ("triangular", "triangular2", "exp_range"):
            raise ValueError(f"CyclicLR: mode must be triangular, triangular2 or exp_range, got {mode!r}")
        self.mode = mode
        self.gamma = _check_number(gamma, "CyclicLR: gamma")
        optimizer.lr = self.base_lr

    def lr_at(self, step: int) -> float:
        return cyclic_lr(step, self.base_lr, self.max_lr, self.step_size_up, self.step_size_down, self.mode,
                         self.gamma)


class WarmupCosineLR(LRScheduler):
    """Linear warmup to the optimizer's rate over warmup_steps, then cosine decay to lr_min at
    total_steps; sets lr = warmup_start_lr at construction when there is a warmup."""

    def __init__(self, optimizer, warmup_steps: int, total_steps: int, lr_min: float = 0.0,
                 warmup_start_lr: float = 0.0):
        super().__init__(optimizer)
        self.warmup_steps = _check_int(warmup_steps, "WarmupCosineLR: warmup_steps", 0)
        self.total_steps = _check_int(total_steps, "WarmupCosineLR: total_steps", 1)
        if self.total_steps <= self.warmup_steps:
            raise ValueError(
                f"WarmupCosineLR: total_steps ({total_steps}) must exceed warmup_steps ({warmup_steps})"
            )
        self.lr_min = _check_number(lr_min, "WarmupCosineLR: lr_min")
        self.warmup_start_lr = _check_number(warmup_start_lr, "WarmupCosineLR: warmup_start_lr")
        self.lr_max = optimizer.lr
        if self.warmup_steps > 0:
            optimizer.lr = self.warmup_start_lr

    def lr_at(self, step: int) -> float:
        return warmup_cosine(step, self.lr_max, self.warmup_steps, self.total_steps, self.lr_min,
                             self.warmup_start_lr)
