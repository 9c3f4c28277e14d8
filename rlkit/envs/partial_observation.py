"""Partially observed tasks built on Gymnasium: classic-control environments with their
velocities hidden, so that acting well needs memory (a recurrent agent estimates the velocity
from consecutive observations; a feed-forward one cannot).

``HideVelocity(env)`` drops the velocity entries of CartPole-v1 (keeping the cart position and
the pole angle) or Pendulum-v1 (keeping cos and sin of the angle). Importing rlkit.envs (done
by rlkit.agents) registers them as ``rlkit/CartPoleNoVel-v1`` and ``rlkit/PendulumNoVel-v1``
(``register``, called by rlkit/envs/__init__.py).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

POSITIONS_KEPT = {"CartPoleEnv": (0, 2), "PendulumEnv": (0, 1)}
"""The observation entries HideVelocity keeps, by environment class: everything but velocities."""

HIDDEN_VELOCITY_IDS = {"rlkit/CartPoleNoVel-v1": "CartPole-v1", "rlkit/PendulumNoVel-v1": "Pendulum-v1"}
"""The registered partially observed tasks and the environments they are built on."""


class HideVelocity(gym.ObservationWrapper):
    """Observations without their velocity entries (see POSITIONS_KEPT); the observation
    space shrinks to the kept entries, with their bounds."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        name = type(env.unwrapped).__name__
        if name not in POSITIONS_KEPT:
            raise ValueError(f"HideVelocity: knows which entries are velocities only for "
                             f"{sorted(POSITIONS_KEPT)}, got {name}")
        space = env.observation_space
        self.kept = np.array(POSITIONS_KEPT[name])
        self.observation_space = gym.spaces.Box(space.low[self.kept], space.high[self.kept], dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """The kept entries of ``observation``."""
        return np.asarray(observation)[self.kept]


def _hidden_velocity_env(base_id: str, **kwargs) -> gym.Env:
    """The base environment's class made with ``kwargs``, wrapped in HideVelocity (Gymnasium's
    make adds the time limit and names the result by the registered id)."""
    make_base = gym.envs.registration.load_env_creator(gym.spec(base_id).entry_point)
    return HideVelocity(make_base(**kwargs))


def register() -> None:
    """Registers the partially observed tasks with Gymnasium (again only if missing), with the
    base environments' episode limits (500 and 200 steps) and reward thresholds."""
    for env_id, base_id in HIDDEN_VELOCITY_IDS.items():
        if env_id not in gym.registry:
            base = gym.spec(base_id)
            gym.register(id=env_id, entry_point=_hidden_velocity_env, kwargs={"base_id": base_id},
                         max_episode_steps=base.max_episode_steps, reward_threshold=base.reward_threshold)
