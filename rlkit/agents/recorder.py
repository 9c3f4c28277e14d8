"""``agent.logger``: Stable-Baselines3's logger surface (``record``, ``record_mean``, ``dump``)
over the run's TensorBoard writer, so that a callback written for SB3 logs its own values the
same way: what is recorded is written at the next dump, which the agent does at every log write
(and EvalCallback after each evaluation)."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlkit.logger import SummaryWriter


def _excluded(exclude: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """SB3's ``exclude``: output formats a value is not written to ("tensorboard", "stdout", ...)."""
    if exclude is None:
        return ()
    return (exclude,) if isinstance(exclude, str) else tuple(exclude)


class Recorder:
    """Values recorded by key until the next ``dump``, then written as TensorBoard scalars at
    that step (where the agent has a logdir; without one a dump only clears them)."""

    def __init__(self) -> None:
        self.name_to_value: dict[str, object] = {}
        """The values recorded since the last dump, by key (SB3's attribute)."""
        self.name_to_excluded: dict[str, tuple[str, ...]] = {}
        self._mean_counts: dict[str, int] = {}
        self.writer: SummaryWriter | None = None
        """The writer of the learn call in progress (None between calls, or without a logdir)."""

    def record(self, key: str, value, exclude: str | tuple[str, ...] | None = None) -> None:
        """Keeps ``value`` under ``key`` for the next dump (a later record replaces it). Numbers
        reach TensorBoard; other values are kept but not written (rlkit writes only scalars)."""
        self.name_to_value[key] = value
        self.name_to_excluded[key] = _excluded(exclude)
        self._mean_counts.pop(key, None)

    def record_mean(self, key: str, value: float, exclude: str | tuple[str, ...] | None = None) -> None:
        """Keeps the running mean of the values recorded under ``key`` since the last dump."""
        count = self._mean_counts.get(key, 0)
        previous = self.name_to_value.get(key, 0.0) if count else 0.0
        self.name_to_value[key] = previous + (float(value) - previous) / (count + 1)
        self.name_to_excluded[key] = _excluded(exclude)
        self._mean_counts[key] = count + 1

    def dump(self, step: int = 0) -> None:
        """Writes the recorded numbers at ``step`` to the run's writer and forgets them."""
        self._write(self.writer, step)

    def _write(self, writer: SummaryWriter | None, step: int) -> None:
        if writer is not None:
            for key, value in self.name_to_value.items():
                if "tensorboard" in self.name_to_excluded.get(key, ()):
                    continue
                if isinstance(value, numbers.Real) or (hasattr(value, "ndim") and value.ndim == 0):
                    writer.add_scalar(key, float(value), step)  # NaN and infinities as they are
        self.name_to_value.clear()
        self.name_to_excluded.clear()
        self._mean_counts.clear()

    def get_dir(self) -> str | None:
        """The folder of the run being written (SB3's ``logger.get_dir()``), None without one."""
        return None if self.writer is None else self.writer.logdir
