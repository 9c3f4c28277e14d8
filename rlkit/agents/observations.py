"""How observations travel from the environment to the networks: as float32 vectors, or as
images, which stay bytes on the host, in the replay buffer and on the way to the device, and
meet a CNN there.

``ObservationLayout.of(space, config)`` decides, as SB3 does: an image space (a 3-D uint8 Box
in [0, 255], SB3's ``is_image_space``) gets a CNN; Discrete and MultiDiscrete observations are
stored as indices and one-hot on the device, MultiBinary ones as their 0/1 floats; ``config.features_extractor`` can force
one ("nature", "impala") on any 3-D Box of bytes or booleans (MinAtar's), or the flattened
vector ("flatten"). The channel axis is the smallest one, first or last, as SB3 decides it.
A Dict space gets a DictObservationLayout (dict_observations.py): a path per key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import gymnasium as gym
import numpy as np

import rlkit.core as rc
from rlkit.envs.atari import FRAME_STACK_METADATA

FEATURES_EXTRACTORS = ("auto", "nature", "impala", "flatten")
"""The values of OffPolicyConfig.features_extractor."""


def frame_stack_of(env) -> int | None:
    """The stack size where ``env``'s observations are Gymnasium FrameStackObservation stacks:
    its outermost observation wrapper, that of a sync vector environment's first environment, or
    a vector environment's FRAME_STACK_METADATA; None where they are not (or it cannot tell)."""
    declared = (getattr(env, "metadata", None) or {}).get(FRAME_STACK_METADATA)
    if declared:
        return int(declared)
    if isinstance(env, gym.vector.SyncVectorEnv):
        env = env.envs[0]
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.FrameStackObservation):
            return int(env.stack_size)
        if isinstance(env, gym.ObservationWrapper):  # it changes the stacks: they may no longer share frames
            return None
        env = env.env
    return None


def is_image_space(space) -> bool:
    """SB3's rule: a Box of three dimensions, uint8, every bound 0 and 255."""
    return (isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8
            and bool(np.all(space.low == 0)) and bool(np.all(space.high == 255)))


