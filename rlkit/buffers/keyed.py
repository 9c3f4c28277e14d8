"""Dict observations in a replay buffer: what a ReplayBuffer made with ``obs_shape`` a dict
``{key: shape}`` keeps on the device instead of its one observation table.

Each key has its own table for observations and one for next observations, of the key's own
dtype (u8 images stay bytes, vectors f32, indices i32 or f32), one column per transition in the
buffer's lane order. A sample gathers every key's tables with the same column indices, so the
keys of a sampled observation always come from one step. Keys keep the dict's order (a
Gymnasium Dict space's), which is the order the encoders concatenate their features in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

import rlkit.core as rc
from rlkit.buffers.device_buffer import DeviceBuffer
from rlkit.buffers.frames import image_shape
from rlkit.core.checks import check_integer_values
from rlkit.core.tensor import NUMPY_DTYPES, Tensor


def keyed_specs(obs_shape: Mapping, obs_dtype, shape_of: Callable) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{key: (shape, dtype)}`` from a dict ``obs_shape`` and ``obs_dtype`` (one dtype for every
    key, or a dict with the same keys); ``shape_of(value, what)`` checks one shape. ValueError
    for an empty dict, a key that is not a non-empty string, or dtypes that do not name every key."""
    if not obs_shape:
        raise ValueError("ReplayBuffer: obs_shape is an empty dict; a dict of observations needs at least one key")
    bad = [key for key in obs_shape if not isinstance(key, str) or not key]
    if bad:
        raise ValueError(f"ReplayBuffer: the keys of a dict obs_shape must be non-empty strings, got {bad[0]!r}")
    if isinstance(obs_dtype, Mapping):
        if list(obs_dtype) != list(obs_shape):
            raise ValueError(f"ReplayBuffer: obs_dtype's keys {list(obs_dtype)} are not obs_shape's {list(obs_shape)} "
                             "(same keys, same order)")
        dtypes = dict(obs_dtype)
    else:
        dtypes = dict.fromkeys(obs_shape, obs_dtype)
    return {key: (shape_of(shape, f"obs_shape[{key!r}]"), dtypes[key]) for key, shape in obs_shape.items()}


def keyed_row_bytes(specs: dict[str, tuple[tuple[int, ...], str]]) -> int:
    """Bytes of one observation of every key."""
    return sum(math.prod(shape) * np.dtype(NUMPY_DTYPES[dtype]).itemsize for shape, dtype in specs.values())


class KeyedObservations:
    """The observation and next-observation tables of a dict observation buffer, a pair per
    key, and their staging on the host (see the module's docstring). ``check`` refuses a step
    before anything changes, ``stage`` keeps it on the host, ``flush`` sends the staged steps,
    ``gather`` reads columns on the device."""

    def __init__(self, specs: dict[str, tuple[tuple[int, ...], str]], capacity: int, n_envs: int,
                 staging_steps: int, device: str | None):
        self.specs, self.n_envs = specs, n_envs
        self.keys = tuple(specs)
        self.obs = {key: DeviceBuffer(math.prod(shape), capacity, dtype, device) for key, (shape, dtype) in specs.items()}
        self.next_obs = {key: DeviceBuffer(math.prod(shape), capacity, dtype, device)
                         for key, (shape, dtype) in specs.items()}
        self._staged = {which: {key: np.empty((staging_steps, n_envs, math.prod(shape)), NUMPY_DTYPES[dtype])
                                for key, (shape, dtype) in specs.items()} for which in ("obs", "next_obs")}
        # u8 keys of more than one axis are images: sampled in rlkit's image layout
        self._sample_shapes = {key: image_shape(shape) if dtype == "u8" and len(shape) > 1 else None
                               for key, (shape, dtype) in specs.items()}

    def check(self, obs, next_obs) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """obs and next_obs as ``{key: [n_envs, rows]}`` arrays of each key's dtype, or a
        ValueError naming the key: not a dict of exactly the buffer's keys, a shape that is not
        [n_envs, *shape], or values an integer table cannot hold."""
        return self._check(obs, "obs"), self._check(next_obs, "next_obs")

    def _check(self, value, what: str) -> dict[str, np.ndarray]:
        if not isinstance(value, Mapping) or set(value) != set(self.keys):
            given = sorted(value) if isinstance(value, Mapping) else type(value).__name__
            raise ValueError(f"ReplayBuffer.add: {what} must be a dict with the keys {list(self.keys)}, got {given}")
        rows = {}
        for key, (shape, dtype) in self.specs.items():
            check_integer_values(value[key], dtype, f"ReplayBuffer.add: {what}[{key!r}]")
            arr = np.asarray(value[key], NUMPY_DTYPES[dtype] if dtype in ("u8", "i32") else np.float32)
            if arr.shape != (self.n_envs, *shape):
                raise ValueError(f"ReplayBuffer.add: {what}[{key!r}] has shape {arr.shape}, expected "
                                 f"{(self.n_envs, *shape)} (leading dimension n_envs={self.n_envs})")
            rows[key] = arr.reshape(self.n_envs, -1)
        return rows

    def stage(self, slot: int, obs: dict[str, np.ndarray], next_obs: dict[str, np.ndarray]) -> None:
        """Keeps a checked step in staging slot ``slot`` until ``flush``."""
        for key in self.keys:
            self._staged["obs"][key][slot] = obs[key]
            self._staged["next_obs"][key][slot] = next_obs[key]

    def flush(self, first: int, n: int, send: Callable) -> None:
        """Sends the ``n`` staged steps to ring steps ``first`` on: ``send(table, first, steps)``
        is the buffer's write of [k, n_envs, rows] steps (one write, two where the ring wraps)."""
        for which, tables in (("obs", self.obs), ("next_obs", self.next_obs)):
            for key, table in tables.items():
                send(table, first, self._staged[which][key][:n])

    def gather(self, columns: Tensor, next_obs: bool = False) -> dict[str, Tensor]:
        """``{key: [*shape, B]}``: the (next) observations of the transitions at ``columns``
        [1, B], every key gathered with the same indices, on the device."""
        tables = self.next_obs if next_obs else self.obs
        gathered = {}
        for key, table in tables.items():
            values = rc.get_rows(table, columns)  # [rows, B]
            shape = self._sample_shapes[key]
            gathered[key] = values if shape is None else rc.reshape(values, (*shape, values.shape[-1]))  # [*image, B]
        return gathered

    def tables(self) -> list[DeviceBuffer]:
        """Every table, observations then next observations."""
        return [*self.obs.values(), *self.next_obs.values()]

    def fields(self) -> dict[str, DeviceBuffer]:
        """The tables by the names a save gives their files: ``obs_<i>`` and ``next_obs_<i>``
        for the i-th key (the keys are in the save's settings, in order)."""
        fields = {f"obs_{i}": table for i, table in enumerate(self.obs.values())}
        fields.update({f"next_obs_{i}": table for i, table in enumerate(self.next_obs.values())})
        return fields
