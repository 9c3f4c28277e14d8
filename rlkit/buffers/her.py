"""HerReplayBuffer: Hindsight Experience Replay (Andrychowicz et al., 2017) on a device replay
buffer, with the contract of SB3's HerReplayBuffer (``n_sampled_goal``, the ``future``,
``final`` and ``episode`` goal selection strategies, the environment's ``compute_reward``).

Observations are goal-environment dicts with the keys ``achieved_goal`` and ``desired_goal``
(float vectors of one shape), stored key by key (keyed.py). Of a batch of B, the first
``int(B * (1 - 1 / (n_sampled_goal + 1)))`` transitions are relabelled, as SB3's: their desired
goal (in obs and next_obs) becomes the next achieved goal of a step of the same lane and
episode, chosen by the strategy, and their reward is recomputed for it; the others are the
transitions as stored. Strategies, as SB3's (``future`` inclusive of the transition itself):

- ``future``: a step from the transition's own to the episode's last, uniformly;
- ``final``: the episode's last step;
- ``episode``: any step of the episode, uniformly.

Episodes still running at sample time end, for this, at the newest step stored (SB3 samples
none of their transitions instead); the steps of an episode that the ring has overwritten are
never chosen (``episode`` draws from the steps still stored).

Goal selection and gathering run on the device. Each column keeps how many steps of its
episode came before it and follow it (-1 while the episode runs; the episode's columns are
rewritten when it ends), beside its ring step, and the buffer keeps the newest and oldest ring
steps, so the goal's column is column arithmetic inside the captured update. Rewards:

- ``reward_function="sparse_distance"`` (-1 where ||achieved - desired|| > ``distance_threshold``,
  else 0: the Fetch and point tasks' reward) or ``"bit_equal"`` (-1 where any entry differs, else
  0: the bit-flipping task's) are computed on the device: the whole update, relabelling included,
  stays one device program.
- ``reward_function=None`` calls ``compute_reward(achieved_goal, desired_goal, infos)`` (the
  environment's, any reward at all) on the host. Python cannot run inside a replay, so then the
  transitions, their goals and the rewards are drawn on the host (the same strategies, from the
  same host mirror of the episodes) before every replay of an update, ``HOST_DRAW_SLOTS`` batches
  at a time, and sent to the device in one write; the program gathers the observations by them.
  The cost: a host draw and a ``compute_reward`` call per batch, and one upload per replay.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

import rlkit.core as rc
from rlkit.buffers.device_buffer import DeviceBuffer
from rlkit.buffers.replay import ReplayBuffer, ReplaySamples
from rlkit.core.checks import positive_int
from rlkit.core.tensor import Tensor

GOAL_SELECTION_STRATEGIES = ("future", "final", "episode")
"""SB3's goal selection strategies."""
DEVICE_REWARD_FUNCTIONS = ("sparse_distance", "bit_equal")
"""The rewards computed on the device (reward_function); None calls compute_reward on the host."""
HOST_DRAW_SLOTS = 16
"""Batches the host path draws before each replay: one per sample a captured program takes (a
program of more samples would reuse them; DQN's take at most 16)."""
GOAL_KEYS = ("achieved_goal", "desired_goal")


def env_compute_reward(env) -> Callable | None:
    """The ``compute_reward(achieved_goal, desired_goal, infos)`` of ``env`` (its first
    environment for a vector of them, as SB3 calls it), or None where it has none."""
    if hasattr(env, "env_method") and hasattr(env, "num_envs"):  # an SB3 VecEnv
        if not env.has_attr("compute_reward"):
            return None
        return lambda achieved, desired, infos: env.env_method("compute_reward", achieved, desired, infos,
                                                               indices=[0])[0]
    first = env.envs[0] if hasattr(env, "envs") else env  # a Gymnasium SyncVectorEnv's first, or env itself
    return getattr(getattr(first, "unwrapped", first), "compute_reward", None)


