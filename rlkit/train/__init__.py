"""The supervised trainer: fit / evaluate / predict, callbacks, checkpoints, TensorBoard."""

from rlkit.train.trainer import (
    METRICS, Callback, EarlyStopping, ModelCheckpoint, SchedulerStep, Trainer, accuracy,
)

__all__ = ["Trainer", "Callback", "EarlyStopping", "ModelCheckpoint", "SchedulerStep", "accuracy", "METRICS"]
