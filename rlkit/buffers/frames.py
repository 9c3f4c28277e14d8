"""Frame stacks stored frame by frame: what a ReplayBuffer made with ``frame_stack=k`` keeps
on the device instead of observation tables.

Consecutive observations of a frame stack (Gymnasium's ``FrameStackObservation``: the stack
axis first, each new stack the previous one less its oldest frame plus a new frame) share k - 1
frames, so each frame is stored once, in a u8 table ``frames`` [frame_bytes, n_frames], and a
transition keeps k + 1 frame numbers in an i32 table ``stack_index`` [k + 1, capacity]: rows
0 .. k - 1 are its observation's frames, rows 1 .. k its next observation's. A sample gathers
the frame numbers of its columns, then the frames (``rc.get_rows`` twice, on the device).

The frame table has three parts:

- one frame per transition, the newest frame of its true next observation (the final one at
  an episode's end, so truncations bootstrap from the right stack), slot
  ``(step mod (lane_length + k)) * n_envs + lane``: k steps more than the transition ring
  holds, because a frame is part of the stacks of the k steps after its own;
- a ring of ``start_frames`` slots for the frames of an episode's first observation that no
  earlier step holds: one frame with Gymnasium's default padding (``padding_type="reset"``
  repeats the reset frame, and equal neighbours share a slot), one with ``"zero"`` padding,
  up to k for a stack of k different frames;
- one frame of zeros, for any frame of a first observation that is all zeros.

Nothing here assumes a padding rule: the frames of a first observation are stored as they
come, so samples give back exactly what the environment returned. When episodes are so short
that the start ring laps while steps that use its oldest frames are still stored, those steps
(the oldest stored) stop being sampled (``intact_from``) rather than show another episode's frame.
"""

from __future__ import annotations

import math

import numpy as np

import rlkit.core as rc
from rlkit.buffers.device_buffer import DeviceBuffer
from rlkit.core.tensor import Tensor

START_FRAMES_PER_STEP = 1 / 32
"""The default start ring: a slot per 32 transitions (Atari episodes run hundreds of steps)."""