@dataclass(frozen=True)
class ObservationLayout:
    """An observation space's path: ``shape`` is one observation's (the space's), ``extractor``
    the encoder ("flatten", "onehot", "nature" or "impala"), ``channels_first`` where the image's
    channel axis is, ``scale`` what the image's bytes are multiplied by on the device (1/255,
    or 1)."""

    shape: tuple[int, ...]
    extractor: str
    channels_first: bool = True
    scale: float = 1.0
    nvec: tuple[int, ...] = ()
    """For Discrete and MultiDiscrete spaces ("onehot"): the number of values of each entry."""
    start: tuple[int, ...] = ()
    """... and each entry's smallest value (Gymnasium's ``start``)."""

    @classmethod
    def of(cls, space, features_extractor: str = "auto", normalize_images: bool = True):
        """The layout for an observation ``space`` under the config's choices (a
        DictObservationLayout for a Dict space)."""
        if features_extractor not in FEATURES_EXTRACTORS:
            raise ValueError(f"features_extractor must be one of {FEATURES_EXTRACTORS}, got {features_extractor!r}")
        if isinstance(space, gym.spaces.Dict):
            from rlkit.agents.dict_observations import DictObservationLayout  # (it builds on this module)

            return DictObservationLayout.of(space, features_extractor, normalize_images)
        if not isinstance(space, gym.spaces.Box):
            return cls._of_non_box(space, features_extractor)
        shape = tuple(int(n) for n in space.shape)
        image = is_image_space(space)
        if features_extractor == "flatten" or (features_extractor == "auto" and not image):
            return cls(shape, "flatten")
        if len(shape) != 3 or min(shape) < 1 or space.dtype not in (np.uint8, np.bool_):
            raise ValueError(f"features_extractor={features_extractor!r} needs an image observation space (a 3-D Box "
                             f"of uint8 or bool, every size >= 1), got {space}")
        extractor = "nature" if features_extractor == "auto" else features_extractor
        scale = 1.0 / 255.0 if image and normalize_images else 1.0
        return cls(shape, extractor, channels_first=int(np.argmin(shape)) == 0, scale=scale)

    def buffer_options(self, env) -> dict:
        """The ReplayBuffer arguments after its capacity: the observation's shape, and for images
        the u8 dtype and, where ``env`` gives FrameStackObservation stacks along the first axis,
        ``frame_stack`` (each frame stored once: 1M Atari transitions in 7.3 GB)."""
        if not self.image:
            return {"obs_shape": self.buffer_shape}
        options = {"obs_shape": self.buffer_shape, "obs_dtype": "u8"}
        stack = frame_stack_of(env)
        if stack is not None and self.channels_first and self.shape[0] == stack:
            options["frame_stack"] = stack
        return options

    @classmethod
    def _of_non_box(cls, space, features_extractor: str) -> "ObservationLayout":
        """Discrete and MultiDiscrete spaces as one-hot vectors (each entry's index stored, one-hot
        on the device: SB3's preprocessing), MultiBinary as its 0/1 floats."""
        if features_extractor in ("nature", "impala"):
            raise ValueError(f"features_extractor={features_extractor!r} needs an image observation space (a 3-D Box "
                             f"of uint8 or bool), got {space}")
        if isinstance(space, gym.spaces.Discrete):
            return cls((1,), "onehot", nvec=(int(space.n),), start=(int(space.start),))
        if isinstance(space, gym.spaces.MultiDiscrete):
            nvec = tuple(int(n) for n in np.asarray(space.nvec).reshape(-1))
            start = tuple(int(n) for n in np.asarray(getattr(space, "start", np.zeros_like(space.nvec))).reshape(-1))
            return cls((len(nvec),), "onehot", nvec=nvec, start=start)
        if isinstance(space, gym.spaces.MultiBinary):
            return cls((int(np.prod(space.shape)),), "flatten")
        raise ValueError(f"observation spaces the agents read: Box, Discrete, MultiDiscrete, MultiBinary and Dict "
                         f"of these; got {space}")

    @classmethod
    def vector(cls, size: int) -> "ObservationLayout":
        """The layout of ``size`` float features (what a recurrent encoder hands its heads)."""
        return cls((int(size),), "flatten")

    @cached_property  # (read at every environment step, as size is)
    def image(self) -> bool:
        """Whether observations are images (met by a CNN)."""
        return self.extractor in ("nature", "impala")

    @property
    def dtype(self) -> type:
        """The host and buffer dtype of a batch: uint8 for images, float32 otherwise."""
        return np.uint8 if self.image else np.float32

    @cached_property
    def size(self) -> int:
        """Elements of one observation (read at every environment step: computed once)."""
        return math.prod(self.shape)

    @property
    def buffer_shape(self) -> int | tuple[int, ...]:
        """One observation's shape in the replay buffer: the image's, or the flat length."""
        return self.shape if self.image else self.size

    @property
    def channel_first_shape(self) -> tuple[int, int, int]:
        """The image as (C, H, W), what the CNN is built for."""
        if self.channels_first:
            return self.shape  # type: ignore[return-value]
        height, width, channels = self.shape
        return channels, height, width

    def batch(self, obs, n: int) -> np.ndarray:
        """``n`` observations as one array [n, *buffer shape] of the layout's dtype (a view where
        they already are)."""
        if self.image:
            return np.asarray(obs).reshape(n, *self.shape).astype(np.uint8, copy=False)
        if self.nvec:  # the entries' indices from 0, as floats (the buffer's observation dtype)
            return (np.asarray(obs).reshape(n, self.size) - np.asarray(self.start)).astype(np.float32)
        return np.asarray(obs).reshape(n, self.size).astype(np.float32, copy=False)

    def batch_of(self, observation, space_shape: tuple[int, ...]) -> tuple[np.ndarray, bool]:
        """(the batch, whether a batch was given) for predict: as SB3, an array of the space's
        shape ``space_shape`` is one observation, one of shape (n, *space_shape) a batch (what a
        vector environment returns); ValueError for any other shape."""
        obs, shape = np.asarray(observation), tuple(space_shape)
        if obs.shape != shape and obs.shape[1:] != shape:
            raise ValueError(f"observations of shape {obs.shape} do not match the observation space: expected "
                             f"{shape} for one, or (n_envs, {', '.join(map(str, shape))}) for a batch")
        return self.batch(obs, obs.size // self.size), obs.shape != shape

    def features_extractor(self, kwargs: dict | None = None) -> "tuple[rc.nn.Module, int]":
        """A fresh encoder of a batch as the networks receive it and its output width: the
        identity and the observation's size for vectors; for images, the reorder to
        [W, H, C, N], the scale and NatureCNN or ImpalaCNN made with ``kwargs``."""
        if self.nvec:
            return OneHot(self.nvec), sum(self.nvec)
        if not self.image:
            return Identity(), self.size
        cnn_class = rc.nn.NatureCNN if self.extractor == "nature" else rc.nn.ImpalaCNN
        kwargs = dict(kwargs or {})
        if "normalize_images" in kwargs:
            raise ValueError("features_extractor_kwargs: normalize_images is the config's own field, not the CNN's")
        try:
            cnn = cnn_class(self.channel_first_shape, normalize_images=False, **kwargs)
        except TypeError as error:
            raise ValueError(f"features_extractor_kwargs {kwargs} do not fit {cnn_class.__name__}: {error}") from None
        return ImageEncoder(self, cnn), cnn.features_dim


class Identity(rc.nn.Module):
    """The observation itself: the networks' input for vector observations."""

    def forward(self, x):
        return x


class OneHot(rc.nn.Module):
    """Indices [k, N] (as floats, from 0) to the concatenated one-hot rows of each entry:
    [sum(nvec), N]."""

    def __init__(self, nvec: tuple[int, ...]):
        super().__init__()
        self.nvec = tuple(nvec)

    def forward(self, obs):
        batch = obs.shape[-1]
        index = rc.cast(obs, "i32")  # [k, N]
        rows = None
        for i, classes in enumerate(self.nvec):
            entry = rc.reshape(rc.slice_rows(index, i, 1), (batch,))  # [N]
            hot = rc.one_hot(entry, classes)  # [classes, N]
            rows = hot if rows is None else rc.concat_rows(rows, hot)
        return rows  # [sum(nvec), N]


class ImageEncoder(rc.nn.Module):
    """A CNN on a batch of images as the buffer and acting give them: a C-order numpy batch
    (N, *shape), seen column-major as the reversed shape (channel-first (C, H, W) arrives as
    [W, H, C, N], channel-last (H, W, C) as [C, W, H, N]). Channel-last images are reordered to
    [W, H, C, N] on the device, after the bytes become floats scaled by the layout's scale; then the CNN."""

    def __init__(self, layout: ObservationLayout, cnn: rc.nn.Module):
        super().__init__()
        self.layout = layout
        self.scale = rc.nn.ScaleImages(layout.scale)
        self.cnn = cnn

    def forward(self, obs):
        floats = self.scale(obs)  # bytes to floats first: the reorder then runs on floats, as every kernel does
        batch = floats.shape[-1]
        channels, height, width = self.layout.channel_first_shape
        if self.layout.channels_first:  # a batch already [W, H, C, N] (the buffer's) needs no reshape, a copy
            shape = (width, height, channels, batch)
            images = floats if tuple(floats.shape) == shape else rc.reshape(floats, shape)  # [W, H, C, N]
        else:
            pixels_last = rc.reshape(floats, (channels, width * height, batch))  # [C, W H, N]
            images = rc.reshape(rc.transpose(pixels_last), (width, height, channels, batch))  # [W, H, C, N]
        return self.cnn(images)  # [features, N]
