"""Environment lanes: one Gymnasium environment, or a vector environment, stepped as ``n``
lanes, each lane's true next observation kept apart from the observation to act on next; and
``make_env`` and ``make_vector_env``, environments from an id (``env_module``: what module an id would import)."""

from __future__ import annotations

import numpy as np

from rlkit.envs import is_atari_id, make_atari
from rlkit.envs.packages import register_for


def lane_rows(obs, single: bool = False):
    """Observations as arrays of their own with a row per lane (a dict of them, by key, for a
    Dict space's); ``single``: one environment's observation, given a lane axis of one. Copied:
    an environment may write its next observation into the array it returned (Gymnasium's
    vector envs with ``copy=False`` do), and the loop keeps a step's arrays until it stores them."""
    if isinstance(obs, dict):
        return {key: lane_rows(value, single) for key, value in obs.items()}
    return np.array(obs)[None] if single else np.array(obs)


def set_row(rows, lane: int, value) -> None:
    """Writes one lane's observation ``value`` (a dict for a Dict space) into lane rows."""
    if isinstance(rows, dict):
        for key in rows:
            rows[key][lane] = value[key]
    else:
        rows[lane] = value


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
    """One environment, a Gymnasium vector environment (either autoreset mode) or an SB3 VecEnv,
    stepped as ``n`` lanes. ``step`` returns the observations to act on next and, apart, each
    lane's true next observation (the final one where an episode ended), so the buffer never
    pairs steps of two episodes.

    Gymnasium's default NEXT_STEP mode would spend the step after an episode's end on the reset
    (the action ignored, reward 0: not a transition to store); the lanes reset such a lane at
    once instead (``reset(options={"reset_mask": ...})``), so every step taken is a transition,
    as in SAME_STEP mode. An SB3 VecEnv resets in its step and keeps the final observation in
    ``infos[i]["terminal_observation"]``; ``TimeLimit.truncated`` says a truncation."""

    def __init__(self, env_or_id, seed: int | None, n_envs: int = 1):
        import gymnasium as gym

        self.seed = seed
        self.next_step_reset = False  # a Gymnasium vector env in NEXT_STEP mode: reset done lanes at once
        if isinstance(env_or_id, gym.vector.VectorEnv):
            mode = env_or_id.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
            if mode not in (gym.vector.AutoresetMode.SAME_STEP, gym.vector.AutoresetMode.NEXT_STEP):
                raise ValueError(f"a vector environment must reset finished episodes itself (autoreset_mode "
                                 f"NEXT_STEP, the default, or SAME_STEP), got {mode}")
            self.next_step_reset = mode == gym.vector.AutoresetMode.NEXT_STEP
            self.kind = "vector"
        elif hasattr(env_or_id, "step_async") and hasattr(env_or_id, "num_envs"):
            self.kind = "sb3"  # an SB3 VecEnv (DummyVecEnv, SubprocVecEnv, ...)
        elif n_envs > 1:
            if not isinstance(env_or_id, str):
                raise ValueError("n_envs > 1 needs an environment id (or pass a vector environment)")
            env_or_id, self.kind = make_vector_env(env_or_id, n_envs), "vector"
        else:
            env_or_id, self.kind = make_env(env_or_id), "single"
        self.env, self.vector = env_or_id, self.kind != "single"
        if self.vector and n_envs not in (1, self.env.num_envs):
            raise ValueError(f"n_envs is {n_envs} but the vector environment has {self.env.num_envs}")
        self.n = self.env.num_envs if self.vector else 1
        if self.kind == "vector":
            self.observation_space, self.action_space = self.env.single_observation_space, self.env.single_action_space
        else:
            self.observation_space, self.action_space = self.env.observation_space, self.env.action_space
        if seed is not None:
            self.action_space.seed(seed)
            self.observation_space.seed(seed)
        # Whether the environments step in other processes (Gymnasium's AsyncVectorEnv, SB3's
        # SubprocVecEnv), so that step_async returns at once and the caller can work (run its
        # gradient steps) while they step.
        self.steps_in_background = (isinstance(self.env, gym.vector.AsyncVectorEnv) if self.kind == "vector"
                                    else self.kind == "sb3" and type(self.env).__name__ == "SubprocVecEnv")

    @property
    def env_id(self) -> str | None:
        """The registered id of the environment, if it has one."""
        spec = getattr(self.env, "spec", None)
        return spec.id if spec is not None else None

    def reset(self) -> np.ndarray:
        """The first observation of every lane: [n, *obs_shape]."""
        if self.kind == "sb3":
            if self.seed is not None:
                self.env.seed(self.seed)
            return lane_rows(self.env.reset())
        obs, _ = self.env.reset(seed=self.seed)
        return lane_rows(obs, single=not self.vector)

    def step_async(self, actions: np.ndarray) -> None:
        """Starts a step of every lane with ``actions`` where ``steps_in_background``;
        ``step_wait`` finishes it."""
        self.env.step_async(actions)

    def step_wait(self):
        """The started step's ``(next_obs, reward, terminated, truncated, true_next_obs)``."""
        if self.kind == "sb3":
            return self._sb3_result(*self.env.step_wait())
        return self._vector_result(*self.env.step_wait())

    def step(self, actions: np.ndarray):
        """``(next_obs, reward, terminated, truncated, true_next_obs)``, one row per lane."""
        if self.kind == "single":
            obs, reward, terminated, truncated, _ = self.env.step(actions[0])
            true_next = next_obs = lane_rows(obs, single=True)  # the same array unless the episode ended
            if terminated or truncated:
                obs, _ = self.env.reset()
                next_obs = lane_rows(obs, single=True)
            return (next_obs, np.array([reward], np.float32), np.array([terminated]), np.array([truncated]),
                    true_next)
        if self.kind == "sb3":
            return self._sb3_result(*self.env.step(actions))
        return self._vector_result(*self.env.step(actions))

    def _vector_result(self, obs, reward, terminated, truncated, info):
        terminated, truncated = np.array(terminated), np.array(truncated)  # arrays of their own, as lane_rows
        true_next = lane_rows(obs)  # a second copy: the final observations are written into it
        for lane in np.flatnonzero(info.get("_final_obs", ())):  # SAME_STEP keeps the final ones here
            set_row(true_next, lane, info["final_obs"][lane])
        done = terminated | truncated
        if self.next_step_reset and done.any():  # obs holds the final observations: reset those lanes now
            obs, _ = self.env.reset(options={"reset_mask": done})
        return lane_rows(obs), np.array(reward, np.float32), terminated, truncated, true_next

    def _sb3_result(self, obs, reward, dones, infos):
        dones = np.asarray(dones, bool)
        truncated = np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos]) & dones
        true_next = lane_rows(obs)  # a second copy: the terminal observations are written into it
        for lane in np.flatnonzero(dones):
            set_row(true_next, lane, infos[lane]["terminal_observation"])
        return lane_rows(obs), np.asarray(reward, np.float32), dones & ~truncated, truncated, true_next


def make_vector_env(env_id: str, n_envs: int, **env_kwargs):
    """``n_envs`` environments of ``env_id`` (made with ``env_kwargs``) in one sync vector env
    that resets finished episodes in the same step (an Atari id: make_atari's)."""
    import gymnasium as gym

    register_for(env_id)
    if is_atari_id(env_id):
        return make_atari(env_id, n_envs, **env_kwargs)
    return gym.make_vec(env_id, num_envs=n_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}, **env_kwargs)
