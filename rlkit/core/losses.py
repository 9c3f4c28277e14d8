"""Losses: each returns a [1, 1] tensor, averaged as noted.

Targets may be tensors or numpy arrays (taken as constants); shapes must match the prediction
exactly, since a silent broadcast of [n, 1] against [1, n] is a classic source of wrong losses.
"""

from __future__ import annotations

import numbers

import numpy as np

from rlkit.core import ops
from rlkit.core.tensor import Tensor


def _pred_target(pred, target, name: str) -> tuple[Tensor, Tensor]:
    pred = ops.as_tensor(pred, op=name, arg="pred")
    target = ops.as_tensor(target, like=pred, op=name, arg="target")
    if pred.dtype == "i32" or target.dtype != pred.dtype:
        raise TypeError(f"{name}: pred and target must have the same float dtype, got {pred.dtype} and {target.dtype}")
    if pred.shape != target.shape:
        raise ValueError(f"{name}: pred {pred.shape} and target {target.shape} must have the same shape")
    return pred, target


def mse_loss(pred, target) -> Tensor:
    """Mean over all elements of (pred - target)^2."""
    pred, target = _pred_target(pred, target, "mse_loss")
    return ops.mean(ops.square(ops.sub(pred, target)))


def huber_loss(pred, target, delta: float = 1.0, reduction: str = "mean") -> Tensor:
    """Mean over all elements of 0.5 d^2 where |d| <= delta, else delta (|d| - delta / 2),
    with d = pred - target (PyTorch's smooth L1 at delta = 1); with ``reduction="none"`` the
    elementwise terms, shaped like pred (to weight them, as prioritized replay does)."""
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not delta > 0:
        raise ValueError(f"huber_loss: delta must be a positive number, got {delta!r}")
    if reduction not in ("mean", "none"):
        raise ValueError(f"huber_loss: reduction must be 'mean' or 'none', got {reduction!r}")
    pred, target = _pred_target(pred, target, "huber_loss")
    delta = float(delta)
    # one elementwise op, whose gradient is clamp(d, -delta, delta): a short chain forward and back
    terms = ops.apply("huber", (ops.sub(pred, target),), floats=(delta,), delta=delta)
    return terms if reduction == "none" else ops.mean(terms)


def cross_entropy_loss(probs, target) -> Tensor:
    """-sum(target * log(probs)) / batch for probabilities [classes, batch]; probs are
    clamped to [1e-7, 1 - 1e-7] first."""
    probs, target = _pred_target(probs, target, "cross_entropy_loss")
    log_p = ops.log(ops.clamp(probs, 1e-7, 1.0 - 1e-7))
    return ops.scale(ops.sum(ops.mul(target, log_p)), -1.0 / probs.shape[1])


def softmax_cross_entropy_loss(logits, target) -> Tensor:
    """Cross-entropy of softmax(logits) against target, averaged over the batch, in one fused,
    stable op. ``target`` is [classes, batch] probabilities (one-hot or soft) or 0-based class
    indices, one per column (an i32 tensor or an integer array)."""
    logits = ops.as_tensor(logits, op="softmax_cross_entropy_loss", arg="logits")
    if logits.dtype == "i32":
        raise TypeError("softmax_cross_entropy_loss: logits must be a float tensor (f32, f16, bf16 or f64), got i32")
    is_index = (isinstance(target, Tensor) and target.dtype == "i32") or (
        isinstance(target, (np.ndarray, list, tuple)) and np.asarray(target).dtype.kind in "iu"
    )
    if is_index:
        n_index = target.numel if isinstance(target, Tensor) else np.asarray(target).size
        if n_index != logits.shape[1]:
            raise ValueError(
                f"softmax_cross_entropy_loss: {n_index} class indices for {logits.shape[1]} columns of logits"
            )
        target = ops.reshape(ops.one_hot(target, logits.shape[0], dtype=logits.dtype, device=logits.device), logits.shape)
    logits, target = _pred_target(logits, target, "softmax_cross_entropy_loss")
    return ops.apply("softmax_cross_entropy", (logits, target))
