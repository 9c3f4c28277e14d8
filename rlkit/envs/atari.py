"""Atari with the standard preprocessing, built from Gymnasium's own wrappers (ale-py from PyPI:
``pip install rlkit[atari]``).

``make_atari(env_id)`` gives what DQN on Atari is trained and evaluated on (Mnih et al., 2015;
Machado et al., 2018), as SB3's AtariWrapper and CleanRL's dqn_atari.py do:

- AtariPreprocessing: up to 30 no-op actions at reset, every 4th frame (the max of the last two,
  against flicker), 84x84 grayscale uint8;
- for training only: a lost life ends the episode as ``terminated`` (EpisodicLife: the game
  goes on at the next reset, which is a real one only at game over) and rewards are clipped to
  their sign; evaluation plays whole games with the game's own rewards;
- FireReset where the game needs FIRE to start (Breakout, ...);
- FrameStackObservation(4): observations (4, 84, 84) uint8, channel first.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

FRAME_STACK_METADATA = "rlkit.frame_stack"
"""The metadata key that tells an agent a vector environment's observations are frame stacks of
that size (rlkit.agents.observations.frame_stack_of reads it)."""

ATARI_DQN_DEFAULTS = dict(buffer_size=100_000, learning_rate=1e-4, batch_size=32, learning_starts=100_000,
                          target_update_interval=1000, train_freq=4, gradient_steps=1, exploration_fraction=0.1,
                          exploration_final_eps=0.01)
"""RL Zoo's DQN hyperparameters for Atari (hyperparams/dqn.yml, ``atari``), which DQN takes for
an Atari id where the user does not set them; the rest are DQN's defaults (gamma 0.99, Huber
loss, gradients clipped to norm 10, target updated whole: tau 1)."""


def _import_ale():
    """ale_py, with its environments registered; a clear error where the extra is missing."""
    try:
        import ale_py
    except ImportError as error:
        raise ImportError("Atari environments need ale-py: pip install 'rlkit[atari]' (or pip install ale-py)") from error
    gym.register_envs(ale_py)
    return ale_py


def is_atari_id(env_id) -> bool:
    """Whether ``env_id`` names an Atari game: the ``ALE/`` namespace (``ALE/Pong-v5``) or the
    older ``*NoFrameskip-v4`` / ``*-v4`` ids ale-py registers."""
    if not isinstance(env_id, str):
        return False
    if env_id.startswith("ALE/"):
        return True
    if "NoFrameskip" in env_id or env_id.endswith("Deterministic-v4"):
        return True
    spec = gym.registry.get(env_id)
    return spec is not None and str(spec.entry_point).startswith("ale_py")


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode (``terminated``), so that the value of a state does not
    count on lives to come; ``reset`` resets the game only once it is over, and otherwise goes
    on from where the life was lost (one no-op step)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._lives = 0
        self._game_over = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self._lives:
            terminated = True
        self._lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self._game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op ended the game: start a new one
                obs, info = self.env.reset(**kwargs)
        self._lives = self.env.unwrapped.ale.lives()
        self._game_over = False
        return obs, info


class FireReset(gym.Wrapper):
    """Presses FIRE after every reset, for games that wait for it (the agent would otherwise have
    to discover that the game only starts on FIRE)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        if len(meanings) < 3 or meanings[1] != "FIRE":
            raise ValueError(f"FireReset: the game's action 1 is {meanings[1] if len(meanings) > 1 else None!r}, "
                             "expected FIRE (use needs_fire_reset to decide)")

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


def needs_fire_reset(env: gym.Env) -> bool:
    """Whether the game's second action is FIRE (and it has at least three): SB3's rule."""
    meanings = env.unwrapped.get_action_meanings()
    return len(meanings) >= 3 and meanings[1] == "FIRE"


def _atari_env(env_id: str, training: bool, frame_stack: int, env_kwargs: dict) -> gym.Env:
    """One preprocessed Atari environment (see the module's docstring)."""
    # AtariPreprocessing skips frames itself: the emulator must return every frame
    env = gym.make(env_id, **{**env_kwargs, "frameskip": 1})
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True,
                                          terminal_on_life_loss=False, scale_obs=False)
    if training:
        env = EpisodicLife(env)
    if needs_fire_reset(env):
        env = FireReset(env)
    if training:
        env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(r)))
    return gym.wrappers.FrameStackObservation(env, frame_stack)


def make_atari(env_id: str, n_envs: int = 1, seed: int | None = None, training: bool = True, frame_stack: int = 4,
               vectorization_mode: str = "sync", **env_kwargs):
    """An Atari game with the standard preprocessing (the module's docstring): one Gymnasium
    environment for ``n_envs=1``, else a vector environment of ``n_envs`` (``"sync"`` or
    ``"async"``: one process each) that resets finished episodes in the same step, as rlkit's
    agents step them. ``training=False`` is the evaluation form (whole games, unclipped
    rewards). ``seed`` seeds the spaces (the agent seeds the resets). ``env_kwargs`` go to
    ``gym.make`` (e.g. ``repeat_action_probability``)."""
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"make_atari: env_id must be an Atari id such as 'ALE/Pong-v5', got {env_id!r}")
    if isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1:
        raise ValueError(f"make_atari: n_envs must be a positive int, got {n_envs!r}")
    if isinstance(frame_stack, bool) or not isinstance(frame_stack, int) or frame_stack < 1:
        raise ValueError(f"make_atari: frame_stack must be a positive int, got {frame_stack!r}")
    _import_ale()
    if not is_atari_id(env_id):
        raise ValueError(f"make_atari: {env_id!r} is not an Atari id (expected e.g. 'ALE/Pong-v5' or "
                         "'PongNoFrameskip-v4')")

    def make() -> gym.Env:
        return _atari_env(env_id, training, frame_stack, env_kwargs)

    if n_envs == 1:
        env = make()
        if seed is not None:
            env.action_space.seed(seed)
            env.observation_space.seed(seed)
        return env
    if vectorization_mode not in ("sync", "async"):
        raise ValueError(f"make_atari: vectorization_mode must be 'sync' or 'async', got {vectorization_mode!r}")
    vector_class = gym.vector.SyncVectorEnv if vectorization_mode == "sync" else gym.vector.AsyncVectorEnv
    env = vector_class([make] * n_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env.metadata = {**env.metadata, FRAME_STACK_METADATA: frame_stack}  # an async env's wrappers are out of sight
    if seed is not None:
        env.action_space.seed(seed)
        env.observation_space.seed(seed)
    return env
