"""Observations flattened on the host into one float vector: how the recurrent agents, whose
sequence encoder and sequence replay read vectors, take Discrete, MultiDiscrete, MultiBinary and
Dict observations. A Discrete or MultiDiscrete entry becomes its one-hot rows, a Box or
MultiBinary its values; a Dict's keys are concatenated in the Dict's key order, as the
feed-forward agents' DictEncoder concatenates their features (Gymnasium's
``spaces.flatten`` gives the same vector). Image observations are not flattened here: they
need a CNN agent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlkit.agents.dict_observations import DictObservationLayout
from rlkit.agents.observations import ObservationLayout


def _flat_size(layout: ObservationLayout) -> int:
    return sum(layout.nvec) if layout.nvec else layout.size


def _one_hot_rows(layout: ObservationLayout, batch: np.ndarray) -> np.ndarray:
    """A batch [n, size] of ``layout`` (indices from 0 where it is one-hot) as [n, flat size]."""
    if not layout.nvec:
        return batch
    rows = [np.eye(classes, dtype=np.float32)[batch[:, i].astype(np.int64)] for i, classes in enumerate(layout.nvec)]
    return np.concatenate(rows, axis=1)  # [n, sum(nvec)]


@dataclass(frozen=True)
class FlatObservationLayout:
    """The host-flattened path of an observation space whose feed-forward layout is ``inner``
    (an ObservationLayout or a DictObservationLayout without image keys). It answers ``batch``
    and ``batch_of`` as the layouts do, with one float32 array [n, size]."""

    inner: ObservationLayout | DictObservationLayout
    extractor: str = "flatten"
    image = False
    nvec = ()

    @classmethod
    def of(cls, layout, algo: str) -> "FlatObservationLayout":
        """The flattened form of ``layout``; ValueError naming ``algo`` where it holds images."""
        parts = layout.layouts.items() if isinstance(layout, DictObservationLayout) else [(None, layout)]
        for key, part in parts:
            if part.image:
                where = "" if key is None else f" (key {key!r})"
                raise ValueError(f"{algo} reads vectors into its sequence encoder, got image observations{where}: "
                                 "images need a CNN agent (DQN, SAC, ...), or features_extractor='flatten' to feed "
                                 "the pixels as a vector")
        return cls(layout)

    @property
    def size(self) -> int:
        """Features of one flattened observation."""
        if isinstance(self.inner, DictObservationLayout):
            return sum(_flat_size(layout) for layout in self.inner.layouts.values())
        return _flat_size(self.inner)

    def _flatten(self, batch) -> np.ndarray:
        if isinstance(self.inner, DictObservationLayout):
            return np.concatenate([_one_hot_rows(layout, batch[key]) for key, layout in self.inner.layouts.items()],
                                  axis=1)  # [n, size]
        return _one_hot_rows(self.inner, batch)

    def batch(self, obs, n: int) -> np.ndarray:
        """``n`` observations as one float32 array [n, size]."""
        return self._flatten(self.inner.batch(obs, n))

    def batch_of(self, observation, space_shape) -> tuple[np.ndarray, bool]:
        """(the batch [n, size], whether a batch was given) for predict, as the inner layout decides."""
        batch, vectorized = self.inner.batch_of(observation, space_shape)
        return self._flatten(batch), vectorized
