"""Callbacks for ``learn``: the event a callback receives, and callbacks that save checkpoints
and evaluate as training goes, with Stable-Baselines3's names.

A callback is any callable taking a :class:`StepEvent`, ``callback(event) -> bool | None``:
``learn`` calls it after every vector-environment step, and stops training when it returns
False (None and True go on). The event's fields are the whole interface: nothing else of the
loop reaches a callback.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rlkit.agents.episodes import EpisodeStats
from rlkit.agents.evaluation import evaluate
from rlkit.core.checks import positive_int

if TYPE_CHECKING:
    from rlkit.agents.base import OffPolicyAgent
    from rlkit.logger import SummaryWriter


@dataclass(frozen=True, slots=True)
class StepEvent:
    """What ``learn`` tells its callback after each vector-environment step (every lane
    stepped once); the arrays have a row per lane."""

    agent: OffPolicyAgent
    """The agent being trained, its deferred work (DQN's target updates) applied."""
    num_timesteps: int
    """Environment steps taken so far, summed over the lanes (``agent.num_timesteps``)."""
    actions: np.ndarray
    """The actions the lanes took, in the environment's action space: [n_envs] ints for a
    Discrete space, [n_envs, *shape] for a Box."""
    rewards: np.ndarray
    """The step's rewards, [n_envs] float32."""
    new_obs: np.ndarray
    """The observations to act on next, [n_envs, *obs_shape]; where an episode ended, the
    first observation of the next one."""
    terminated: np.ndarray
    """[n_envs] bool: the lanes whose episode reached a terminal state."""
    truncated: np.ndarray
    """[n_envs] bool: the lanes whose episode was cut short (a time limit)."""
    episodes: EpisodeStats
    """The returns and lengths of the lanes' last 100 finished episodes; ``means()`` gives
    what is logged as rollout/ep_rew_mean and rollout/ep_len_mean."""
    writer: SummaryWriter | None
    """The run's TensorBoard writer, None when the agent has no logdir."""

    @property
    def dones(self) -> np.ndarray:
        """[n_envs] bool: the lanes whose episode ended (terminated or truncated)."""
        return self.terminated | self.truncated


class CheckpointCallback:
    """A ``learn`` callback that saves the agent every ``save_freq`` environment steps to
    ``<save_path>/<name_prefix>_<steps>_steps.safetensors`` (each file written atomically), and
    with ``save_replay_buffer`` the buffer to ``<name_prefix>_replay_buffer_<steps>_steps``, as
    Stable-Baselines3's CheckpointCallback names them. ``saved`` lists the agent files."""

    def __init__(self, save_freq: int, save_path: str, name_prefix: str = "rl_model",
                 save_replay_buffer: bool = False):
        self.save_freq = positive_int(save_freq, "CheckpointCallback: save_freq")
        self.save_path, self.name_prefix, self.save_replay_buffer = save_path, name_prefix, save_replay_buffer
        self.saved: list[str] = []
        self._next = self.save_freq

    def __call__(self, event: StepEvent) -> bool:
        agent = event.agent
        if agent.num_timesteps >= self._next:
            self._next = agent.num_timesteps + self.save_freq
            os.makedirs(self.save_path, exist_ok=True)
            stem = os.path.join(self.save_path, self.name_prefix)
            if self.save_replay_buffer:
                agent.save_replay_buffer(f"{stem}_replay_buffer_{agent.num_timesteps}_steps")
            agent.save(f"{stem}_{agent.num_timesteps}_steps.safetensors")
            self.saved.append(f"{stem}_{agent.num_timesteps}_steps.safetensors")
        return True


class EvalCallback:
    """A ``learn`` callback that evaluates the agent every ``eval_freq`` environment steps on
    ``n_episodes`` deterministic episodes of ``env`` (logged as eval/mean_reward and
    eval/mean_ep_length, as Stable-Baselines3 names them), keeps every result in
    ``evaluations`` as (step, mean, std), and stops training once the mean reaches
    ``reward_threshold`` when one is given."""

    def __init__(self, env, eval_freq: int = 5000, n_episodes: int = 10, reward_threshold: float | None = None,
                 seed: int | None = None):
        self.env_id = env
        self.eval_freq = positive_int(eval_freq, "EvalCallback: eval_freq")
        self.n_episodes = positive_int(n_episodes, "EvalCallback: n_episodes")
        self.reward_threshold, self.seed = reward_threshold, seed
        self.evaluations: list[tuple[int, float, float]] = []
        self._next = self.eval_freq

    def __call__(self, event: StepEvent) -> bool:
        agent = event.agent
        if agent.num_timesteps < self._next:
            return True
        self._next = agent.num_timesteps + self.eval_freq
        lengths = []
        mean, std = evaluate(agent, self.env_id, self.n_episodes, seed=self.seed, lengths=lengths)
        self.evaluations.append((agent.num_timesteps, mean, std))
        writer = event.writer
        if writer is not None:
            writer.add_scalar("eval/mean_reward", mean, agent.num_timesteps)
            writer.add_scalar("eval/mean_ep_length", float(np.mean(lengths)), agent.num_timesteps)
        return self.reward_threshold is None or mean < self.reward_threshold

    @property
    def best(self) -> float:
        """The best mean evaluation return so far (-inf before the first evaluation)."""
        return max((mean for _, mean, _ in self.evaluations), default=-math.inf)
