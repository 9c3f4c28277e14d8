"""The checks of the agents' configs: number ranges, and the fields every off-policy config has."""

from __future__ import annotations

import math

from rlkit.core._checks import number_in_range, positive_int


def check_in_range(config, name: str, low: float, high: float, low_open: bool = False) -> None:
    """``config.name`` is a number in [low, high] (or (low, high] when ``low_open``)."""
    number_in_range(getattr(config, name), f"{type(config).__name__}: {name}", low, high, low_open)


def check_positive_number(config, name: str) -> None:
    """``config.name`` is a finite number > 0."""
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise ValueError(f"{type(config).__name__}: {name} must be a positive number, got {value!r}")


def check_common_fields(config) -> None:
    """The checks every off-policy config shares: counts, rates, the discount, tau and the
    network widths."""
    prefix = type(config).__name__
    for name in ("buffer_size", "batch_size", "train_freq", "gradient_steps", "log_interval", "n_envs"):
        positive_int(getattr(config, name), f"{prefix}: {name}")
    starts = config.learning_starts
    if isinstance(starts, bool) or not isinstance(starts, int) or starts < 0:
        raise ValueError(f"{prefix}: learning_starts must be an int >= 0, got {starts!r}")
    check_positive_number(config, "learning_rate")
    check_in_range(config, "gamma", 0.0, 1.0)
    check_in_range(config, "tau", 0.0, 1.0, low_open=True)
    for width in config.net_arch:
        positive_int(width, f"{prefix}: each net_arch width")
