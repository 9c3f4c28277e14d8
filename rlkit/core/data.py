"""DataLoader: shuffled mini-batches of column-major data.

The whole data set is held as engine tensors once; a batch is a gather of columns
(``get_rows``), so batching never copies the data set and, on a device, never leaves it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from rlkit.core import ops
from rlkit.core.checks import positive_int
from rlkit.core.tensor import Tensor, tensor


class Batch(NamedTuple):
    """One mini-batch: ``x`` [features, batch] and ``y`` [targets, batch] (None without targets)."""

    x: Tensor
    y: Tensor | None


def _columns(data, name: str) -> Tensor:
    if isinstance(data, Tensor):
        t = data
    else:
        if not isinstance(data, np.ndarray):
            raise TypeError(f"DataLoader: {name} must be a numpy array or a Tensor, got {type(data).__name__}")
        t = tensor(data)
    if t.ndim != 2:
        raise ValueError(f"DataLoader: {name} must be 2-D [features, n] (or 1-D labels), got shape {t.shape}")
    return t


class DataLoader:
    """Mini-batches over column-major ``x`` [features, n] and optional ``y`` [targets, n]
    (1-D ``y`` of n labels becomes [1, n]; integer labels stay i32).

    ``epoch()`` reshuffles (when ``shuffle``) and yields :class:`Batch` tuples; with
    ``drop_last`` an incomplete last batch is left out. ``seed`` fixes the shuffling.
    """

    def __init__(self, x, y=None, batch_size: int = 32, shuffle: bool = True, drop_last: bool = True,
                 seed: int | None = None):
        self.x = _columns(x, "x")
        n = self.x.shape[1]
        if y is not None:
            if isinstance(y, np.ndarray) and y.ndim == 1:
                y = y.reshape(1, -1)
            self.y = _columns(y, "y")
            if self.y.shape[1] != n:
                raise ValueError(f"DataLoader: x has {n} columns but y has {self.y.shape[1]}; expected one per example")
        else:
            self.y = None
        positive_int(batch_size, "DataLoader: batch_size")
        if drop_last and batch_size > n:
            raise ValueError(f"DataLoader: batch_size {batch_size} exceeds the {n} examples and drop_last is set")
        self.n = n
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.rng = np.random.default_rng(seed)  # the shuffling order; trainer checkpoints save its state

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self.n, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def epoch(self) -> Iterator[Batch]:
        """One pass over the data in (re)shuffled order."""
        order = self.rng.permutation(self.n) if self.shuffle else np.arange(self.n)
        for k in range(len(self)):
            index = order[k * self.batch_size:(k + 1) * self.batch_size].astype(np.int32)
            yield Batch(ops.get_rows(self.x, index), None if self.y is None else ops.get_rows(self.y, index))

    __iter__ = epoch

    def __repr__(self) -> str:
        return (f"DataLoader(n={self.n}, batch_size={self.batch_size}, batches={len(self)}, "
                f"shuffle={self.shuffle}, drop_last={self.drop_last})")
