"""Finite-difference gradient checks."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rlkit.core import autograd, ops, tape
from rlkit.core.tensor import Tensor, param


class GradcheckError(AssertionError):
    """Raised by :func:`gradcheck` when an analytic gradient disagrees with finite differences."""


def _loss_value(fn, params) -> float:
    with tape.no_grad():
        out = fn(*params)
    return float(np.asarray(out.numpy(), dtype=np.float64).sum())


def gradcheck(
    fn: Callable[..., Tensor],
    inputs: Sequence,
    eps: float | None = None,
    atol: float | None = None,
    rtol: float = 1e-3,
) -> bool:
    """Checks the gradients of ``fn(*inputs)`` (summed to a scalar) against central differences.

    Every float input becomes a parameter of its own dtype. With f64 inputs (numpy float64
    arrays) the defaults are tight (eps 1e-6, atol 1e-5); when any input is f32 or f16 they
    are loosened to what single precision can resolve (eps 1e-3, atol 1e-2). Returns True, or
    raises GradcheckError naming the input and the worst element.
    """
    if not callable(fn):
        raise TypeError(f"gradcheck: fn must be callable, got {type(fn).__name__}")
    params = [x if isinstance(x, Tensor) and x.dtype == "i32" else param(x, dtype=_dtype_of(x)) for x in inputs]
    narrow = any(p.dtype in ("f32", "f16", "bf16") for p in params)
    eps = eps if eps is not None else (1e-3 if narrow else 1e-6)
    atol = atol if atol is not None else (1e-2 if narrow else 1e-5)
    with tape.grad_tape():
        out = fn(*params)
        loss = ops.sum(out)
    grads = autograd.backward(loss)
    for k, p in enumerate(params):
        if not p.requires_grad:
            continue
        analytic = grads[p] if p in grads else np.zeros(p.shape)
        numeric = _numeric_gradient(fn, params, k, eps)
        err = np.abs(analytic - numeric)
        bound = atol + rtol * np.abs(numeric)
        # a non-finite numeric gradient (fn undefined within eps) checks nothing: not a pass
        if np.any(err > bound) or not np.all(np.isfinite(analytic)) or not np.all(np.isfinite(numeric)):
            worst = np.unravel_index(np.argmax(err - bound), err.shape)
            raise GradcheckError(
                f"gradcheck: input {k} {p.shape}: analytic {analytic[worst]:.6g} vs numeric "
                f"{numeric[worst]:.6g} at {tuple(int(i) for i in worst)} (max abs error {err.max():.3g})"
            )
    return True


def _dtype_of(x) -> str | None:
    if isinstance(x, Tensor):
        return x.dtype
    arr = np.asarray(x)
    return "f64" if arr.dtype == np.float64 else None


def _numeric_gradient(fn, params, k: int, eps: float) -> np.ndarray:
    target = params[k]
    storage_dtype = target.numpy().dtype
    base = target.numpy().astype(np.float64)
    grad = np.zeros_like(base)
    flat, gflat = base.reshape(-1, order="F"), grad.reshape(-1, order="F")  # views, column-major
    for i in range(flat.size):
        original = flat[i]
        values = []
        for shifted in (original + eps, original - eps):
            flat[i] = shifted
            target._impl.write(base.astype(storage_dtype, order="F"))
            values.append(_loss_value(fn, params))
        flat[i] = original
        gflat[i] = (values[0] - values[1]) / (2 * eps)
    target._impl.write(base.astype(storage_dtype, order="F"))
    return grad
