"""ReplayBuffer: transitions from n_envs vector environments, stored on the device.

Layout: one column per transition, in lanes: column ``t * n_envs + e`` holds environment e's
transition at ring time t, so one step of every environment is one contiguous write. Observations,
next observations and actions live in DeviceBuffers on the device; rewards and the terminated /
truncated flags are small and are mirrored on the host, where n-step returns and episode
boundaries are computed. New steps wait on the host and reach the device tables in bulk before
anything reads them (``flush``). ``sample`` draws indices from a seeded generator and gathers
the columns on the device.

Terminated and truncated are stored apart: bootstrapping stops only at termination. With
``optimize_memory`` each observation is stored once (the next observation is the lane's next
column), and the true final observation of a truncated episode is kept in a side table, so
truncation still bootstraps from the right state (the bug Stable-Baselines3 forbids instead).

u8 observations are bytes on the device, sampled in the image layout where they have more than
one axis. With ``frame_stack`` the observations are frame stacks: each frame is stored once and
the stacks are rebuilt by index on the device (frames.py), next observations included, so
sampling on the device works for them as for vectors.

Two base classes of ReplayBuffer carry its other ideas: its sequence samplers
(replay_sequences.py) and its save and load (replay_files.py).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

import rlkit.core as rc
from rlkit.buffers.device_buffer import DeviceBuffer
from rlkit.buffers.frames import FrameStacks, default_start_frames, frame_columns, image_shape, minimum_start_frames
from rlkit.buffers.keyed import KeyedObservations, keyed_row_bytes, keyed_specs
from rlkit.buffers.replay_files import ReplayFiles
from rlkit.buffers.replay_sequences import SequenceSampling
from rlkit.core import runtime
from rlkit.core.checks import check_integer_values, positive_int
from rlkit.core.tensor import NUMPY_DTYPES, Tensor


class ReplaySamples(NamedTuple):
    """A sampled batch, every field a device tensor in [features, batch] layout (obs and
    next_obs dicts of them, ``{key: [*shape, B]}``, for dict observations)."""

    obs: Tensor | dict[str, Tensor]
    action: Tensor
    reward: Tensor    # [1, B]: the (n-step) discounted return
    next_obs: Tensor | dict[str, Tensor]  # the observation to bootstrap from (after the last summed step)
    done: Tensor      # [1, B]: 1 when an episode terminated within the summed steps
    discount: Tensor  # [1, B]: gamma ** k for the k steps summed
    index: np.ndarray | Tensor  # the sampled columns (a device tensor from sample_on_device)
    weights: Tensor | None = None  # [1, B] importance weights (prioritized sampling only)


def _shape(value, what: str) -> tuple[int, ...]:
    shape = (value,) if isinstance(value, numbers.Integral) else tuple(value)
    if not shape or any(isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1 for n in shape):
        raise ValueError(f"ReplayBuffer: {what} must be a positive int or a tuple of them, got {value!r}")
    return tuple(int(n) for n in shape)


def _step_of(value, i: int):
    """The i-th step of what ``extend`` was given: ``value[i]``, or each key's for a dict."""
    return {key: array[i] for key, array in value.items()} if isinstance(value, Mapping) else value[i]


def _steps_given(**arguments) -> int:
    """The k steps each of extend's ``arguments`` stacks (each key's array, for a dict), or a
    ValueError naming one that is not an array of k steps."""
    if np.ndim(arguments["reward"]) == 0:
        reward = arguments["reward"]
        raise ValueError("ReplayBuffer.extend: reward must be an array [k, n_envs] (k steps of add's), got "
                         f"{type(reward).__name__} {reward!r}")
    k = len(arguments["reward"])
    for what, value in arguments.items():
        for key, array in (value.items() if isinstance(value, Mapping) else [(None, value)]):
            if np.ndim(array) == 0 or len(array) != k:
                where = what if key is None else f"{what}[{key!r}]"
                held = len(array) if np.ndim(array) else "no"
                raise ValueError(f"ReplayBuffer.extend: {where} holds {held} steps, reward {k}: every argument "
                                 "stacks the same k steps")
    return k


def _itemsize(dtype: str) -> int:
    return np.dtype(NUMPY_DTYPES[dtype]).itemsize


