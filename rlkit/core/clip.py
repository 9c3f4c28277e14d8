"""Gradient clipping and the gradient anomaly check.

Each takes the parameters and the gradients of a backward pass (the mapping ``backward``
returns) or ``None`` for the parameters' accumulated ``.grad``. Clipping replaces the
gradients in that mapping, and in ``.grad`` where it holds the same values, so that
``optimizer.step(grads)`` and ``optimizer.step()`` both see the clipped values.
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np

from rlkit.core import ops
from rlkit.core.autograd import Gradients
from rlkit.core.tensor import Tensor


def _params(params, where: str) -> list[Tensor]:
    if isinstance(params, dict):
        params = list(params.values())
    if isinstance(params, Tensor):
        params = [params]
    params = list(params)
    for p in params:
        if not isinstance(p, Tensor):
            raise TypeError(f"{where}: expected parameters (Tensors), got {type(p).__name__}")
    return params


def _gradient(p: Tensor, grads: Gradients | None) -> Tensor | None:
    if grads is None:
        return p._grad
    if not isinstance(grads, Gradients):
        raise TypeError(f"expected the gradients backward() returned (or None), got {type(grads).__name__}")
    return grads.tensor(p) if p in grads else None


def _replace(p: Tensor, grads: Gradients | None, old: Tensor, new: Tensor) -> None:
    if grads is not None:
        grads._by_param[p] = new
    if p._grad is old:
        p._grad = new


def clip_grad_norm(params, grads: Gradients | None, max_norm: float) -> float:
    """Scales every gradient by max_norm / (norm + 1e-6) when their global L2 norm exceeds
    max_norm (directions are kept). Returns the norm before clipping."""
    if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real) or not max_norm > 0:
        raise ValueError(f"clip_grad_norm: max_norm must be a positive number, got {max_norm!r}")
    pairs = [(p, g) for p in _params(params, "clip_grad_norm") if (g := _gradient(p, grads)) is not None]
    total = math.sqrt(ops.sum_squares([g for _, g in pairs]).item()) if pairs else 0.0
    if total > max_norm:
        factor = max_norm / (total + 1e-6)
        for p, g in pairs:
            _replace(p, grads, g, ops.scale(g, factor))
    return total


def clip_grad_value(params, grads: Gradients | None, clip_value: float) -> float:
    """Clamps every gradient element into [-clip_value, clip_value]. Returns the largest
    finite |g| before clipping (0 when there is none)."""
    if isinstance(clip_value, bool) or not isinstance(clip_value, numbers.Real) or not (
        clip_value > 0 and math.isfinite(clip_value)
    ):
        raise ValueError(f"clip_grad_value: clip_value must be a positive finite number, got {clip_value!r}")
    largest = 0.0
    for p in _params(params, "clip_grad_value"):
        g = _gradient(p, grads)
        if g is None:
            continue
        values = np.abs(g.numpy())
        finite = values[np.isfinite(values)]
        if finite.size:
            largest = max(largest, float(finite.max()))
        _replace(p, grads, g, ops.clamp(g, -clip_value, clip_value))
    return largest


STATUSES = ("ok", "nan", "inf", "nan+inf", "large", "missing")


def check_grad_anomaly(params, grads: Gradients | None, action: str = "warn", max_abs: float | None = None) -> list[dict]:
    """One report row per parameter: name, n_nan, n_inf, max_abs (largest finite |g|) and a
    status of ok, nan, inf, nan+inf, large (max_abs given and exceeded) or missing (no
    gradient; counts are None). Anomalies (not ok or missing) warn (RuntimeWarning), raise
    (FloatingPointError) or pass silently, as ``action`` says."""
    if action not in ("warn", "stop", "silent"):
        raise ValueError(f"check_grad_anomaly: action must be 'warn', 'stop' or 'silent', got {action!r}")
    if max_abs is not None and (isinstance(max_abs, bool) or not isinstance(max_abs, numbers.Real) or max_abs < 0):
        raise ValueError(f"check_grad_anomaly: max_abs must be a non-negative number or None, got {max_abs!r}")
    report = []
    for index, p in enumerate(_params(params, "check_grad_anomaly")):
        name = p.name if p.name is not None else str(index)
        g = _gradient(p, grads)
        if g is None:
            report.append({"name": name, "n_nan": None, "n_inf": None, "max_abs": None, "status": "missing"})
            continue
        values = g.numpy()
        n_nan, n_inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
        finite = np.abs(values[np.isfinite(values)])
        largest = float(finite.max()) if finite.size else 0.0
        if n_nan and n_inf:
            status = "nan+inf"
        elif n_nan:
            status = "nan"
        elif n_inf:
            status = "inf"
        elif max_abs is not None and largest > max_abs:
            status = "large"
        else:
            status = "ok"
        report.append({"name": name, "n_nan": n_nan, "n_inf": n_inf, "max_abs": largest, "status": status})
    bad = [row for row in report if row["status"] not in ("ok", "missing")]
    if bad and action != "silent":
        lines = [f"gradient anomaly detected in {len(bad)} parameter(s):"] + [
            f"  {row['name']:<20} status={row['status']:<8} n_nan={row['n_nan']} n_inf={row['n_inf']} "
            f"max_abs={row['max_abs']:.3g}"
            for row in bad
        ]
        if action == "stop":
            raise FloatingPointError("\n".join(lines))
        warnings.warn("\n".join(lines), RuntimeWarning, stacklevel=2)
    return report
