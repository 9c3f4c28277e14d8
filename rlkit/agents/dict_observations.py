"""Dict observations (Gymnasium Dict spaces), as SB3's MultiInputPolicy reads them: every key
has its own path, and the features of all keys, concatenated in the Dict's key order, meet the
MLP.

A key's path is that of an observation of its space alone (observations.py), as SB3's
CombinedExtractor builds it: an image key (SB3's ``is_image_space``) gets a CNN, NatureCNN
unless ``config.features_extractor`` names ImpalaCNN, with ``cnn_output_dim`` features (256,
SB3's default); Discrete and MultiDiscrete keys are one-hot, Box and MultiBinary keys flattened.
In the replay buffer each key has its own tables (rlkit/buffers/keyed.py): images as bytes,
the rest as float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

import rlkit.core as rc

if TYPE_CHECKING:
    from rlkit.agents.observations import ObservationLayout

CNN_OUTPUT_DIM = 256
"""Features of each image key's CNN unless features_extractor_kwargs' cnn_output_dim says
otherwise (SB3's CombinedExtractor default)."""

KEY_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
"""The spaces a Dict observation's keys may have (SB3's MultiInputPolicy: no nested Dict or Tuple)."""


def check_dict_space(space: gym.spaces.Dict) -> None:
    """ValueError for a Dict space the agents do not read: one without keys, or a key whose
    space is not one of KEY_SPACES (a nested Dict or Tuple, ...), naming the key."""
    if not space.spaces:
        raise ValueError("a Dict observation space needs at least one key, got an empty Dict")
    for key, subspace in space.spaces.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"Dict observation keys must be non-empty strings, got {key!r}")
        if not isinstance(subspace, KEY_SPACES):
            raise ValueError(f"Dict observation key {key!r} has the space {subspace}; each key must be a Box, "
                             "Discrete, MultiDiscrete or MultiBinary (nested Dict and Tuple spaces are not read)")


@dataclass(frozen=True)
class DictObservationLayout:
    """A Dict space's path: ``layouts`` holds each key's ObservationLayout, in the space's key
    order. It answers what the agents ask an ObservationLayout (``batch``, ``buffer_options``,
    ``features_extractor``, ...) with a dict of arrays, a buffer of keyed tables and the
    concatenating encoder."""

    layouts: dict[str, ObservationLayout]
    space_shapes: dict[str, tuple[int, ...]]
    """Each key's observation shape as its space gives it (a Discrete key's is ())."""
    extractor: str = "dict"
    image = False
    nvec = ()

    @classmethod
    def of(cls, space: gym.spaces.Dict, features_extractor: str, normalize_images: bool) -> "DictObservationLayout":
        """Each key's layout under the config's choices: "auto" (SB3's), "nature" or "impala"
        (the CNN of the image keys), "flatten" (every key flattened, images too)."""
        from rlkit.agents.observations import ObservationLayout, is_image_space

        check_dict_space(space)
        layouts = {}
        for key, subspace in space.spaces.items():
            cnn = features_extractor in ("nature", "impala") and is_image_space(subspace)
            layouts[key] = ObservationLayout.of(subspace, features_extractor if cnn else
                                                "flatten" if features_extractor == "flatten" else "auto",
                                                normalize_images)
        return cls(layouts, {key: tuple(subspace.shape) for key, subspace in space.spaces.items()})

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.layouts)

    def batch(self, obs, n: int) -> dict[str, np.ndarray]:
        """``n`` observations (a dict of arrays with a leading dimension of ``n``) as each key's
        batch: ``{key: [n, *buffer shape]}`` of the key's dtype."""
        return {key: layout.batch(obs[key], n) for key, layout in self.layouts.items()}

    def batch_of(self, observation, space_shape=None) -> tuple[dict[str, np.ndarray], bool]:
        """(the batch, whether a batch was given) for predict: as SB3, a dict whose every key
        holds one observation of its space, or a batch (n, *shape) of them from a vector
        environment, the same n for every key. ValueError naming the key otherwise.
        ``space_shape`` (ObservationLayout's argument; a Dict space has none) is not read."""
        if not isinstance(observation, dict) or set(observation) != set(self.layouts):
            given = sorted(observation) if isinstance(observation, dict) else type(observation).__name__
            raise ValueError(f"observations of a Dict space must be a dict with the keys {list(self.layouts)}, "
                             f"got {given}")
        batches, given = {}, {}
        for key, layout in self.layouts.items():
            try:
                batches[key], vectorized = layout.batch_of(observation[key], self.space_shapes[key])
            except ValueError as error:
                raise ValueError(f"observation[{key!r}]: {error}") from None
            given[key] = len(batches[key]) if vectorized else None
        if len(set(given.values())) > 1:
            raise ValueError(f"the keys of a Dict observation hold different numbers of observations (None: one "
                             f"observation): {given}")
        return batches, next(iter(given.values())) is not None

    def buffer_options(self, env) -> dict:
        """The ReplayBuffer arguments of keyed tables: each key's shape and dtype (u8 images)."""
        return {"obs_shape": {key: layout.buffer_shape for key, layout in self.layouts.items()},
                "obs_dtype": {key: "u8" if layout.image else "f32" for key, layout in self.layouts.items()}}

    def features_extractor(self, kwargs: dict | None = None) -> "tuple[rc.nn.Module, int]":
        """A fresh DictEncoder and the width of its features. ``kwargs`` go to every image key's
        CNN; ``cnn_output_dim`` (SB3's name, default 256) is each CNN's features_dim."""
        kwargs = dict(kwargs or {})
        if "cnn_output_dim" in kwargs and "features_dim" in kwargs:
            raise ValueError("features_extractor_kwargs: give each image key's CNN width once, as cnn_output_dim "
                             "(SB3's name for Dict observations) or features_dim")
        kwargs.setdefault("features_dim", kwargs.pop("cnn_output_dim", CNN_OUTPUT_DIM))
        encoders, width = [], 0
        for layout in self.layouts.values():
            encoder, features = layout.features_extractor(kwargs if layout.image else None)
            encoders.append(encoder)
            width += features
        return DictEncoder(self.keys, encoders), width


class DictEncoder(rc.nn.Module):
    """Each key's encoder on its batch, their features stacked as rows in the keys' order:
    ``{key: [*shape, N]}`` to [sum of features, N]. The encoders are registered as ``0``,
    ``1``, ... (a key's name may be any string), in the keys' order."""

    def __init__(self, keys: tuple[str, ...], encoders: list[rc.nn.Module]):
        super().__init__()
        self.keys = tuple(keys)
        for i, encoder in enumerate(encoders):
            setattr(self, str(i), encoder)

    def forward(self, obs: dict):
        features = None
        for i, key in enumerate(self.keys):
            encoded = getattr(self, str(i))(obs[key])  # [features of the key, N]
            features = encoded if features is None else rc.concat_rows(features, encoded)
        return features  # [sum of features, N]