def _frame_settings(frame_stack, start_frames, obs_shape: tuple[int, ...], obs_dtype: str, optimize_memory: bool,
                    capacity: int, n_envs: int, device: str | None) -> tuple[int | None, int | None]:
    """(frame_stack, start_frames) checked against the other settings, start_frames defaulted
    (both None for observations that are not frame stacks)."""
    if frame_stack is None:
        if start_frames is not None:
            raise ValueError("ReplayBuffer: start_frames is a setting of frame stacks; pass frame_stack too")
        return None, None
    k = positive_int(frame_stack, "ReplayBuffer: frame_stack")
    if obs_dtype != "u8":
        raise ValueError(f"ReplayBuffer: frame_stack stores frames as bytes: pass obs_dtype='u8' (got {obs_dtype!r})")
    if len(obs_shape) < 2 or obs_shape[0] != k:
        raise ValueError(f"ReplayBuffer: frame_stack={k} needs observations of shape ({k}, ...), the stack axis first "
                         f"(FrameStackObservation's layout), got obs_shape {obs_shape}")
    if optimize_memory:
        raise ValueError("ReplayBuffer: frame_stack already stores each frame once; leave optimize_memory False")
    frame_bytes = int(np.prod(obs_shape[1:]))
    where = runtime.check_device(device if device is not None else runtime.device())
    if where == "gpu" and frame_bytes % 4:
        raise ValueError(f"ReplayBuffer: on the GPU a frame's bytes must be a multiple of 4 (u8 gathers move whole "
                         f"32-bit words); frames of shape {obs_shape[1:]} have {frame_bytes}")
    least = minimum_start_frames(k, n_envs)
    if start_frames is None:
        return k, default_start_frames(capacity, k, n_envs)
    if positive_int(start_frames, "ReplayBuffer: start_frames") < least:
        raise ValueError(f"ReplayBuffer: start_frames must be at least {least} (k * k * n_envs + 1) for "
                         f"frame_stack={k} and {n_envs} environments, got {start_frames}")
    return k, int(start_frames)


