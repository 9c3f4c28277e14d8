"""Argument checks shared by the core, the buffers and the agents, so that one kind of bad input
gets one kind of message everywhere."""

from __future__ import annotations

import math
import numbers

import numpy as np

_INTEGER_RANGES = {"i32": (-2**31, 2**31 - 1), "u8": (0, 255)}  # what an integer dtype holds
_INTEGER_NUMPY = {"i32": np.dtype(np.int32), "u8": np.dtype(np.uint8)}


def positive_int(value, what: str) -> int:
    """``value`` as an int, or a ValueError naming ``what`` when it is not an int >= 1 (bools are
    refused: ``True`` is an Integral but never a meant size)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return int(value)


def number_in_range(value, what: str, low: float, high: float, low_open: bool = False) -> float:
    """``value`` as a float, or a ValueError naming ``what`` and the interval unless it is a
    finite real number in [low, high] ((low, high] when ``low_open``; ``high`` may be inf, for
    no upper bound). NaN lies in no interval; bools are refused."""
    inside = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and (
        low < value <= high if low_open else low <= value <= high)
    if not inside:
        interval = ("(" if low_open else "[") + f"{low}, " + (f"{high}]" if math.isfinite(high) else "inf)")
        raise ValueError(f"{what} must lie in {interval}, got {value!r}")
    return float(value)


def check_index_values(index: np.ndarray, op: str, limit: int | None = None, what: str = "") -> None:
    """The checks of a host integer index array (0-based): not empty, within 32 bits, and, when
    ``limit`` >= 1 is given, inside [0, limit) (an IndexError naming the first index outside,
    its position in Fortran order and the valid range). Eager ops run it on the arrays they are
    given; a captured function runs it on its index inputs before every replay."""
    if index.size == 0:
        raise ValueError(f"{op}: index is empty (shape {index.shape})")
    lowest, highest = index.min(), index.max()
    if highest > np.iinfo(np.int32).max or lowest < np.iinfo(np.int32).min:
        raise IndexError(f"{op}: index values must fit in 32 bits")
    if limit is not None and limit >= 1 and (lowest < 0 or highest >= limit):
        flat = index.reshape(-1, order="F")
        j = int(np.flatnonzero((flat < 0) | (flat >= limit))[0])
        raise IndexError(f"{op}: index {int(flat[j])} at position {j} is out of range for {limit} {what} "
                         f"(valid: 0..{limit - 1})")


def check_integer_values(values, dtype: str, what: str) -> None:
    """A ValueError naming ``what`` unless every value (of an array or a number) converts to the
    integer dtype ``dtype`` ("i32" or "u8") unchanged: a whole number inside its range. NaN,
    Inf, fractions and values that would wrap or saturate are refused rather than stored as
    another number (numpy's casting="same_value" rule); other dtypes, and data that is not
    numbers (for the caller to refuse), are not checked."""
    if dtype not in _INTEGER_RANGES:
        return
    arr = np.asarray(values)
    if arr.size == 0 or arr.dtype == _INTEGER_NUMPY[dtype] or arr.dtype.kind not in "iufV":  # V: bf16
        return
    lo, hi = _INTEGER_RANGES[dtype]
    if arr.dtype.kind in "iu":
        if lo <= arr.min() and arr.max() <= hi:
            return
        bad = (arr < lo) | (arr > hi)
    else:  # floats (a NaN fails the comparisons)
        wide = arr.astype(np.float64)
        if lo <= wide.min() and wide.max() <= hi and np.array_equal(np.trunc(wide), wide):
            return
        with np.errstate(invalid="ignore"):
            bad = ~((lo <= wide) & (wide <= hi) & (np.trunc(wide) == wide))
    j = int(np.flatnonzero(bad.reshape(-1, order="F"))[0])
    value = arr.reshape(-1, order="F")[j]
    value = int(value) if arr.dtype.kind in "iu" else float(value)
    where = f" at position {j}" if arr.size > 1 else ""
    raise ValueError(f"{what}: value {value!r}{where} does not convert to {dtype} "
                     f"(whole numbers from {lo} to {hi})")
