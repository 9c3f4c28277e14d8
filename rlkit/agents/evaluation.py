"""``evaluate``: an agent's returns over whole episodes, with the keywords and return values of
Stable-Baselines3's ``evaluate_policy``, on one environment or a vector of them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlkit.agents.lanes import lane_rows, make_env
from rlkit.core.checks import positive_int


class EvaluationLanes:
    """The environment an evaluation steps, as lanes: one Gymnasium environment (episode ``i``
    reset with ``seed + i``), a Gymnasium vector environment (either autoreset mode) or an SB3
    VecEnv. ``step`` says which lanes' steps belong to an episode: in Gymnasium's next-step
    autoreset mode the step after an episode's end only resets its lane (action ignored,
    reward 0), and is not counted."""

    def __init__(self, env, seed: int | None):
        import gymnasium as gym

        self.seed, self.episodes_begun = seed, 0
        if isinstance(env, gym.vector.VectorEnv):
            mode = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
            if mode == gym.vector.AutoresetMode.DISABLED:
                raise ValueError("evaluate: a vector environment must reset its lanes itself (autoreset_mode "
                                 "NEXT_STEP or SAME_STEP), got DISABLED")
            self.kind, self.next_step_reset = "gymnasium vector", mode == gym.vector.AutoresetMode.NEXT_STEP
        elif hasattr(env, "step_async") and hasattr(env, "num_envs"):
            self.kind, self.next_step_reset = "sb3 vector", False
        else:
            env = make_env(env, seed, training=False)  # an Atari id: whole games, the game's own rewards
            self.kind, self.next_step_reset = "single", False
        self.env = env
        self.n = 1 if self.kind == "single" else env.num_envs
        self._resetting = np.zeros(self.n, bool)  # lanes whose next step is a next-step autoreset

    def reset(self) -> np.ndarray:
        """The first observations, [n, *obs_shape]."""
        if self.kind == "sb3 vector":
            if self.seed is not None:
                self.env.seed(self.seed)
            return lane_rows(self.env.reset())
        if self.kind == "gymnasium vector":
            return lane_rows(self.env.reset(seed=self.seed)[0])
        return lane_rows(self._reset_single(), single=True)

    def _reset_single(self):
        seed = None if self.seed is None else self.seed + self.episodes_begun
        self.episodes_begun += 1
        return self.env.reset(seed=seed)[0]

    def step(self, actions: np.ndarray):
        """(observations to act on next, rewards, dones, per-lane infos, counted): a row per lane;
        ``counted`` is False for a lane whose step only reset it."""
        counted = ~self._resetting
        if self.kind == "sb3 vector":
            obs, rewards, dones, infos = self.env.step(actions)
            return lane_rows(obs), np.asarray(rewards, np.float64), np.asarray(dones, bool), list(infos), counted
        if self.kind == "gymnasium vector":
            obs, rewards, terminated, truncated, info = self.env.step(actions)
            dones = (np.asarray(terminated) | np.asarray(truncated)) & counted
            self._resetting = dones & self.next_step_reset
            return lane_rows(obs), np.asarray(rewards, np.float64), dones, self._lane_infos(info), counted
        obs, reward, terminated, truncated, info = self.env.step(actions[0])
        done = bool(terminated or truncated)
        if done:
            obs = self._reset_single()
        return lane_rows(obs, single=True), np.array([float(reward)]), np.array([done]), [info], counted

    def _lane_infos(self, info: dict) -> list[dict]:
        """A Gymnasium vector info (arrays by key, ``_key`` masks saying which lanes have the
        key, dicts of such arrays within) as one dict per lane, as an SB3 VecEnv gives them."""
        lanes = [{} for _ in range(self.n)]
        for key, values in info.items():
            if key.startswith("_"):
                continue
            present = np.asarray(info.get(f"_{key}", np.ones(self.n, bool)), bool)
            per_lane = self._lane_infos(values) if isinstance(values, dict) else values
            for lane in np.flatnonzero(present):
                lanes[lane][key] = per_lane[lane]
        return lanes

    def render(self) -> None:
        self.env.render()


def evaluate(agent, env, n_eval_episodes: int = 10, deterministic: bool = True, render: bool = False,
             callback: Callable[[dict, dict], None] | None = None, reward_threshold: float | None = None,
             return_episode_rewards: bool = False, warn: bool = True, *, seed: int | None = None,
             n_episodes: int | None = None) -> tuple[float, float] | tuple[list[float], list[int]]:
    """The agent's returns over ``n_eval_episodes`` episodes of ``env``, as Stable-Baselines3's
    ``evaluate_policy``: ``(mean, std)`` of the returns, or with ``return_episode_rewards`` the
    lists ``(episode_returns, episode_lengths)``.

    ``env``: an environment or its id, a Gymnasium vector environment (either autoreset mode) or
    an SB3 VecEnv. With several lanes the episodes are shared out as SB3 does (lane ``i`` counts
    ``(n_eval_episodes + i) // n_envs`` of them), so the result does not favour short episodes.
    ``callback(locals_, globals_)`` runs after each counted lane step, ``locals_`` holding SB3's
    keys (``i``, ``reward``, ``done``, ``info``, ``observations``, ``actions``, ``rewards``,
    ``dones``, ``infos``, ``episode_counts``, ...). ``reward_threshold``: AssertionError unless the
    mean return is above it. ``render`` renders after every step. ``warn`` is accepted as SB3's
    keyword and warns of nothing: rlkit sums the rewards the environment returns (SB3 warns when
    an environment lacks its Monitor wrapper, whose episode records it would read instead).

    rlkit's additions: ``seed`` (one environment: episode ``i`` reset with ``seed + i``; a vector:
    reset once with ``seed``); ``n_episodes``, the older name of ``n_eval_episodes``. A recurrent
    agent's state is carried through each lane's episode, from zeros at its start."""
    episodes = positive_int(n_eval_episodes if n_episodes is None else n_episodes, "evaluate: n_eval_episodes")
    lanes = EvaluationLanes(env, seed)
    targets = np.array([(episodes + lane) // lanes.n for lane in range(lanes.n)])
    counts = np.zeros(lanes.n, np.int64)
    current_rewards, current_lengths = np.zeros(lanes.n), np.zeros(lanes.n, np.int64)
    episode_rewards: list[float] = []
    episode_lengths: list[int] = []
    observations, state = lanes.reset(), None
    starts = np.ones(lanes.n, bool)
    while (counts < targets).any():
        actions, state = agent.predict(observations, state=state, episode_start=starts, deterministic=deterministic)
        observations, rewards, dones, infos, counted = lanes.step(actions)
        current_rewards += np.where(counted, rewards, 0.0)
        current_lengths += counted
        for lane in np.flatnonzero(counted & (counts < targets)):
            if callback is not None:
                callback({"i": int(lane), "reward": rewards[lane], "done": bool(dones[lane]), "info": infos[lane],
                          "observations": observations, "actions": actions, "rewards": rewards, "dones": dones,
                          "infos": infos, "episode_counts": counts, "episode_count_targets": targets,
                          "current_rewards": current_rewards, "current_lengths": current_lengths,
                          "n_envs": lanes.n, "model": agent, "env": lanes.env}, globals())
            if dones[lane]:
                episode_rewards.append(float(current_rewards[lane]))
                episode_lengths.append(int(current_lengths[lane]))
                counts[lane] += 1
        current_rewards[dones], current_lengths[dones] = 0.0, 0
        # a lane's next observation starts an episode where it just ended (reset in the same
        # step), or, in next-step autoreset mode, where its last step was the reset
        starts = dones if not lanes.next_step_reset else ~counted
        if render:
            lanes.render()
    mean, std = float(np.mean(episode_rewards)), float(np.std(episode_rewards))
    if reward_threshold is not None and not mean > reward_threshold:
        raise AssertionError(f"evaluate: the mean return {mean:.2f} is not above reward_threshold {reward_threshold}")
    if return_episode_rewards:
        return episode_rewards, episode_lengths
    return mean, std