class ReplayBuffer(SequenceSampling, ReplayFiles):
    """A ring of ``capacity`` transitions (rounded down to a multiple of ``n_envs``).

    ``add(obs, action, reward, next_obs, terminated, truncated)`` takes arrays as Gymnasium's
    vector environments return them (leading dimension n_envs; next_obs is the true next
    observation, the final one at episode ends). ``sample(batch_size)`` returns ReplaySamples.

    Images: with ``obs_dtype="u8"`` the observations are stored as bytes (the network scales
    them on the device), and an observation of more than one axis is sampled as a u8 tensor in
    rlkit's image layout, its numpy axes reversed: (C, H, W) gives [W, H, C, B], the bytes of a
    C-order numpy (B, C, H, W) batch; (H, W, C) gives [C, W, H, B] (``frames.image_shape``).

    Frame stacks: ``frame_stack=k`` declares observations of shape (k, ...) that are stacks of
    k frames, the stack axis first, each the previous one shifted by a frame (Gymnasium's
    ``FrameStackObservation``, e.g. (4, 84, 84) uint8 after ``AtariPreprocessing``). Each frame
    is then stored once and the stacks are rebuilt by index on the device (rlkit/buffers/frames.py);
    samples give exactly the stacks the environment returned, padding included (any
    ``padding_type``), and the true final stack as next_obs at episode ends. ``add`` refuses
    (ValueError) observations that are not uint8, a next observation that does not share k - 1
    frames with its observation, and an observation that does not continue its lane's last next
    observation when that step did not end the episode: every step of every lane is added, in
    order. An episode's first observation takes up to k slots of a ring of ``start_frames``
    (default: one per 32 transitions); should episodes be so short that the ring laps while its
    oldest frames are still in use, the oldest steps stop being sampled early (``len`` counts
    the transitions that can be sampled). Where SB3 users would pass
    ``optimize_memory_usage=True``, pass ``frame_stack`` (each observation is stored once either
    way). ``nbytes`` is the device memory the buffer holds, ``estimate_nbytes(...)`` the same
    from the settings without allocating.

    Dict observations (Gymnasium Dict spaces): ``obs_shape`` a dict ``{key: shape}`` and
    ``obs_dtype`` one dtype or a dict ``{key: dtype}`` give each key its own tables
    (rlkit/buffers/keyed.py); ``add`` takes obs and next_obs as dicts of [n_envs, *shape]
    arrays, and samples' obs and next_obs are dicts ``{key: [*shape, B]}`` gathered with the
    same indices. Not with frame_stack, optimize_memory or sequence sampling.
    """

    STAGING_BYTES = 4 << 20
    """At most this much of new observations and actions waits on the host for the device."""

    def __init__(self, capacity: int, obs_shape, action_shape, n_envs: int = 1, device: str | None = None,
                 seed: int | None = None, obs_dtype: str | dict = "f32", action_dtype: str = "f32",
                 optimize_memory: bool = False, n_step: int = 1, gamma: float = 0.99,
                 frame_stack: int | None = None, start_frames: int | None = None):
        for name, value in (("capacity", capacity), ("n_envs", n_envs), ("n_step", n_step)):
            positive_int(value, f"ReplayBuffer: {name}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"ReplayBuffer: gamma must lie in [0, 1], got {gamma!r}")
        keyed = isinstance(obs_shape, Mapping)
        if keyed and (frame_stack is not None or optimize_memory):
            raise ValueError("ReplayBuffer: dict observations (obs_shape a dict) are stored key by key; not with "
                             "frame_stack or optimize_memory")
        specs = keyed_specs(obs_shape, obs_dtype, _shape) if keyed else None
        self.obs_shape = {key: shape for key, (shape, _) in specs.items()} if keyed else _shape(obs_shape, "obs_shape")
        self.action_shape = _shape(action_shape, "action_shape")
        self.n_envs, self.n_step, self.gamma = int(n_envs), int(n_step), float(gamma)
        self.lane_length = int(capacity) // self.n_envs  # ring steps per environment
        if self.lane_length < 2:
            raise ValueError(f"ReplayBuffer: capacity {capacity} holds fewer than 2 steps of {n_envs} environments")
        self.capacity = self.lane_length * self.n_envs
        self.optimize_memory = bool(optimize_memory)
        self.frame_stack, self.start_frames = (None, None) if keyed else _frame_settings(
            frame_stack, start_frames, self.obs_shape, obs_dtype, self.optimize_memory, self.capacity, self.n_envs, device)
        self.obs_dtype = {key: dtype for key, (_, dtype) in specs.items()} if keyed else obs_dtype
        # u8 observations of more than one axis are images: sampled in the image layout
        self._sample_shape = (image_shape(self.obs_shape) if not keyed and obs_dtype == "u8" and len(self.obs_shape) > 1
                              else None)
        action_rows = int(np.prod(self.action_shape))
        stacked = self.frame_stack is not None
        # one observation table (and one of next observations), or none: frame stacks and
        # dict observations keep theirs in their own component (self._stacks, self._keyed)
        single = not (stacked or keyed)
        obs_rows = int(np.prod(self.obs_shape)) if single else 0
        self._obs = DeviceBuffer(obs_rows, self.capacity, obs_dtype, device) if single else None
        self._next_obs = (DeviceBuffer(obs_rows, self.capacity, obs_dtype, device)
                          if single and not self.optimize_memory else None)
        self._action = DeviceBuffer(action_rows, self.capacity, action_dtype, device)
        # rewards and terminations on the device too, for sampling without the host
        self._reward_row = DeviceBuffer(1, self.capacity, "f32", device)
        self._terminated_row = DeviceBuffer(1, self.capacity, "f32", device)
        # episode ends (terminated or truncated), for masking sequences sampled on the device
        self._ended_row = DeviceBuffer(1, self.capacity, "f32", device)
        # n-step sums on the device stop after a step flagged here: an episode's end, or the
        # newest step (whose successor is not written yet)
        self._stop_row = DeviceBuffer(1, self.capacity, "f32", device) if self.n_step > 1 else None
        self._reward = np.zeros((self.lane_length, self.n_envs), np.float32)
        self._terminated = np.zeros((self.lane_length, self.n_envs), bool)
        self._truncated = np.zeros((self.lane_length, self.n_envs), bool)
        self._final_obs: dict[int, np.ndarray] = {}  # optimize_memory: true next obs at truncations
        # optimize_memory: each lane's newest next observation, which no table holds until the
        # lane's next step (truncate_episodes keeps it where that step begins a new episode)
        self._newest_next = np.zeros((self.n_envs, obs_rows), np.float32)
        self._rng = np.random.default_rng(seed)
        self.pos = 0          # the next ring step to write
        self.full = False
        # New steps wait on the host and go to the device tables in bulk (see flush): one upload
        # per table per run of steps instead of one per table per step. Every table runs flush before it is
        # read (a gather, a read, each replay of a captured program gathering from it), so the
        # guarantee lives where the data is read rather than in each reader, and no reader (a
        # method added later, a subclass, a user's capture) can see a table without its newest
        # steps. Fewer than lane_length steps wait, so no ring step is staged twice.
        obs_copies = 0 if stacked else 1 if self.optimize_memory else 2  # a stack stages one frame: see frames.py
        obs_bytes = keyed_row_bytes(specs) if keyed else obs_rows * np.dtype(NUMPY_DTYPES[obs_dtype]).itemsize
        step_bytes = self.n_envs * (obs_bytes * obs_copies + action_rows * np.dtype(NUMPY_DTYPES[action_dtype]).itemsize)
        staging_steps = max(1, min(self.lane_length - 1, self.STAGING_BYTES // step_bytes))
        self._staging_steps = staging_steps
        self._staged_obs = np.empty((staging_steps, self.n_envs, obs_rows), NUMPY_DTYPES[obs_dtype]) if single else None
        self._staged_next_obs = np.empty_like(self._staged_obs) if single and not self.optimize_memory else None
        self._keyed = KeyedObservations(specs, self.capacity, self.n_envs, staging_steps, device) if keyed else None
        self._staged_action = np.empty((staging_steps, self.n_envs, action_rows), NUMPY_DTYPES[action_dtype])
        self._n_staged = 0  # steps waiting on the host, from ring step _first_staged on
        self._first_staged = 0
        self._stacks: FrameStacks | None = None
        self._steps_added = 0  # every add counts, the ring's wraps too (frame stacks number steps with it)
        self._first_sampled = 0  # frame stacks: the first step (of _steps_added) whose stacks are intact
        self._first_column_row = None  # frame stacks: where sampling starts, [1, 1] on the device
        if stacked:
            self._stacks = FrameStacks(self.frame_stack, self.obs_shape, self.lane_length, self.n_envs,
                                       self.start_frames, staging_steps, device)
            self._first_column_row = DeviceBuffer(1, 1, "f32", device)
            self._first_column_sent = 0.0
        for table in self._tables():
            table.before_read = self.flush

    # ---- adding ----------------------------------------------------------------------------

    def __len__(self) -> int:
        """Transitions stored (with frame stacks: those that can be sampled, see the class docstring)."""
        if self._stacks is not None:
            return self._sampled_steps() * self.n_envs
        return (self.lane_length if self.full else self.pos) * self.n_envs

    def _sampled_steps(self) -> int:
        """Frame stacks: the newest stored steps whose stacks are intact (all but the oldest
        ones whose start frames the start ring has given to later episodes)."""
        stored = self.lane_length if self.full else self.pos
        return min(stored, self._steps_added - self._first_sampled)

    def _first_sampled_column(self) -> float:
        """Frame stacks: where device sampling starts counting columns: 0 while every stored
        step can be sampled (a uniform draw over all of them needs no offset), else the column of
        the oldest lane 0 step that can."""
        stored, sampled = self.lane_length if self.full else self.pos, self._sampled_steps()
        return 0.0 if sampled == stored else float((self.pos - sampled) % self.lane_length * self.n_envs)

    def _lanes(self, value, shape: tuple[int, ...], what: str, dtype=np.float32) -> np.ndarray:
        arr = np.asarray(value, dtype=dtype)
        expected = (self.n_envs, *shape)
        if arr.shape != expected and not (shape == () and arr.shape == (self.n_envs, 1)):
            raise ValueError(f"ReplayBuffer.add: {what} has shape {arr.shape}, expected {expected} "
                             f"(leading dimension n_envs={self.n_envs})")
        return arr.reshape(self.n_envs, -1)

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> None:
        """Stores one step of every environment (column ``pos * n_envs + e`` for env e). It
        reaches the device tables at the latest when something reads them (see ``flush``). Into
        i32 or u8 tables, values must be whole numbers in the dtype's range (ValueError). With
        frame stacks, obs and next_obs must be uint8 frame stacks that continue the lane's last
        step (the class docstring says what is checked); nothing is stored when a check fails."""
        if self._stacks is not None:
            obs, next_obs = self._stacks.check(obs, next_obs)  # [n_envs, k, frame_bytes] u8 each
        elif self._keyed is not None:
            obs, next_obs = self._keyed.check(obs, next_obs)  # {key: [n_envs, rows]} each
        else:
            for what, value in (("obs", obs), ("next_obs", next_obs)):
                check_integer_values(value, self._obs.dtype, f"ReplayBuffer.add: {what}")
            # integers convert exactly once checked: no float copy of a u8 image
            obs_type = NUMPY_DTYPES[self._obs.dtype] if self._obs.dtype in ("u8", "i32") else np.float32
            obs = self._lanes(obs, self.obs_shape, "obs", obs_type)  # [n_envs, obs_rows]
            next_obs = self._lanes(next_obs, self.obs_shape, "next_obs", obs_type)
        check_integer_values(action, self._action.dtype, "ReplayBuffer.add: action")
        action = self._lanes(action, self.action_shape, "action")
        rewards = self._lanes(reward, (), "reward").reshape(-1)
        terminated = self._lanes(terminated, (), "terminated", bool).reshape(-1)
        truncated = self._lanes(truncated, (), "truncated", bool).reshape(-1)
        slot = self._staging_slot()
        self._staged_action[slot] = action
        if self._stacks is not None:
            self._stacks.add(self._steps_added, obs, next_obs, terminated | truncated)
        elif self._keyed is not None:
            self._keyed.stage(slot, obs, next_obs)
        elif self._staged_next_obs is not None:
            self._staged_obs[slot] = obs
            self._staged_next_obs[slot] = next_obs
        else:
            self._staged_obs[slot] = obs
            self._newest_next[:] = next_obs
            column = self.pos * self.n_envs
            for e in range(self.n_envs):  # the lane's next column will hold the next episode's start
                self._final_obs.pop(column + e, None)
                if truncated[e] and not terminated[e]:
                    self._final_obs[column + e] = next_obs[e].copy()
        self._advance(1, rewards, terminated, truncated)
        if self._stacks is not None:
            self._stop_sampling_before(self._stacks.intact_from)

    def extend(self, obs, action, reward, next_obs, terminated, truncated) -> None:
        """Stores k steps of every environment: each argument is k of what ``add`` takes, stacked
        (leading dimensions [k, n_envs]), and the result is that of k ``add`` calls in order: a
        step that a check refuses raises, the steps before it stored. A buffer of one observation
        table (no frame stacks, dict observations or optimize_memory) given arrays that need no
        value check (floats, or integers of the tables' own dtypes) stores them in one pass per
        run of ring steps; otherwise, and in subclasses that extend ``add``, each step is an add."""
        k = _steps_given(obs=obs, action=action, reward=reward, next_obs=next_obs, terminated=terminated,
                         truncated=truncated)
        steps = self._bulk_steps(obs, action, reward, next_obs, terminated, truncated)
        if steps is None:
            for i in range(k):
                self.add(_step_of(obs, i), action[i], reward[i], _step_of(next_obs, i), terminated[i], truncated[i])
            return
        obs, action, reward, next_obs, terminated, truncated = steps
        done = 0
        while done < k:
            slot = self._staging_slot()
            # a run of ring steps that fits in the staging area and ends at the latest at the ring's end
            run = min(k - done, self._staging_steps - slot, self.lane_length - self.pos)
            given, slots = slice(done, done + run), slice(slot, slot + run)
            self._staged_obs[slots] = obs[given]
            self._staged_next_obs[slots] = next_obs[given]
            self._staged_action[slots] = action[given]
            self._advance(run, reward[given], terminated[given], truncated[given])
            done += run

    def _staging_slot(self) -> int:
        """The staging slot of the next step, after flushing a full staging area (memory stays
        bounded while nothing reads)."""
        if self._n_staged == self._staging_steps:
            self.flush()
        if self._n_staged == 0:
            self._first_staged = self.pos
        return self._n_staged

    def _advance(self, steps: int, rewards, terminated, truncated) -> None:
        """Writes the host rows of ``steps`` ring steps from ``pos`` on (rewards and flags
        [steps, n_envs], or [n_envs] for one step), whose observations and actions are staged,
        and moves the write position past them."""
        ring = slice(self.pos, self.pos + steps)
        self._reward[ring], self._terminated[ring], self._truncated[ring] = rewards, terminated, truncated
        self._n_staged += steps
        self.pos = (self.pos + steps) % self.lane_length
        self.full = self.full or self.pos == 0
        self._steps_added += steps

    def _bulk_steps(self, obs, action, reward, next_obs, terminated, truncated) -> tuple | None:
        """What ``extend`` was given as arrays of the staging areas' dtypes, observations and
        actions [k, n_envs, rows], rewards and flags [k, n_envs], where the buffer stores steps in
        bulk and the arrays need no check besides their shapes; else None."""
        if (type(self).add is not ReplayBuffer.add or self._stacks is not None or self._keyed is not None
                or self.optimize_memory):
            return None
        arrays = [np.asarray(value) for value in (obs, action, reward, next_obs, terminated, truncated)]
        k = len(arrays[2])
        shapes = [(k, self.n_envs, *self.obs_shape), (k, self.n_envs, *self.action_shape), (k, self.n_envs),
                  (k, self.n_envs, *self.obs_shape), (k, self.n_envs), (k, self.n_envs)]
        tables = [self._staged_obs, self._staged_action, self._reward, self._staged_next_obs, self._terminated,
                  self._truncated]
        for arr, shape, table in zip(arrays, shapes, tables):
            kind = table.dtype.kind
            unchecked = arr.dtype == table.dtype or (kind == "f" and arr.dtype.kind in "fiu")
            if arr.shape != shape or not unchecked:
                return None
        return tuple(arr.reshape(k, *table.shape[1:]) for arr, table in zip(arrays, tables))

    def truncate_episodes(self) -> None:
        """Ends every lane's running episode where it stands, as a truncation: the environments
        were reset without those episodes' ends being added (a resumed run, a learn call that
        resets, set_env). Each lane's newest step that did not end its episode is marked
        truncated, its true next observation kept, so that no n-step return, frame stack or next
        observation reaches into the episode that the lane's next add begins."""
        if len(self) == 0:
            return
        newest = (self.pos - 1) % self.lane_length
        running = ~(self._terminated[newest] | self._truncated[newest])  # [n_envs]
        if not running.any():
            return
        self.flush()
        self._truncated[newest] |= running
        if self._obs is not None and self._next_obs is None:  # optimize_memory: a lane's next column is the next episode's
            for lane in np.flatnonzero(running):
                self._final_obs[newest * self.n_envs + int(lane)] = self._newest_next[lane].copy()
        if self._stacks is not None:
            self._stacks.start_episodes(running)
        self._restore_device_rows()

    def _stop_sampling_before(self, step: int) -> None:
        """Frame stacks: steps before ``step`` (counted as _steps_added) are no longer sampled."""
        if step <= self._first_sampled:
            return
        oldest_stored = max(self._first_sampled, self._steps_added - self.lane_length)
        steps = np.arange(oldest_stored, step) % self.lane_length
        self._first_sampled = step
        if steps.size:
            columns = steps[:, None] * self.n_envs + np.arange(self.n_envs)  # [steps, n_envs]
            self._stopped_sampling(columns.reshape(-1))

    def _stopped_sampling(self, columns: np.ndarray) -> None:
        """Called with the columns a frame-stack buffer stops sampling (a prioritized buffer
        sets their priorities to 0)."""

    def _sampleable(self, columns: np.ndarray) -> np.ndarray:
        """Whether each column holds a transition that can be sampled (frame stacks: one of
        the newest _sampled_steps(); otherwise any column)."""
        if self._stacks is None:
            return np.ones(np.shape(columns), bool)
        sampled = self._sampled_steps()
        age = (self.pos - 1 - np.asarray(columns) // self.n_envs) % self.lane_length  # 0: the newest step
        return age < sampled

    def flush(self) -> None:
        """Sends the steps added since the last flush to the device tables: one write per table,
        two where the steps wrap around the ring. The tables run it themselves before they are
        read, so calling it is never needed for correctness (only to time the upload)."""
        n = self._n_staged
        if n == 0:
            return
        first = self._first_staged
        steps = self._ring_steps(first, n)
        terminated, truncated = self._terminated[steps], self._truncated[steps]
        self._send(self._action, first, self._staged_action[:n])
        if self._stacks is not None:
            self._stacks.flush(self._send)
            column = self._first_sampled_column()
            if column != self._first_column_sent:  # changes only once steps stop being sampled early
                self._first_column_row.write(np.array([[column]], np.float32))
                self._first_column_sent = column
        elif self._keyed is not None:
            self._keyed.flush(first, n, self._send)
        else:
            self._send(self._obs, first, self._staged_obs[:n])
        if self._next_obs is not None:
            self._send(self._next_obs, first, self._staged_next_obs[:n])
        self._send(self._reward_row, first, self._reward[steps])
        self._send(self._terminated_row, first, terminated.astype(np.float32))
        self._send(self._ended_row, first, (terminated | truncated).astype(np.float32))
        if self._stop_row is not None:
            # The step before these was the newest when it was sent (a stop); now it stops only
            # where its episode ended (before the very first step, an unwritten step: 0 over 0).
            # The last step sent is the newest: its successor is not written yet.
            previous_first = (first - 1) % self.lane_length
            with_previous = self._ring_steps(previous_first, n + 1)
            stop = (self._terminated[with_previous] | self._truncated[with_previous]).astype(np.float32)
            stop[-1] = 1.0
            self._send(self._stop_row, previous_first, stop)
        self._n_staged = 0

    def _ring_steps(self, first: int, k: int) -> np.ndarray:
        """Ring steps first .. first + k - 1, wrapped at the end of the ring."""
        return (first + np.arange(k)) % self.lane_length

    def _send(self, table: DeviceBuffer, first: int, steps: np.ndarray, ring_length: int | None = None) -> None:
        """Writes ``steps`` [k, n_envs(, rows)] to ring steps first .. first + k - 1 (mod
        ``ring_length``, lane_length by default): one write, or two where the run passes the end
        of the ring."""
        until_end = min(len(steps), (ring_length or self.lane_length) - first)
        for step, part in ((first, steps[:until_end]), (0, steps[until_end:])):
            if len(part):
                # column t * n_envs + e; the values were checked by add
                table._write_checked(part.reshape(-1, table.rows).T, step * self.n_envs)

    def _tables(self) -> list[DeviceBuffer]:
        """The device tables ``add`` fills."""
        tables = [self._obs, self._next_obs, self._action, self._reward_row, self._terminated_row, self._ended_row,
                  self._stop_row]
        if self._stacks is not None:
            tables += [self._stacks.frames, self._stacks.stack_index, self._first_column_row]
        if self._keyed is not None:
            tables += self._keyed.tables()
        return [table for table in tables if table is not None]

    def _all_tables(self) -> list[DeviceBuffer]:
        """Every device table the buffer holds (a subclass adds its own)."""
        return self._tables()

    @property
    def nbytes(self) -> int:
        """Bytes of device memory the buffer's tables hold."""
        return sum(table.nbytes for table in self._all_tables())

    @property
    def device(self) -> str:
        """The device holding the buffer's tables."""
        return self._action.device

    @classmethod
    def estimate_nbytes(cls, capacity: int, obs_shape, action_shape, n_envs: int = 1, obs_dtype: str | dict = "f32",
                        action_dtype: str = "f32", optimize_memory: bool = False, n_step: int = 1,
                        frame_stack: int | None = None, start_frames: int | None = None, **_) -> int:
        """The device bytes a buffer made with these arguments would hold (``nbytes``), computed
        from the settings without allocating anything; other constructor arguments are ignored."""
        action_shape = _shape(action_shape, "action_shape")
        lane_length = positive_int(capacity, "capacity") // positive_int(n_envs, "n_envs")
        columns = lane_length * n_envs
        nbytes = math.prod(action_shape) * columns * _itemsize(action_dtype)
        nbytes += (3 + (n_step > 1)) * columns * 4  # reward, terminated, ended (and stop) rows, f32
        if isinstance(obs_shape, Mapping):  # a table of observations and one of next observations per key
            return nbytes + keyed_row_bytes(keyed_specs(obs_shape, obs_dtype, _shape)) * columns * 2
        obs_shape = _shape(obs_shape, "obs_shape")
        if frame_stack is None:
            return nbytes + math.prod(obs_shape) * columns * _itemsize(obs_dtype) * (1 if optimize_memory else 2)
        start_frames = default_start_frames(columns, frame_stack, n_envs) if start_frames is None else start_frames
        frames = math.prod(obs_shape[1:]) * frame_columns(lane_length, n_envs, frame_stack, start_frames)  # u8
        return nbytes + frames + (frame_stack + 1) * columns * 4 + 4  # + stack_index (i32) + the first column

    # ---- sampling --------------------------------------------------------------------------

    def _draw_steps(self, batch_size: int) -> np.ndarray:
        """Uniform ring steps among those that can be sampled: the stored ones, less (with
        optimize_memory) the newest, whose next observation is not stored yet; with frame stacks,
        the newest _sampled_steps()."""
        if self._stacks is not None:
            sampled = self._sampled_steps()
            if sampled <= 0:
                raise ValueError("ReplayBuffer.sample: the buffer holds no transition that can be sampled yet")
            return (self.pos - sampled + self._rng.integers(0, sampled, batch_size)) % self.lane_length
        stored = self.lane_length if self.full else self.pos
        newest = (self.pos - 1) % self.lane_length
        n_valid = stored - 1 if self.optimize_memory and stored > 0 else stored
        if n_valid <= 0:
            raise ValueError("ReplayBuffer.sample: the buffer holds no transition that can be sampled yet")
        steps = self._rng.integers(0, n_valid, batch_size)
        if self.optimize_memory:  # skip over the newest step (which lies inside 0 .. stored - 1)
            steps = np.where(steps >= newest, steps + 1, steps)
        return steps

    def sample(self, batch_size: int) -> ReplaySamples:
        """A uniform batch of transitions with their n-step returns."""
        positive_int(batch_size, "ReplayBuffer.sample: batch_size")
        t = self._draw_steps(batch_size)
        e = self._rng.integers(0, self.n_envs, batch_size)
        return self._gather(t, e)

    def _gather(self, t: np.ndarray, e: np.ndarray) -> ReplaySamples:
        ret, done, discount, last = self._n_step(t, e)
        index = (t * self.n_envs + e).astype(np.int32)
        last_index = (last * self.n_envs + e).astype(np.int32)
        device = self.device
        columns = rc.tensor(index[None, :], device=device)  # in range by construction: sent once, reused
        return ReplaySamples(
            obs=self._obs_at(columns),
            action=rc.get_rows(self._action, columns),
            reward=rc.tensor(ret[None, :], device=device),
            next_obs=self._next_obs_at(last, e, last_index, columns if self.n_step == 1 else None),
            done=rc.tensor(done[None, :].astype(np.float32), device=device),
            discount=rc.tensor(discount[None, :], device=device),
            index=index,
        )

    def _n_step(self, t: np.ndarray, e: np.ndarray):
        """The n-step sums of the transitions at ring steps ``t`` of lanes ``e``: the definition
        ``_n_step_on_device`` computes again on the device (and is tested against). The rewards
        of up to ``n_step`` consecutive steps of the lane, discounted, the sum stopping after a
        step that terminated or was truncated, or at the newest step stored (with
        optimize_memory, before it: its next observation is not stored yet). Returns (return,
        done: a summed step terminated, gamma^k for the k steps summed, the last step summed)."""
        newest = (self.pos - 1) % self.lane_length
        ret = np.zeros(t.size, np.float32)
        discount = np.ones(t.size, np.float32)
        done = np.zeros(t.size, bool)
        last = t.copy()
        alive = np.ones(t.size, bool)
        for k in range(self.n_step):
            step = (t + k) % self.lane_length
            if self.optimize_memory:  # the newest step's successor is not stored yet
                alive &= (step != newest) | (k == 0)
            ret += np.where(alive, discount * self._reward[step, e], 0.0).astype(np.float32)
            last = np.where(alive, step, last)
            discount = np.where(alive, discount * self.gamma, discount).astype(np.float32)
            ended = self._terminated[step, e] | self._truncated[step, e]
            done |= alive & self._terminated[step, e]
            alive &= ~ended & (step != newest)
        return ret, done, discount, last

    def sample_on_device(self, batch_size: int, stored=None) -> ReplaySamples:
        """A uniform batch drawn on the device from the engine's counter-based generator
        (``rc.manual_seed``): the same draws on both backends, and nothing crosses from the host,
        so it can sit inside a captured update. ``stored`` is the number of transitions stored,
        a [1, 1] tensor (pass it as an input of a captured function) or a number (default: now);
        a number or an input above ``len(self)`` (or below 1) raises ValueError.
        n-step returns are summed on the device; not with next-observation sharing."""
        if self.optimize_memory:
            raise ValueError("ReplayBuffer.sample_on_device: not with optimize_memory")
        positive_int(batch_size, "ReplayBuffer.sample_on_device: batch_size")
        device = self.device
        stored = self._stored_for_device_sampling(stored, "ReplayBuffer.sample_on_device")
        # columns fill in order (t * n_envs + e), so the stored ones are 0 .. stored - 1
        index = rc.ops.randint(stored, (1, batch_size), device=device)  # [1, B]
        if self._stacks is not None:  # counted from the first column that can be sampled
            index = self._columns_from_first_sampled(index)
        return self._transitions_on_device(index)

    def _columns_from_first_sampled(self, offset: Tensor) -> Tensor:
        """Frame stacks: the columns ``offset`` [1, B] i32 past the first one that can be sampled
        (read from the device, so a captured sampler follows it), wrapped at the capacity
        (exact in f32 below 2^24)."""
        column = rc.add(rc.cast(offset, "f32"), self._first_column_row.__rlkit_buffer__())  # [1, B]
        column = rc.sub(column, rc.scale(rc.ge(column, float(self.capacity)), float(self.capacity)))
        return rc.cast(column, "i32")

    def _obs_at(self, columns: Tensor) -> Tensor:
        """The observations of the transitions at ``columns`` [1, B], on the device."""
        if self._stacks is not None:
            return self._stacks.stacks(columns, next_obs=False)  # [*image, B] u8
        if self._keyed is not None:
            return self._keyed.gather(columns)  # {key: [*shape, B]}
        return self._as_images(rc.get_rows(self._obs, columns))

    def _as_images(self, columns: Tensor) -> Tensor:
        """u8 observations of more than one axis [obs_rows, B] in the image layout
        [*image_shape, B] (the same bytes); others as they are."""
        if self._sample_shape is None:
            return columns
        return rc.reshape(columns, (*self._sample_shape, columns.shape[-1]))  # [*image, B]

    def _transitions_on_device(self, index: Tensor, weights: Tensor | None = None) -> ReplaySamples:
        """The (n-step) transitions starting at the columns ``index`` [1, B], gathered on the device."""
        if self.n_step == 1:
            last, reward = index, rc.get_rows(self._reward_row, index)
            done = rc.get_rows(self._terminated_row, index)
            discount = rc.full(index.shape, self.gamma, dtype="f32", device=index.device)
        else:
            reward, done, discount, last = self._n_step_on_device(index)
        if self._stacks is not None:
            next_obs = self._stacks.stacks(last, next_obs=True)  # [*image, B] u8
        elif self._keyed is not None:
            next_obs = self._keyed.gather(last, next_obs=True)  # {key: [*shape, B]}
        else:
            next_obs = self._as_images(rc.get_rows(self._next_obs, last))
        return ReplaySamples(obs=self._obs_at(index), action=rc.get_rows(self._action, index),
                             reward=reward, next_obs=next_obs, done=done,
                             discount=discount, index=index, weights=weights)

    def n_step_returns_on_device(self, index: Tensor):
        """The n-step sums starting at the columns ``index`` [1, k] (``n_step`` of the buffer),
        on the device: (discounted return, done, gamma^steps, the last column summed)."""
        if self.n_step == 1:
            raise ValueError("ReplayBuffer.n_step_returns_on_device: the buffer was made with n_step=1")
        return self._n_step_on_device(index)

    def _n_step_on_device(self, index: Tensor):
        """``_n_step`` (the definition) on the device, for the columns ``index``, in column
        arithmetic: step k of a lane is column index + k * n_envs (mod capacity), and the sum stops
        after a step whose stop flag is set (``flush`` sets it at episode ends and the newest
        step). Columns are exact in f32 (below 2^24). Returns (return, done, gamma^k, last
        column). tests/test_replay.py checks it equals ``_n_step`` on every stored column."""
        column = rc.cast(index, "f32")  # [1, B]
        alive = rc.full(index.shape, 1.0, dtype="f32", device=index.device)  # 1 while the sum goes on
        ret, done = rc.scale(alive, 0.0), rc.scale(alive, 0.0)
        discount, last = alive, column
        for k in range(self.n_step):
            step = rc.add(column, float(k * self.n_envs))
            step = rc.cast(rc.sub(step, rc.scale(rc.ge(step, float(self.capacity)), float(self.capacity))), "i32")
            ret = ret + alive * discount * rc.get_rows(self._reward_row, step)
            last = last + alive * (rc.cast(step, "f32") - last)
            done = done + alive * rc.get_rows(self._terminated_row, step)
            discount = discount * (1.0 - alive * (1.0 - self.gamma))
            alive = alive * (1.0 - rc.get_rows(self._stop_row, step))
        return ret, done, discount, rc.cast(last, "i32")

    def _stored_for_device_sampling(self, stored, where: str):
        """``stored`` as given (a [1, 1] tensor or a number), or the count stored now. A number,
        and a captured function's input at each replay, must be a whole number from 1 to
        ``len(self)`` (a tensor computed on the device is not read back to be checked)."""
        if stored is None:
            stored = float(len(self))
        if isinstance(stored, Tensor):
            runtime.check_replay_input(stored, lambda values: self._check_stored(float(values.reshape(-1)[0]), where))
            return stored
        if isinstance(stored, bool) or not isinstance(stored, numbers.Real):
            raise TypeError(f"{where}: stored must be a number or a [1, 1] tensor, got {type(stored).__name__}")
        self._check_stored(stored, where)
        return float(stored)

    def _check_stored(self, stored, where: str) -> None:
        if len(self) == 0:
            raise ValueError(f"{where}: the buffer is empty")
        if not (1 <= stored <= len(self) and float(stored).is_integer()):
            raise ValueError(f"{where}: stored must be a whole number from 1 to the {len(self)} transitions stored, "
                             f"got {stored!r}")

    def _next_obs_at(self, last: np.ndarray, e: np.ndarray, last_index: np.ndarray,
                      columns: Tensor | None = None) -> Tensor:
        """The bootstrap observations; ``columns`` is last_index already on the device."""
        if self._stacks is not None or self._keyed is not None:
            columns = columns if columns is not None else rc.tensor(last_index[None, :], device=self.device)
            if self._stacks is not None:
                return self._stacks.stacks(columns, next_obs=True)  # [*image, B] u8
            return self._keyed.gather(columns, next_obs=True)  # {key: [*shape, B]}
        if self._next_obs is not None:
            return self._as_images(rc.get_rows(self._next_obs, columns if columns is not None else last_index))
        successor = ((last + 1) % self.lane_length * self.n_envs + e).astype(np.int32)
        next_obs = rc.get_rows(self._obs, successor)
        patches = [(j, self._final_obs[int(c)]) for j, c in enumerate(last_index) if int(c) in self._final_obs]
        if not patches:
            return self._as_images(next_obs)
        values = next_obs.numpy()  # truncated episodes: the true final observations from the side table
        for j, column in patches:
            values[:, j] = column
        return self._as_images(rc.tensor(values, device=next_obs.device))
