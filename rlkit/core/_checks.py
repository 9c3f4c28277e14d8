"""Argument checks shared by the core, the buffers and the agents, so that one kind of bad input
gets one kind of message everywhere."""

from __future__ import annotations

import numbers


def positive_int(value, what: str) -> int:
    """``value`` as an int, or a ValueError naming ``what`` when it is not an int >= 1 (bools are
    refused: ``True`` is an Integral but never a meant size)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return int(value)
