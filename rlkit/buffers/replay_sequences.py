"""Sequences from a ReplayBuffer: windows of consecutive steps of one environment, masked after
an episode's end (what recurrent agents train on), drawn on the host or on the device."""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

import rlkit.core as rc
from rlkit.buffers.device_buffer import DeviceBuffer
from rlkit.core.tensor import Tensor


class SequenceSamples(NamedTuple):
    """A batch of sequences: obs and next_obs [obs_rows, T, B], action [action_rows, T, B],
    reward, terminated and mask [1, T, B] with T = burn_in + length. mask is 1 on the steps of
    the sampled episode and 0 after it ended, so no sequence crosses an episode boundary
    unmasked. next_obs is each step's true next observation (None with optimize_memory)."""

    obs: Tensor
    action: Tensor
    reward: Tensor
    terminated: Tensor
    mask: Tensor
    burn_in: int
    next_obs: Tensor | None = None
    index: Tensor | None = None  # the windows' columns, i32 [1, T * B] (time fastest)


def _window_steps(where: str, batch_size, length, burn_in) -> int:
    """burn_in + length after checking the arguments of a sequence sampler."""
    for name, value, low in (("batch_size", batch_size, 1), ("length", length, 1), ("burn_in", burn_in, 0)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ValueError(f"{where}: {name} must be an int >= {low}, got {value!r}")
    return int(burn_in) + int(length)


class SequenceSampling:
    """ReplayBuffer's sequence samplers (a base class of it: they read its tables and ring)."""

    def sample_sequences(self, batch_size: int, length: int, burn_in: int = 0) -> SequenceSamples:
        """``batch_size`` windows of ``burn_in + length`` consecutive steps of one environment
        each, starting anywhere in the stored data (never wrapping past the write position);
        steps after an episode's end inside a window are masked out."""
        window = _window_steps("ReplayBuffer.sample_sequences", batch_size, length, burn_in)
        self._refuse_sequences_of_stacks("ReplayBuffer.sample_sequences")
        stored = self.lane_length if self.full else self.pos
        if window > stored:
            raise ValueError(f"ReplayBuffer.sample_sequences: a window of {window} steps needs that many stored "
                             f"steps per environment; {stored} are stored")
        oldest = self.pos if self.full else 0  # starts run from the oldest step to the last full window
        start = (oldest + self._rng.integers(0, stored - window + 1, batch_size)) % self.lane_length
        e = self._rng.integers(0, self.n_envs, batch_size)
        steps = (start[None, :] + np.arange(window)[:, None]) % self.lane_length  # [T, B]
        ended = self._terminated[steps, e] | self._truncated[steps, e]
        # a step is masked once an earlier step of the window ended its episode
        mask = np.concatenate([np.ones((1, batch_size), bool), np.cumsum(ended, axis=0)[:-1] == 0])
        index = (steps * self.n_envs + e).reshape(-1, order="F").astype(np.int32)  # t fastest, then b
        device = self.device

        def gathered(buffer: DeviceBuffer) -> Tensor:
            return rc.reshape(rc.get_rows(buffer, index), (buffer.rows, window, batch_size))

        def host(values: np.ndarray) -> Tensor:
            return rc.tensor(values.astype(np.float32).reshape(1, window, batch_size), device=device)

        return SequenceSamples(
            obs=gathered(self._obs), action=gathered(self._action),
            reward=host(self._reward[steps, e]), terminated=host(self._terminated[steps, e]),
            mask=host(mask), burn_in=int(burn_in),
            next_obs=None if self._next_obs is None else gathered(self._next_obs),
            index=rc.tensor(index[None, :], device=device),
        )

    def _refuse_sequences_of_stacks(self, where: str) -> None:
        if self._stacks is not None:
            raise ValueError(f"{where}: not with frame_stack (sequences of stacked frames are not rebuilt)")
        if self._keyed is not None:
            raise ValueError(f"{where}: not with dict observations (sequences are sampled from one observation table)")

    def sequence_starts(self) -> np.ndarray:
        """[[oldest ring step], [ring steps stored per environment]]: what
        ``sample_sequences_on_device`` reads to place its windows (pass it as an input of a
        captured function, so every replay sees the buffer as it is then)."""
        stored = self.lane_length if self.full else self.pos
        return np.array([[self.pos if self.full else 0], [stored]], np.float32)

    def sample_sequences_on_device(self, batch_size: int, length: int, burn_in: int = 0,
                                   starts=None) -> SequenceSamples:
        """``sample_sequences`` drawn on the device from the engine's generator (as
        ``sample_on_device``): nothing crosses from the host, so it can sit inside a captured
        update. ``starts`` is ``sequence_starts()`` as a [2, 1] tensor (an input of the captured
        function), or None for the buffer as it is now. Windows never wrap past the write
        position; the buffer must hold a whole window per environment when it runs."""
        window = _window_steps("ReplayBuffer.sample_sequences_on_device", batch_size, length, burn_in)
        self._refuse_sequences_of_stacks("ReplayBuffer.sample_sequences_on_device")
        if self.optimize_memory:
            raise ValueError("ReplayBuffer.sample_sequences_on_device: not with optimize_memory")
        if window > self.lane_length:
            raise ValueError(f"ReplayBuffer.sample_sequences_on_device: a window of {window} steps is longer than "
                             f"the {self.lane_length} steps a lane holds")
        if starts is None:
            now = self.sequence_starts()
            if now[1, 0] < window:
                raise ValueError(f"ReplayBuffer.sample_sequences_on_device: a window of {window} steps needs that "
                                 f"many stored steps per environment; {int(now[1, 0])} are stored")
            starts = rc.tensor(now, device=self.device)
        return self._sequences_on_device(int(batch_size), window, int(burn_in), starts)

    def _sequences_on_device(self, batch_size: int, window: int, burn_in: int, starts: Tensor) -> SequenceSamples:
        """Windows of ``window`` steps of one lane each, in column arithmetic (exact in f32
        below 2^24): step k of a window starting at ring step s is column
        ((s + k) mod lane_length) * n_envs + lane."""
        device = self.device
        oldest, stored = rc.slice_rows(starts, 0, 1), rc.slice_rows(starts, 1, 1)  # [1, 1] each
        n_starts = rc.add(stored, float(1 - window))  # windows that fit before the write position
        first = rc.add(rc.cast(rc.ops.randint(n_starts, (1, batch_size)), "f32"), oldest)  # [1, B] ring steps
        step = rc.add(first, rc.arange(window, device=device))  # [T, B]: first + 0 .. T - 1
        step = rc.sub(step, rc.scale(rc.ge(step, float(self.lane_length)), float(self.lane_length)))
        lane = rc.cast(rc.ops.randint(float(self.n_envs), (1, batch_size), device=device), "f32")  # [1, B]
        column = rc.add(rc.scale(step, float(self.n_envs)), lane)  # [T, B]
        index = rc.reshape(rc.cast(column, "i32"), (1, window * batch_size))  # t fastest, then b

        def gathered(buffer: DeviceBuffer) -> Tensor:
            return rc.reshape(rc.get_rows(buffer, index), (buffer.rows, window, batch_size))

        ended = rc.reshape(rc.get_rows(self._ended_row, index), (window, batch_size))  # [T, B]
        ended_before = rc.sub(rc.cumsum(ended), ended)  # episode ends strictly before each step
        mask = rc.sub(1.0, rc.ge(ended_before, 0.5))  # [T, B]
        return SequenceSamples(
            obs=gathered(self._obs), action=gathered(self._action), reward=gathered(self._reward_row),
            terminated=gathered(self._terminated_row), mask=rc.reshape(mask, (1, window, batch_size)),
            burn_in=burn_in, next_obs=gathered(self._next_obs), index=index,
        )