def image_shape(obs_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The tensor shape of one observation of numpy shape ``obs_shape`` (C order), in rlkit's
    column-major layout: the axes reversed ((C, H, W) gives [W, H, C], (H, W, C) gives
    [C, W, H]: the same bytes), the leading axes merged where more than 3 would leave no room
    for the batch ((k, H, W, C) gives [C * W, H, k])."""
    shape = list(reversed(obs_shape))
    while len(shape) > 3:
        shape[0:2] = [shape[0] * shape[1]]
    return tuple(shape)


def minimum_start_frames(frame_stack: int, n_envs: int) -> int:
    """The fewest start slots that never take a frame of a step being added: more than the
    k * n_envs * k slots the last k steps can take (k per lane per step at most)."""
    return frame_stack * frame_stack * n_envs + 1


def default_start_frames(capacity: int, frame_stack: int, n_envs: int) -> int:
    """The start ring's slots when the buffer is not told: a slot per 32 transitions, and at
    least the minimum."""
    return max(int(capacity * START_FRAMES_PER_STEP), minimum_start_frames(frame_stack, n_envs))


def frame_columns(lane_length: int, n_envs: int, frame_stack: int, start_frames: int) -> int:
    """Columns of the frame table: the transitions' frames, the start ring, the zero frame."""
    return (lane_length + frame_stack) * n_envs + start_frames + 1


class FrameStacks:
    """The frames and stack indices of a ReplayBuffer's observations (see the module's
    docstring). ``check`` refuses steps that are not frame stacks before anything changes;
    ``add`` stores a checked step, ``flush`` sends the staged steps to the device, ``stacks``
    rebuilds observations on the device."""

    def __init__(self, frame_stack: int, obs_shape: tuple[int, ...], lane_length: int, n_envs: int,
                 start_frames: int, staging_steps: int, device: str | None):
        self.k, self.obs_shape, self.n_envs = frame_stack, obs_shape, n_envs
        self.lane_length, self.frame_period = lane_length, lane_length + frame_stack
        self.frame_bytes = math.prod(obs_shape[1:])
        self.sample_shape = image_shape(obs_shape)
        self.start_frames = start_frames
        self.start_base = self.frame_period * n_envs  # the first slot of the start ring
        self.zero_slot = self.start_base + start_frames
        columns = frame_columns(lane_length, n_envs, frame_stack, start_frames)
        self.frames = DeviceBuffer(self.frame_bytes, columns, "u8", device)  # all zeros: the zero slot too
        self.stack_index = DeviceBuffer(frame_stack + 1, lane_length * n_envs, "i32", device)
        self._start_owner = np.full(start_frames, -1, np.int64)  # the step each start slot was taken at
        self._next_start = 0  # the start slot to take next (a ring, oldest first)
        self.intact_from = 0  # the first step whose stacks still have all their frames
        # each lane's last next observation and its frame slots: the next step must continue it
        self._last_next = np.zeros((n_envs, frame_stack, self.frame_bytes), np.uint8)
        self._next_slots = np.zeros((n_envs, frame_stack), np.int64)
        self._starting = np.ones(n_envs, bool)  # lanes whose next step begins an episode
        self._staged_frames = np.empty((staging_steps, n_envs, self.frame_bytes), np.uint8)
        self._staged_rows = np.empty((staging_steps, n_envs, frame_stack + 1), np.int32)
        self._n_staged = 0
        self._first_staged = 0  # the step (counted from the first add) of the first staged row

    # ---- adding ----------------------------------------------------------------------------

    def check(self, obs, next_obs) -> tuple[np.ndarray, np.ndarray]:
        """obs and next_obs as [n_envs, k, frame_bytes] u8 views, or a ValueError (nothing
        changes): not uint8 arrays of [n_envs, *obs_shape], a next observation that does not
        continue its observation as a frame stack, or an observation that is not its lane's
        last next observation though that step did not end its episode."""
        obs, next_obs = self._frames_of(obs, "obs"), self._frames_of(next_obs, "next_obs")
        k = self.k
        continues = np.all(next_obs[:, :-1] == obs[:, 1:], axis=(1, 2))  # [n_envs]
        if not continues.all():
            lane = int(np.flatnonzero(~continues)[0])
            raise ValueError(f"ReplayBuffer.add: next_obs of lane {lane} does not continue obs as a frame stack of "
                             f"{k} (next_obs[{lane}][:{k - 1}] differs from obs[{lane}][1:]); with frame_stack={k} "
                             f"observations must be stacks of {k} frames, the stack axis first, as Gymnasium's "
                             "FrameStackObservation gives them")
        follows = self._starting | np.all(obs == self._last_next, axis=(1, 2))
        if not follows.all():
            lane = int(np.flatnonzero(~follows)[0])
            raise ValueError(f"ReplayBuffer.add: obs of lane {lane} is not the next_obs of that lane's previous step, "
                             "which did not end its episode (terminated and truncated were False); with frame_stack, "
                             "add every step of every lane in order")
        return obs, next_obs

    def _frames_of(self, value, what: str) -> np.ndarray:
        arr = np.asarray(value)
        if arr.dtype != np.uint8:
            raise ValueError(f"ReplayBuffer.add: {what} must be a uint8 array (the frames as the environment gives "
                             f"them, scaled on the device), got {arr.dtype}")
        expected = (self.n_envs, *self.obs_shape)
        if arr.shape != expected:
            raise ValueError(f"ReplayBuffer.add: {what} has shape {arr.shape}, expected {expected} "
                             f"(leading dimension n_envs={self.n_envs}, then {self.k} stacked frames)")
        return arr.reshape(self.n_envs, self.k, self.frame_bytes)

    def add(self, step: int, obs: np.ndarray, next_obs: np.ndarray, ended: np.ndarray) -> None:
        """Stores the checked step number ``step`` (counted from the first add): the frames of
        its lanes' first observations (where an episode begins), its next observations' newest
        frames and the frame numbers of its stacks (staged until ``flush``)."""
        rows = np.empty((self.n_envs, self.k + 1), np.int64)
        for lane in range(self.n_envs):
            rows[lane, :-1] = self._start_slots(obs[lane], step) if self._starting[lane] else self._next_slots[lane]
        rows[:, -1] = (step % self.frame_period) * self.n_envs + np.arange(self.n_envs)
        self._next_slots = rows[:, 1:].copy()
        np.copyto(self._last_next, next_obs)
        self._starting = ended.copy()
        if self._n_staged == 0:
            self._first_staged = step
        self._staged_frames[self._n_staged] = next_obs[:, -1]
        self._staged_rows[self._n_staged] = rows
        self._n_staged += 1

    def _start_slots(self, stack: np.ndarray, step: int) -> np.ndarray:
        """Frame slots for a first observation [k, frame_bytes]: the zero frame for frames of
        zeros, the slot of the frame before for a repeat, a new start slot (written now) for the rest."""
        slots = np.empty(self.k, np.int64)
        for j, frame in enumerate(stack):
            if not frame.any():
                slots[j] = self.zero_slot
            elif j > 0 and np.array_equal(frame, stack[j - 1]):
                slots[j] = slots[j - 1]
            else:
                slots[j] = self._take_start_slot(step)
                self.frames.write(frame[:, None], int(slots[j]))  # [frame_bytes, 1]
        return slots

    def _take_start_slot(self, step: int) -> int:
        """The oldest start slot; the steps whose stacks used its frame (its owner's step and the
        k - 1 after it) are no longer intact."""
        ring = self._next_start
        self._next_start = (ring + 1) % self.start_frames
        owner = int(self._start_owner[ring])
        if owner >= 0:
            self.intact_from = max(self.intact_from, owner + self.k)
            if self.intact_from > step:  # minimum_start_frames rules this out
                raise RuntimeError("FrameStacks: the start ring is too small for the steps being added")
        self._start_owner[ring] = step
        return self.start_base + ring

    def flush(self, send) -> None:
        """Sends the staged steps with ``send(table, first_ring_step, steps, ring_length)``."""
        n = self._n_staged
        if n == 0:
            return
        first = self._first_staged
        send(self.frames, first % self.frame_period, self._staged_frames[:n], self.frame_period)
        send(self.stack_index, first % self.lane_length, self._staged_rows[:n], self.lane_length)
        self._n_staged = 0

    # ---- sampling ----------------------------------------------------------------------------

    def stacks(self, columns: Tensor, next_obs: bool) -> Tensor:
        """The observations (or, with ``next_obs``, the next observations) of the transitions
        at ``columns`` [1, B] i32: u8 [*sample_shape, B], rebuilt from their frames on the device."""
        batch = columns.shape[1]
        rows = rc.get_rows(self.stack_index, columns)  # [k + 1, B] frame numbers
        frame_numbers = rc.slice_rows(rows, 1 if next_obs else 0, self.k)  # [k, B]
        flat = rc.reshape(frame_numbers, (1, self.k * batch))  # frame j of sample b at j + k * b
        frames = rc.get_rows(self.frames, flat)  # [frame_bytes, k * B] u8
        return rc.reshape(frames, (*self.sample_shape, batch))  # [*sample_shape, B]

    def start_episodes(self, lanes: np.ndarray) -> None:
        """The next step of each lane where ``lanes`` [n_envs] is True begins an episode."""
        self._starting |= lanes

    # ---- saving ------------------------------------------------------------------------------

    def host_state(self) -> dict[str, np.ndarray]:
        """What ``restore`` needs beside the device tables (staged steps are flushed first)."""
        return {"frames_last_next": self._last_next, "frames_next_slots": self._next_slots,
                "frames_starting": self._starting, "frames_start_owner": self._start_owner,
                "frames_counters": np.array([self._next_start, self.intact_from], np.int64)}

    def restore(self, host) -> None:
        """Takes back what ``host_state`` gave (KeyError or ValueError where it is incomplete)."""
        for name, target in (("frames_last_next", self._last_next), ("frames_next_slots", self._next_slots),
                             ("frames_starting", self._starting), ("frames_start_owner", self._start_owner)):
            value = np.asarray(host[name])
            if value.shape != target.shape:
                raise ValueError(f"{name} has shape {value.shape}, expected {target.shape}")
            np.copyto(target, value)
        self._next_start, self.intact_from = (int(v) for v in host["frames_counters"])