class HerReplayBuffer(ReplayBuffer):
    """A ReplayBuffer of goal-environment dict observations whose samples are relabelled with
    hindsight goals (the module docstring). ``obs_shape`` (a dict) must hold ``achieved_goal`` and
    ``desired_goal`` of one shape, stored as f32. ``compute_reward`` is the environment's (needed
    where ``reward_function`` is None; set it after ``load``, which cannot save it). The host
    path's batches, of ``batch_size`` transitions, go to a device table made here (a table made
    inside a capture would be part of the program); it samples no other size. Not with n-step
    returns (the relabelled reward is one step's)."""

    def __init__(self, capacity: int, obs_shape, action_shape, n_sampled_goal: int = 4,
                 goal_selection_strategy: str = "future", reward_function: str | None = None,
                 distance_threshold: float = 0.05, compute_reward: Callable | None = None,
                 copy_info_dict: bool = False, batch_size: int = 256, **kwargs):
        if not isinstance(obs_shape, Mapping) or any(key not in obs_shape for key in GOAL_KEYS):
            given = list(obs_shape) if isinstance(obs_shape, Mapping) else obs_shape
            raise ValueError(f"HerReplayBuffer: observations must be dicts with the keys {list(GOAL_KEYS)} (a goal "
                             f"environment's), got obs_shape {given}")
        if kwargs.get("n_step", 1) != 1:
            raise ValueError("HerReplayBuffer: not with n-step returns (a relabelled reward is one step's)")
        self.n_sampled_goal = positive_int(n_sampled_goal, "HerReplayBuffer: n_sampled_goal")
        if goal_selection_strategy not in GOAL_SELECTION_STRATEGIES:
            raise ValueError(f"HerReplayBuffer: goal_selection_strategy must be one of {GOAL_SELECTION_STRATEGIES}, "
                             f"got {goal_selection_strategy!r}")
        if reward_function is not None and reward_function not in DEVICE_REWARD_FUNCTIONS:
            raise ValueError(f"HerReplayBuffer: reward_function must be one of {DEVICE_REWARD_FUNCTIONS} (computed on "
                             f"the device) or None (compute_reward on the host), got {reward_function!r}")
        if copy_info_dict:
            raise ValueError("HerReplayBuffer: copy_info_dict=True is not supported: compute_reward gets an empty "
                             "info dict per transition (SB3's default)")
        if not (isinstance(distance_threshold, (int, float)) and 0 <= distance_threshold < math.inf):
            raise ValueError(f"HerReplayBuffer: distance_threshold must be a finite number >= 0, "
                             f"got {distance_threshold!r}")
        self.goal_selection_strategy, self.reward_function = goal_selection_strategy, reward_function
        self.distance_threshold = float(distance_threshold)
        self.compute_reward = compute_reward
        self.batch_size = positive_int(batch_size, "HerReplayBuffer: batch_size")
        super().__init__(capacity, obs_shape, action_shape, **kwargs)
        shapes = [self.obs_shape[key] for key in GOAL_KEYS]
        if shapes[0] != shapes[1] or any(self.obs_dtype[key] != "f32" for key in GOAL_KEYS):
            raise ValueError(f"HerReplayBuffer: achieved_goal and desired_goal must be f32 of one shape, got "
                             f"{[(self.obs_shape[k], self.obs_dtype[k]) for k in GOAL_KEYS]}")
        goal_rows = math.prod(shapes[0])
        device = kwargs.get("device")
        lanes = (self.lane_length, self.n_envs)
        # host mirrors of the episodes (what the device rows are sent from, and the host path reads)
        self._from_start = np.zeros(lanes, np.float32)  # steps of the episode before each one
        self._to_end = np.full(lanes, -1.0, np.float32)  # steps after it, -1 while the episode runs
        self._next_achieved = np.zeros((*lanes, goal_rows), np.float32)  # the host path's rewards read these
        self._episode_first = np.zeros(self.n_envs, np.int64)  # each lane's running episode's first step (_steps_added)
        self._dirty = 0  # the newest steps whose episode rows changed since the last flush
        self._from_start_row = DeviceBuffer(1, self.capacity, "f32", device)
        self._to_end_row = DeviceBuffer(1, self.capacity, "f32", device)
        self._step_row = DeviceBuffer(1, self.capacity, "f32", device)  # each column's ring step, fixed
        self._step_row.write(np.repeat(np.arange(self.lane_length, dtype=np.float32), self.n_envs)[None, :])
        self._ring_row = DeviceBuffer(2, 1, "f32", device)  # [[newest ring step], [oldest ring step]]
        for table in (self._from_start_row, self._to_end_row, self._ring_row):
            table.before_read = self.flush
        self._drawn = None  # the host path's batches: [column, goal column, reward] rows, a slot of B per sample
        if reward_function is None:
            self._drawn = DeviceBuffer(3, HOST_DRAW_SLOTS * self.batch_size, "f32", device)
            self._drawn.before_read = self._draw_on_host
        self._next_slot = 0

    # ---- episodes -------------------------------------------------------------------------------

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> None:
        """ReplayBuffer.add, and the step's place in its episode: an episode that ends here
        has the counts of its stored steps written."""
        step, first_step = self.pos, self._steps_added
        super().add(obs, action, reward, next_obs, terminated, truncated)  # checks everything first
        ended = (np.asarray(terminated) | np.asarray(truncated)).reshape(-1)
        self._next_achieved[step] = np.asarray(next_obs["achieved_goal"], np.float32).reshape(self.n_envs, -1)
        before = first_step - self._episode_first  # [n_envs]
        self._from_start[step] = before
        self._to_end[step] = -1.0
        written = self._end_episodes(step, first_step, before, np.flatnonzero(ended))
        self._dirty = min(self.lane_length, max(self._dirty + 1, written))

    def _end_episodes(self, step: int, step_number: int, before: np.ndarray, lanes: np.ndarray) -> int:
        """Writes the counts of the stored steps of ``lanes``' episodes, which end at ring step
        ``step`` (step number ``step_number``, ``before`` [n_envs] steps after each one's first);
        the most steps written in a lane."""
        written = 1
        for lane in lanes:
            stored = int(min(before[lane] + 1, self.lane_length))  # an episode longer than the ring lost its start
            back = np.arange(stored)
            self._to_end[(step - back) % self.lane_length, lane] = back
            self._episode_first[lane] = step_number + 1
            written = max(written, stored)
        return written

    def truncate_episodes(self) -> None:
        """ReplayBuffer.truncate_episodes, and the cut episodes' counts written as at their end."""
        if len(self) == 0:
            return
        newest, step_number = (self.pos - 1) % self.lane_length, self._steps_added - 1
        running = ~(self._terminated[newest] | self._truncated[newest])  # [n_envs]
        self._end_episodes(newest, step_number, step_number - self._episode_first, np.flatnonzero(running))
        super().truncate_episodes()  # which rewrites every device row, these episodes' counts included

    def flush(self) -> None:
        """ReplayBuffer.flush, and the episode rows of the steps changed since the last one,
        with the newest and oldest ring steps."""
        super().flush()
        if self._dirty == 0:
            return
        first = (self.pos - self._dirty) % self.lane_length
        steps = self._ring_steps(first, self._dirty)
        self._send(self._from_start_row, first, self._from_start[steps])
        self._send(self._to_end_row, first, self._to_end[steps])
        self._ring_row.write(np.array([[(self.pos - 1) % self.lane_length], [self.pos if self.full else 0]],
                                      np.float32))
        self._dirty = 0

    # ---- sampling ---------------------------------------------------------------------------------

    def sample(self, batch_size: int) -> ReplaySamples:
        """A relabelled batch, as ``sample_on_device`` draws it (HER samples on the device only)."""
        return self.sample_on_device(batch_size)

    def n_virtual(self, batch_size: int) -> int:
        """How many of a batch are relabelled (the first ones), as SB3 counts them."""
        her_ratio = 1 - (1.0 / (self.n_sampled_goal + 1))
        return int(her_ratio * batch_size)

    def sample_on_device(self, batch_size: int, stored=None) -> ReplaySamples:
        """A uniform batch, its first ``n_virtual(batch_size)`` transitions relabelled (the
        module docstring): on the device from the engine's generator with a device reward
        function; drawn on the host before each replay where compute_reward gives the rewards
        (``stored`` is then not read: the host knows what is stored)."""
        if self.reward_function is None:
            return self._sample_drawn_on_host(positive_int(batch_size, "HerReplayBuffer.sample_on_device: batch_size"))
        s = super().sample_on_device(batch_size, stored)
        goals = self._goal_columns_on_device(s.index)  # [1, B] i32
        return self._relabelled(s, goals, None)

    def _goal_columns_on_device(self, index: Tensor) -> Tensor:
        """The columns whose next achieved goal relabels the transitions at ``index`` [1, B]:
        ``_goal_columns`` (the host's) in column arithmetic, exact in f32 below 2^24."""
        steps, capacity = float(self.lane_length), float(self.capacity)
        column = rc.cast(index, "f32")  # [1, B]
        step = rc.get_rows(self._step_row, index)  # [1, B] ring steps
        to_end = rc.get_rows(self._to_end_row, index)
        ring = self._ring_row.__rlkit_buffer__()  # [2, 1]
        ahead = rc.sub(rc.slice_rows(ring, 0, 1), step)  # the newest step less this one, mod the ring
        ahead = rc.add(ahead, rc.scale(rc.ge(-0.5, ahead), steps))
        running = rc.ge(-0.5, to_end)  # 1 where the episode still runs: it ends, so far, at the newest step
        to_end = rc.add(to_end, rc.mul(running, rc.sub(ahead, to_end)))
        if self.goal_selection_strategy == "final":
            offset = to_end
        else:
            back = rc.scale(to_end, 0.0)  # future: from the transition on
            if self.goal_selection_strategy == "episode":  # the episode's steps still stored before it
                back = rc.sub(step, rc.slice_rows(ring, 1, 1))
                back = rc.add(back, rc.scale(rc.ge(-0.5, back), steps))
                back = rc.minimum(back, rc.get_rows(self._from_start_row, index))
            span = rc.add(rc.add(to_end, back), 1.0)  # the steps to draw from
            draw = rc.cast(rc.cast(rc.mul(rc.rand(index.shape, dtype="f32", device=index.device), span), "i32"), "f32")
            offset = rc.sub(rc.minimum(draw, rc.sub(span, 1.0)), back)  # (the minimum: u * span may round up to span)
        goal = rc.add(column, rc.scale(offset, float(self.n_envs)))  # step + offset of the same lane
        goal = rc.sub(goal, rc.scale(rc.ge(goal, capacity), capacity))
        goal = rc.add(goal, rc.scale(rc.ge(-0.5, goal), capacity))
        return rc.cast(goal, "i32")

    def _goal_columns(self, index: np.ndarray) -> np.ndarray:
        """The host's goal columns for the columns ``index``, drawn from the buffer's generator:
        the definition ``_goal_columns_on_device`` computes again."""
        step, lane = index // self.n_envs, index % self.n_envs
        to_end = self._to_end[step, lane].astype(np.int64)
        ahead = (self.pos - 1 - step) % self.lane_length
        to_end = np.where(to_end < 0, ahead, to_end)
        if self.goal_selection_strategy == "final":
            offset = to_end
        else:
            back = np.zeros_like(to_end)
            if self.goal_selection_strategy == "episode":
                oldest = self.pos if self.full else 0
                back = np.minimum((step - oldest) % self.lane_length, self._from_start[step, lane].astype(np.int64))
            offset = self._rng.integers(-back, to_end + 1)
        return ((step + offset) % self.lane_length) * self.n_envs + lane

    def _relabelled(self, s: ReplaySamples, goals: Tensor, reward: Tensor | None) -> ReplaySamples:
        """``s`` with the desired goal of its first n_virtual transitions the next achieved goal
        at ``goals`` [1, B], and their rewards ``reward`` [1, B] (the host's: every column's) or,
        where None, the device reward function's."""
        batch = goals.shape[-1]
        new_goal = rc.get_rows(self._keyed.next_obs["achieved_goal"], goals)  # [goal, B]
        position = rc.reshape(rc.arange(batch, device=goals.device), (1, batch))  # [1, B]: 0 .. B - 1
        virtual = rc.ge(float(self.n_virtual(batch)) - 0.5, position)  # [1, B]: 1 for the first n_virtual
        desired = s.obs["desired_goal"]
        relabelled = rc.add(desired, rc.mul(virtual, rc.sub(new_goal, desired)))  # [goal, B]
        if reward is None:
            recomputed = self._device_reward(s.next_obs["achieved_goal"], relabelled)  # [1, B]
            reward = rc.add(s.reward, rc.mul(virtual, rc.sub(recomputed, s.reward)))
        return s._replace(obs={**s.obs, "desired_goal": relabelled},
                          next_obs={**s.next_obs, "desired_goal": relabelled}, reward=reward)

    def _device_reward(self, achieved: Tensor, desired: Tensor) -> Tensor:
        """The reward function on the device: [goal, B] goals to [1, B] rewards."""
        error = rc.sub(achieved, desired)  # [goal, B]
        if self.reward_function == "sparse_distance":
            distance = rc.sqrt(rc.sum(rc.square(error), dim=0))  # [1, B]
            return rc.neg(rc.gt(distance, self.distance_threshold))
        return rc.neg(rc.gt(rc.sum(rc.abs(error), dim=0), 0.5))  # bit_equal: -1 where any entry differs

    def _sample_drawn_on_host(self, batch_size: int) -> ReplaySamples:
        """A batch whose columns, goal columns and rewards the host drew (``_draw_on_host``,
        before each replay of the program this is traced into, or now outside one), the
        observations gathered on the device."""
        if batch_size != self.batch_size:
            raise ValueError(f"HerReplayBuffer.sample_on_device: the host path draws batches of {self.batch_size} "
                             f"(the buffer's batch_size), got {batch_size}")
        slot, self._next_slot = self._next_slot, (self._next_slot + 1) % HOST_DRAW_SLOTS
        position = rc.reshape(rc.arange(batch_size, device=self.device), (1, batch_size))  # [1, B]
        rows = rc.get_rows(self._drawn, rc.cast(rc.add(position, float(slot * batch_size)), "i32"))  # [3, B]
        index = rc.cast(rc.slice_rows(rows, 0, 1), "i32")
        s = self._transitions_on_device(index)
        return self._relabelled(s, rc.cast(rc.slice_rows(rows, 1, 1), "i32"), rc.slice_rows(rows, 2, 1))

    def _draw_on_host(self) -> None:
        """Draws HOST_DRAW_SLOTS batches: uniform columns, their goal columns, the rewards (the
        stored ones, compute_reward's for the relabelled), written to the device at once."""
        if self.compute_reward is None:
            raise ValueError("HerReplayBuffer: reward_function is None, so compute_reward gives the relabelled "
                             "rewards: pass compute_reward (the environment's; set buffer.compute_reward after a load)")
        batch_size, stored = self.batch_size, len(self)
        if stored == 0:
            raise ValueError("HerReplayBuffer.sample_on_device: the buffer is empty")
        index = self._rng.integers(0, stored, HOST_DRAW_SLOTS * batch_size)
        goals = self._goal_columns(index)
        reward = self._reward.reshape(-1)[index].astype(np.float32)  # host row t, lane e is column t * n_envs + e
        virtual = np.arange(index.size) % batch_size < self.n_virtual(batch_size)
        if virtual.any():
            achieved = self._next_achieved.reshape(self.capacity, -1)
            rewards = self.compute_reward(achieved[index[virtual]], achieved[goals[virtual]],
                                          [{} for _ in range(int(virtual.sum()))])
            reward[virtual] = np.asarray(rewards, np.float32).reshape(-1)
        self._drawn.write(np.stack([index, goals, reward]).astype(np.float32))

    # ---- saving and size ---------------------------------------------------------------------------

    def _settings(self) -> dict:
        return {**super()._settings(), "n_sampled_goal": self.n_sampled_goal,
                "goal_selection_strategy": self.goal_selection_strategy, "reward_function": self.reward_function,
                "distance_threshold": self.distance_threshold, "batch_size": self.batch_size}

    def _extra_host_arrays(self) -> dict[str, np.ndarray]:
        return {**super()._extra_host_arrays(), "her_from_start": self._from_start, "her_to_end": self._to_end,
                "her_next_achieved": self._next_achieved, "her_episode_first": self._episode_first}

    def _restore_extra_host_arrays(self, host) -> None:
        super()._restore_extra_host_arrays(host)
        self._from_start, self._to_end = host["her_from_start"], host["her_to_end"]
        self._next_achieved, self._episode_first = host["her_next_achieved"], host["her_episode_first"]

    def _restore_device_rows(self) -> None:
        super()._restore_device_rows()
        self._dirty = self.lane_length  # every step's episode rows, at the next flush
        self.flush()

    def _all_tables(self) -> list[DeviceBuffer]:
        return [*super()._all_tables(), self._from_start_row, self._to_end_row, self._step_row, self._ring_row,
                *([self._drawn] if self._drawn is not None else [])]
