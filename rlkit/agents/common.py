"""What the off-policy agents share: environments, the polyak update on the device, episode
statistics, TensorBoard run folders and evaluation."""

from __future__ import annotations

from collections import deque

import numpy as np

import rlkit.core as rc
from rlkit.core.tensor import Tensor


def make_env(env_or_id, seed: int | None = None):
    """A Gymnasium environment from an id (or the environment itself), its spaces seeded."""
    import gymnasium as gym

    env = gym.make(env_or_id) if isinstance(env_or_id, str) else env_or_id
    if not hasattr(env, "step") or not hasattr(env, "reset"):
        raise TypeError(f"expected a Gymnasium environment or its id, got {type(env_or_id).__name__}")
    if seed is not None:
        env.action_space.seed(seed)
        env.observation_space.seed(seed)
    return env


class Polyak:
    """target <- tau * source + (1 - tau) * target for paired parameters, in place on the
    device (the target's storage stays the same, so captured programs reading it see the update)."""

    def __init__(self, target: dict[str, Tensor], source: dict[str, Tensor]):
        if list(target) != list(source):
            raise ValueError("polyak: the target and source networks have different parameters")
        self.pairs = [(target[name], source[name]) for name in target]
        self._columns = [rc.tensor(np.arange(t.shape[1], dtype=np.int32)[None, :], device=t.device)
                         for t, _ in self.pairs]

    def __call__(self, tau: float) -> None:
        for (t, s), columns in zip(self.pairs, self._columns):
            mixed = s if tau == 1.0 else rc.add(rc.scale(s, tau), rc.scale(t, 1.0 - tau))
            rc.ops.apply("put_cols", (t, columns, rc.stop_gradient(mixed)))


class EpisodeStats:
    """Returns and lengths of the last 100 finished episodes (rollout/ep_rew_mean, ep_len_mean)."""

    def __init__(self, window: int = 100):
        self.returns: deque = deque(maxlen=window)
        self.lengths: deque = deque(maxlen=window)
        self.current_return, self.current_length = 0.0, 0

    def step(self, reward: float, done: bool) -> None:
        self.current_return += float(reward)
        self.current_length += 1
        if done:
            self.returns.append(self.current_return)
            self.lengths.append(self.current_length)
            self.current_return, self.current_length = 0.0, 0

    def means(self) -> tuple[float, float] | None:
        if not self.returns:
            return None
        return float(np.mean(self.returns)), float(np.mean(self.lengths))


def evaluate(agent, env, n_episodes: int = 10, seed: int | None = None) -> tuple[float, float]:
    """Mean and standard deviation of the returns of ``n_episodes`` deterministic episodes."""
    if isinstance(n_episodes, bool) or not isinstance(n_episodes, int) or n_episodes < 1:
        raise ValueError(f"evaluate: n_episodes must be a positive int, got {n_episodes!r}")
    env = make_env(env, seed)
    returns = []
    for episode in range(n_episodes):
        obs, _ = env.reset(seed=None if seed is None else seed + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(agent.predict(obs, deterministic=True))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns)), float(np.std(returns))
