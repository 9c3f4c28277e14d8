"""Environment lanes: one Gymnasium environment, or a vector environment, stepped as ``n``
lanes, each lane's true next observation kept apart from the observation to act on next; and
``make_env``, an environment from an id (``env_module``: what module an id would import)."""

from __future__ import annotations

import numpy as np

from rlkit.envs import is_atari_id, make_atari
from rlkit.envs.packages import register_for


def env_module(env_id: str) -> str | None:
    """The module ``gym.make(env_id)`` imports before it makes the environment: ``"pkg.mod"``
    for ``"pkg.mod:Env-v0"``, None for an id without a module prefix."""
    return env_id.split(":", 1)[0] if ":" in env_id else None


def make_env(env_or_id, seed: int | None = None, training: bool = True, **env_kwargs):
    """A Gymnasium environment from an id (or the environment itself), its spaces seeded. The
    package that registers the id is imported first (rlkit.envs.packages: ale_py for ALE/...);
    an Atari id gets the standard preprocessing (rlkit.envs.make_atari; ``training=False`` its
    evaluation form: whole games, unclipped rewards); ``env_kwargs`` go to the environment."""
    import gymnasium as gym

    if isinstance(env_or_id, str):
        register_for(env_or_id)
        if is_atari_id(env_or_id):
            env = make_atari(env_or_id, training=training, **env_kwargs)
        else:
            env = gym.make(env_or_id, **env_kwargs)
    else:
        env = env_or_id
    if not hasattr(env, "step") or not hasattr(env, "reset"):
        raise TypeError(f"expected a Gymnasium environment or its id, got {type(env_or_id).__name__}")
    if seed is not None:
        env.action_space.seed(seed)
        env.observation_space.seed(seed)
    return env


class EnvLanes:
    """One environment, or a Gymnasium vector environment, stepped as ``n`` lanes. ``step``
    returns the observations to act on next and, apart, each lane's true next observation (the
    final one where an episode ended), so the buffer never pairs steps of two episodes."""

    def __init__(self, env_or_id, seed: int | None, n_envs: int = 1):
        import gymnasium as gym

        self.seed = seed
        if isinstance(env_or_id, gym.vector.VectorEnv):
            if env_or_id.metadata.get("autoreset_mode") != gym.vector.AutoresetMode.SAME_STEP:
                raise ValueError("a vector environment must reset finished episodes in the same step: make it with "
                                 "vector_kwargs={'autoreset_mode': gymnasium.vector.AutoresetMode.SAME_STEP}")
            if n_envs not in (1, env_or_id.num_envs):
                raise ValueError(f"n_envs is {n_envs} but the vector environment has {env_or_id.num_envs}")
            self.env, self.vector = env_or_id, True
        elif n_envs > 1:
            if not isinstance(env_or_id, str):
                raise ValueError("n_envs > 1 needs an environment id (or pass a Gymnasium vector environment)")
            register_for(env_or_id)
            self.env = make_atari(env_or_id, n_envs) if is_atari_id(env_or_id) else gym.make_vec(env_or_id, num_envs=n_envs, vectorization_mode="sync",
                                    vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
            self.vector = True
        else:
            self.env, self.vector = make_env(env_or_id), False
        self.n = self.env.num_envs if self.vector else 1
        self.observation_space = self.env.single_observation_space if self.vector else self.env.observation_space
        self.action_space = self.env.single_action_space if self.vector else self.env.action_space
        if seed is not None:
            self.action_space.seed(seed)
            self.observation_space.seed(seed)

    @property
    def env_id(self) -> str | None:
        """The registered id of the environment, if it has one."""
        spec = self.env.spec
        return spec.id if spec is not None else None

    def reset(self) -> np.ndarray:
        """The first observation of every lane: [n, *obs_shape]."""
        obs, _ = self.env.reset(seed=self.seed)
        return np.asarray(obs) if self.vector else np.asarray(obs)[None]

    def step(self, actions: np.ndarray):
        """``(next_obs, reward, terminated, truncated, true_next_obs)``, one row per lane."""
        if not self.vector:
            obs, reward, terminated, truncated, _ = self.env.step(actions[0])
            true_next = next_obs = np.asarray(obs)[None]  # the same array unless the episode ended
            if terminated or truncated:
                obs, _ = self.env.reset()
                next_obs = np.asarray(obs)[None]
            return (next_obs, np.array([reward], np.float32), np.array([terminated]), np.array([truncated]),
                    true_next)
        obs, reward, terminated, truncated, info = self.env.step(actions)
        true_next = np.array(obs, copy=True)
        for lane in np.flatnonzero(info.get("_final_obs", ())):
            true_next[lane] = info["final_obs"][lane]
        return np.asarray(obs), np.asarray(reward, np.float32), np.asarray(terminated), np.asarray(truncated), true_next
