"""Callbacks for ``learn``: saving checkpoints and evaluating as training goes, with
Stable-Baselines3's names."""

from __future__ import annotations

import math
import os

import numpy as np

from rlkit.agents.evaluation import evaluate
from rlkit.core._checks import positive_int


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

    def __call__(self, agent, local_vars: dict) -> bool:
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

    def __call__(self, agent, local_vars: dict) -> bool:
        if agent.num_timesteps < self._next:
            return True
        self._next = agent.num_timesteps + self.eval_freq
        lengths = []
        mean, std = evaluate(agent, self.env_id, self.n_episodes, seed=self.seed, lengths=lengths)
        self.evaluations.append((agent.num_timesteps, mean, std))
        writer = local_vars.get("writer")
        if writer is not None:
            writer.add_scalar("eval/mean_reward", mean, agent.num_timesteps)
            writer.add_scalar("eval/mean_ep_length", float(np.mean(lengths)), agent.num_timesteps)
        return self.reward_threshold is None or mean < self.reward_threshold

    @property
    def best(self) -> float:
        """The best mean evaluation return so far (-inf before the first evaluation)."""
        return max((mean for _, mean, _ in self.evaluations), default=-math.inf)
