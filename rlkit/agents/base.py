"""The base of the off-policy agents: the environment loop, acting and logging.

An agent subclasses :class:`OffPolicyAgent` and supplies its networks (``_build``), how it
explores (``_explore``) and acts (``_act``), its gradient steps (``_train``, or the captured
updates of update_rounds.py) and what it saves (``_state_objects``, written by saving.py);
everything between the environment and those pieces is here.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import asdict

import gymnasium as gym
import numpy as np

import rlkit.core as rc
from rlkit.agents.acting import AgentPolicy, default_device, policy_input, policy_inputs
from rlkit.agents.callbacks import BaseCallback, StepEvent, convert_callback
from rlkit.agents.episodes import EpisodeStats
from rlkit.agents.keywords import DEVICE_NAMES, config_from_keywords, split_policy_and_env
from rlkit.agents.lanes import EnvLanes
from rlkit.agents.dict_observations import check_dict_space
from rlkit.agents.flat_observations import FlatObservationLayout
from rlkit.agents.observations import ObservationLayout
from rlkit.agents.onnx_export import export_policy
from rlkit.agents.recorder import Recorder
from rlkit.agents.saving import Saving
from rlkit.agents.update_rounds import LaunchedUpdate, UpdateRounds
from rlkit.buffers import HerReplayBuffer, ReplayBuffer
from rlkit.buffers.her import env_compute_reward
from rlkit.core.checks import positive_int
from rlkit.core.tensor import Tensor
from rlkit.logger import SummaryWriter, run_dir


def env_id_of(env) -> str | None:
    """The Gymnasium id ``env`` is: the id itself, or the id an environment (or a Gymnasium
    vector environment) was made from (its ``spec``); None where it has none (an SB3 VecEnv, an
    environment built by hand)."""
    if isinstance(env, str):
        return env
    return getattr(getattr(env, "spec", None), "id", None)


class FiniteCheck:
    """learn's check of the observations and rewards the environment returns: at the first NaN
    or infinity, ``mode="raise"`` raises ValueError naming the timestep, the lane and what was
    not finite (before it reaches the buffer); ``"warn"`` warns, once per learn call, and trains
    on. An update on a NaN transition would skip itself (its gradients are not finite), and so
    would every later one that samples it: training would go on learning nothing."""

    MODES = ("raise", "warn")

    def __init__(self, algo: str, mode: str):
        if mode not in self.MODES:
            raise ValueError(f"{algo}.learn: check_finite must be one of {self.MODES}, got {mode!r}")
        self.algo, self.mode, self.warned = algo, mode, False

    def __call__(self, timestep: int, what: str, values) -> None:
        """Checks ``values`` [n_lanes, ...], the ``what`` (observation or reward) of each lane at
        ``timestep`` (a dict of them: each key's): one isfinite pass over the array where all is well."""
        if isinstance(values, dict):
            for key, value in values.items():
                self(timestep, f"{what}[{key!r}]", value)
            return
        if values.dtype.kind != "f" or _all_finite(values):
            return
        flat = values.reshape(values.shape[0], -1)
        lane = int(np.flatnonzero(~np.isfinite(flat).all(axis=1))[0])
        index = int(np.flatnonzero(~np.isfinite(flat[lane]))[0])
        value = flat[lane, index]
        where = f"element {index} is {value}" if flat.shape[1] > 1 else f"it is {value}"
        message = (f"{self.algo}.learn: the environment returned a non-finite {what} at timestep {timestep}, "
                   f"lane {lane} ({where})")
        if self.mode == "raise":
            raise ValueError(f"{message}; learn(..., check_finite='warn') trains on regardless")
        if not self.warned:
            self.warned = True
            warnings.warn(f"{message}; later ones in this learn call are not reported", RuntimeWarning, stacklevel=4)


def _all_finite(values: np.ndarray) -> bool:
    """Whether every element of a float array is finite. A step's few numbers (an observation
    vector, a reward per lane) are checked as Python floats: 0.6 us for a CartPole observation,
    where numpy's isfinite and all took 2.1, twice or more every environment step."""
    if values.size <= 64:
        return all(map(math.isfinite, values.ravel().tolist()))
    return bool(np.isfinite(values).all())


def stack_steps(steps: list) -> np.ndarray | dict[str, np.ndarray]:
    """Per-step arrays [n, ...] (or dicts of them) stacked into [k, n, ...] (a dict of each key's):
    joined along their lane axis and reshaped, a third of np.stack's time for a run of small
    arrays (it makes a view of each first)."""
    if isinstance(steps[0], dict):
        return {key: stack_steps([step[key] for step in steps]) for key in steps[0]}
    return np.concatenate(steps).reshape(len(steps), *steps[0].shape)


class OffPolicyAgent(UpdateRounds, Saving):
    """The environment loop, acting and logging of an off-policy agent; its gradient steps'
    rounds come from UpdateRounds (update_rounds.py), its parameters and files from Saving
    (saving.py).

    Subclasses set ``algo`` and ``config_class`` (an OffPolicyConfig subclass) and define ``_build`` (networks, optimizers,
    the replay buffer ``self.buffer`` and the captured updates), ``_explore`` (actions while
    training), ``_act`` (the policy's forward, captured per batch size), ``_train`` (gradient steps) and
    ``_state_objects`` (what ``save`` writes).

    ``skipped_updates`` counts the gradient updates that skipped themselves because their
    gradients were not finite (see ``rc.update_step``); it is logged as
    ``train/skipped_updates``.
    """

    algo = ""
    config_class: type = type(None)
    _learn_start, _learn_total = 0, 0  # the current (or last) learn call's first timestep and length

    def __init__(self, env_or_id=None, config=None, device: str | None = None, seed: int | None = None,
                 logdir: str | None = None, *, env=None, policy: str | None = None, **hyperparameters):
        """An agent on ``env_or_id`` (a Gymnasium environment, its id, or a vector environment)
        with ``config`` (default: the config class's defaults) on ``device``.

        As Stable-Baselines3's constructors: ``Agent("MlpPolicy", env, learning_rate=1e-3)`` (the
        policy name first; see keywords.POLICY_NAMES), hyperparameters as keywords (the config's
        field names, which override ``config``'s, and SB3's: ``policy_kwargs=dict(net_arch=...)``,
        ``tensorboard_log`` for ``logdir``, ``verbose``, ``train_freq=(n, "step")``,
        ``gradient_steps=-1``, ``action_noise``), ``device="auto"`` or ``"cuda"``. An unknown
        keyword raises TypeError listing the valid ones."""
        self.policy_name, env, config = split_policy_and_env(self.algo, env_or_id, config, env, policy,
                                                             self.config_class)
        if config is None:
            config = self.default_config(env)  # DQN's Atari settings for an Atari id, under the keywords
        if not isinstance(config, self.config_class):
            raise TypeError(f"{self.algo}: config must be a {self.config_class.__name__}, got {type(config).__name__}")
        n_lanes = getattr(env, "num_envs", None) or hyperparameters.get("n_envs") or getattr(config, "n_envs", 1)
        config, options = config_from_keywords(self.algo, self.config_class, config, hyperparameters, n_lanes)
        if "tensorboard_log" in options:
            if logdir is not None:
                raise TypeError(f"{self.algo}: give the log folder once, as logdir= or as SB3's tensorboard_log=")
            logdir = options["tensorboard_log"]
        self.verbose = options.get("verbose", 0)
        """SB3's verbosity, kept for callbacks to read (rlkit prints no training table)."""
        self.config = config
        self.lanes = EnvLanes(env, seed, config.n_envs)
        self.env = self.lanes.env
        self.observation_space, self.action_space = self.lanes.observation_space, self.lanes.action_space
        self._check_spaces()
        self._discrete = isinstance(self.action_space, gym.spaces.Discrete)  # asked at every step
        self.device = DEVICE_NAMES.get(device, device) or rc.device()
        self.seed, self.logdir = seed, logdir
        self.n_obs = int(np.prod(self.observation_space.shape or ()))  # (a Dict space has no shape)
        self.obs_layout = ObservationLayout.of(self.observation_space, config.features_extractor,
                                               config.normalize_images)
        if self.recurrent and config.replay_buffer_class is not None:
            raise ValueError(f"{self.algo} samples sequences from its own buffer: replay_buffer_class must be None")
        if self.recurrent and not (self.obs_layout.extractor == "flatten" and isinstance(self.observation_space,
                                                                                      gym.spaces.Box)):
            # the sequence encoder reads vectors: one-hot and Dict observations flattened on the host
            self.obs_layout = FlatObservationLayout.of(self.obs_layout, self.algo)
            self.n_obs = self.obs_layout.size
        self.num_timesteps = 0
        self._n_calls = 0  # vector-environment steps taken
        self._episode_num = 0  # episodes finished since num_timesteps was last reset, over the lanes
        self._episode_stats: EpisodeStats | None = None  # the lanes' episodes, kept across learn calls
        self._last_obs: np.ndarray | None = None
        self._unrecorded: list[tuple] = []  # the steps taken since _record_steps last ran
        self.logger = Recorder()
        """SB3's logger surface: ``record(key, value)`` is written with the next log write."""
        self.policy = AgentPolicy(self)
        """What acts, as SB3's ``model.policy``: ``policy.predict(...)``."""
        self._train_scalars: dict[str, float] = {}
        self.skipped_updates = 0
        self._acting: dict[bool, rc.capturing.CapturedFunction] = {}  # the captured policy, by determinism
        self._actions_ready: tuple | None = None  # (observations, deterministic, actions) a train round computed
        self._pending_round: LaunchedUpdate | None = None  # overlap_updates: the round's last step, launched
        self._rng = np.random.default_rng(seed)
        self.log_path: str | None = None  # the run folder of the latest learn call, when logging
        with self.on_device():
            if seed is not None:
                rc.manual_seed(seed)
            self._build()
        if self.config.overlap_updates and not self.acts_in_updates:
            raise ValueError(f"{self.algo}: overlap_updates is for the agents that act in their updates (SAC, TD3, "
                             "DDPG); this agent's round of gradient steps runs before it acts")

    # ---- what a subclass supplies -------------------------------------------------------------

    env_defaults: dict[str, dict] = {}
    """Changes to the config class's defaults for one environment, by its id: what an agent made
    on that environment without a config gets (DQN's for CartPole-v1). Empty here: every
    environment gets the config class's defaults."""

    @classmethod
    def default_config(cls, env=None):
        """The config an agent made on ``env`` (an id, or an environment made from one) without
        one gets: the config class's defaults, changed by ``env_defaults`` for that environment's
        id (DQN's for an Atari id are RL Zoo's Atari settings)."""
        return cls.config_class(**cls.env_defaults.get(env_id_of(env), {}))

    def _check_spaces(self) -> None:
        """Raises ValueError where the environment's spaces are not ones the agent acts in."""
        raise NotImplementedError

    def _require_spaces(self, action_kind: str) -> None:
        """A Box, Discrete, MultiDiscrete or MultiBinary observation space and a ``"discrete"`` or
        ``"bounded box"`` action space."""
        space = self.action_space
        if action_kind == "discrete":
            fits = isinstance(space, gym.spaces.Discrete)
        else:
            fits = isinstance(space, gym.spaces.Box) and bool(np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high)))
        if not fits:
            wanted = "a Discrete" if action_kind == "discrete" else "a bounded Box"
            raise ValueError(f"{self.algo} needs {wanted} action space, got {space}")
        readable = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary,
                    gym.spaces.Dict)
        if not isinstance(self.observation_space, readable):
            raise ValueError(f"{self.algo} reads Box, Discrete, MultiDiscrete, MultiBinary and Dict observation "
                             f"spaces, got {self.observation_space}")
        if isinstance(self.observation_space, gym.spaces.Dict):
            try:
                check_dict_space(self.observation_space)
            except ValueError as error:
                raise ValueError(f"{self.algo}: {error}") from None

    def _build(self) -> None:
        raise NotImplementedError

    def _replay_buffer(self, **options) -> ReplayBuffer:
        """A replay buffer of ``config.buffer_size`` made with ``options``: a ReplayBuffer, or the
        HerReplayBuffer that ``config.replay_buffer_class`` names, with the config's
        replay_buffer_kwargs and the environment's compute_reward."""
        cfg = self.config
        if cfg.replay_buffer_class is None:
            return ReplayBuffer(cfg.buffer_size, **options)
        return HerReplayBuffer(cfg.buffer_size, compute_reward=env_compute_reward(self.env), batch_size=cfg.batch_size,
                               **cfg.replay_buffer_kwargs, **options)

    def _explore(self, obs: np.ndarray) -> np.ndarray:
        """Actions (in the buffer's space) for a batch of observations [n, n_obs] while training."""
        raise NotImplementedError

    def _act(self, obs: Tensor, deterministic: bool) -> Tensor:
        """The policy's actions (in the buffer's space) for observations [n_obs, n]: [actions, n]."""
        raise NotImplementedError

    def _policy_parameters(self) -> list[Tensor]:
        """The parameters ``_act`` reads."""
        raise NotImplementedError

    recurrent = False
    """Whether acting advances a per-lane state (a recurrent policy runs at every step, even
    where the action taken is a random one)."""

    def _policy(self, obs: np.ndarray | dict[str, np.ndarray], deterministic: bool) -> np.ndarray:
        """Actions (in the buffer's space) for observations [n, n_obs] (a dict of each key's
        batch for Dict observations): one replay of the captured forward (one upload and one
        download on the GPU), no Python per op; or the actions a train round computed for this
        very batch (``acts_in_updates``)."""
        ready, self._actions_ready = self._actions_ready, None
        if ready is not None and ready[0] is obs and ready[1] == deterministic:
            return ready[2]
        return self._acting_function(deterministic)(**policy_inputs(obs)).T  # [n, actions]

    def _acting_function(self, deterministic: bool) -> rc.capturing.CapturedFunction:
        """The captured policy forward that ``_policy`` replays, captured at its first use."""
        act = self._acting.get(deterministic)
        if act is None:
            act = self._acting[deterministic] = rc.capture(
                lambda **inputs: self._act(policy_input(inputs), deterministic), self._policy_parameters())
        return act

    def _onnx_policy(self) -> tuple[list, str]:
        """(the modules the deterministic action goes through, in order; the final step: "argmax"
        over their output, or "tanh" rescaled to the Box action space), for export_onnx."""
        raise NotImplementedError(f"{self.algo}.export_onnx: this agent's policy has no ONNX form (a recurrent "
                                  "policy carries a state between steps)")

    def export_onnx(self, path: str, opset: int = 17) -> None:
        """Writes the deterministic policy to ``path`` as an ONNX model (needs the onnx extra):
        input ``obs`` (N, *observation shape), float32 (uint8 for images, int64 for Discrete and
        MultiDiscrete), output ``actions``,
        what ``predict(obs, deterministic=True)`` returns (rlkit/agents/onnx_export.py)."""
        with self.on_device():
            export_policy(self, path, opset)

    def _state_objects(self) -> dict:
        """{name: object with state_dict()} that save writes and load restores."""
        raise NotImplementedError

    def _after_env_step(self) -> None:
        """Work after every vector-environment step (a target update, for DQN)."""

    def _apply_deferred(self) -> None:
        """Completes work deferred from environment steps (a round of gradient steps launched
        under ``overlap_updates``; DQN's target updates), so that a callback or whatever runs
        after ``learn`` sees the agent as if nothing were deferred. An agent that defers work
        also calls it before its own readers (its train round, save); an override calls this."""
        self._record_steps()
        self._finish_round()

    def _episodes(self) -> EpisodeStats:
        """The lanes' episode statistics, begun anew after a reset (a learn call that resets,
        set_env; also one a callback makes while learn runs)."""
        if self._episode_stats is None:
            self._episode_stats = EpisodeStats(self.lanes.n)
        return self._episode_stats

    def _record_steps(self) -> None:
        """Stores the environment steps taken since the last call in the replay buffer and counts
        them in the episode statistics, a run of them with one ``extend`` each (one step with
        ``add`` and ``step``): the loop keeps them until something reads either (a round of
        gradient steps, a callback, a log write, learn's end), which saves a dozen small numpy
        calls per step."""
        steps, self._unrecorded = self._unrecorded, []
        if len(steps) == 1:  # train_freq 1, or a callback at every step: no stacking
            batch, actions, reward, stored_next, terminated, truncated = steps[0]
            self.buffer.add(batch, actions, reward, stored_next, terminated, truncated)
            dones = terminated | truncated  # [n]
            self._episodes().step(reward, dones)
        elif steps:
            batch, actions, rewards, stored_next, terminated, truncated = [stack_steps(column) for column in zip(*steps)]
            self.buffer.extend(batch, actions, rewards, stored_next, terminated, truncated)  # [k, n, ...] each
            dones = terminated | truncated  # [k, n]
            self._episodes().extend(rewards, dones)
        else:
            return
        self._episode_num += int(np.count_nonzero(dones))

    def _stepped(self, actions: np.ndarray, done: np.ndarray) -> None:
        """Called after every step of a ``recurrent`` agent with the actions taken (in the buffer's
        space) and the lanes whose episode ended: it keeps the actions and zeroes those lanes' states."""

    def _extra_scalars(self) -> dict[str, float]:
        """Scalars besides the shared ones to log (the exploration rate, for DQN)."""
        return {}

    # ---- devices and action spaces ----------------------------------------------------------

    def on_device(self):
        """Makes the agent's device current for the block."""
        return default_device(self.device)

    @property
    def discrete(self) -> bool:
        """Whether actions are indices (a Discrete space) rather than vectors in a Box."""
        return self._discrete

    def _to_env_action(self, actions: np.ndarray) -> np.ndarray:
        """Buffer actions to the environment's: Box actions live in [-1, 1] in the buffer and
        are rescaled to [low, high] (the policy's tanh range mapped onto the space)."""
        if self._discrete:
            return actions.reshape(-1).astype(np.int64)
        low, high = self.action_space.low, self.action_space.high
        clipped = np.minimum(np.maximum(actions, -1.0), 1.0)  # np.clip's values, NaN too, at half its cost
        scaled = low + 0.5 * (clipped + 1.0) * (high - low)
        return scaled.reshape((-1, *self.action_space.shape)).astype(self.action_space.dtype)

    def _random_actions(self, n: int) -> np.ndarray:
        """Uniform actions in the buffer's space, for the steps before learning starts."""
        if self.discrete:
            return self._rng.integers(0, self.action_space.n, (n, 1)).astype(np.int32)
        return self._rng.uniform(-1.0, 1.0, (n, int(np.prod(self.action_space.shape)))).astype(np.float32)

    def _obs_batch(self, observation) -> tuple[np.ndarray | dict[str, np.ndarray], bool]:
        """Observations as [n, n_obs] float32 (images: [n, *shape] bytes; a Dict space's: a dict
        of each key's), and whether a batch was given: as SB3, an array of the observation
        space's shape is one observation, one of shape (n, *shape) a batch (what a vector
        environment returns), and a dict of such arrays one or a batch of a Dict space's.
        Anything else, or one holding NaN or an infinity, raises ValueError (an argmax over NaN
        Q values picks action 0, which would pass for a choice)."""
        if isinstance(observation, tuple) and len(observation) == 2 and isinstance(observation[1], dict):
            raise ValueError(f"{self.algo}.predict: got a tuple (observation, info), what Gymnasium's reset() "
                             "returns; pass the observation alone: obs, info = env.reset(); agent.predict(obs)")
        try:
            batch, vectorized = self.obs_layout.batch_of(observation, self.observation_space.shape)
        except ValueError as error:
            raise ValueError(f"{self.algo}.predict: {error}") from None
        for key, values in (batch.items() if isinstance(batch, dict) else [(None, batch)]):
            rows = values.reshape(len(values), -1)
            if not np.isfinite(rows).all():
                row = int(np.flatnonzero(~np.isfinite(rows).all(axis=1))[0])
                where = "" if key is None else f"[{key!r}]"
                raise ValueError(f"{self.algo}.predict: observation {row}{where} holds NaN or an infinity")
        return batch, vectorized

    def _shaped_actions(self, actions: np.ndarray, vectorized: bool) -> np.ndarray:
        """Environment actions [n, ...] as SB3's predict returns them: the batch, or for one
        observation its action alone (a 0-d int64 array for Discrete, [*shape] for a Box)."""
        return actions if vectorized else actions.squeeze(axis=0)

    # ---- acting -----------------------------------------------------------------------------------

    def predict(self, observation, state: tuple[np.ndarray, ...] | None = None,
                episode_start: np.ndarray | None = None,
                deterministic: bool = False) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """``(actions, state)`` for one observation, or a batch [n, *obs_shape] from a vector
        environment, as Stable-Baselines3's ``predict``: actions in the environment's action
        space (int64 indices for Discrete, rescaled to [low, high] for a Box), shaped as the
        input (one action for one observation). ``deterministic=False`` (SB3's default) samples
        a stochastic policy (SAC) and explores as in training where the agent's predict does
        (DQN's epsilon); TD3 and DDPG act deterministically either way (as SB3's, whose predict
        adds no action noise). ``state`` and ``episode_start`` matter to recurrent agents only;
        the others return ``state`` as given."""
        return self._predict(observation, state, episode_start, deterministic)

    def _predict(self, observation, state, episode_start, deterministic: bool):
        """The policy's predict (what ``policy.predict`` runs), without an agent's exploration."""
        batch, vectorized = self._obs_batch(observation)
        with self.on_device():
            actions = self._to_env_action(self._policy(batch, deterministic))
        return self._shaped_actions(actions, vectorized), state

    # ---- training -----------------------------------------------------------------------------------

    def learn(self, total_timesteps: int, callback=None, log_interval: int | None = None,
              tb_log_name: str | None = None, reset_num_timesteps: bool = True, progress_bar: bool = False,
              *, check_finite: str = "raise") -> OffPolicyAgent:
        """Trains for ``total_timesteps`` environment steps (summed over the lanes), as
        Stable-Baselines3's ``learn``; returns the agent.

        ``callback``: a :class:`~rlkit.agents.callbacks.BaseCallback`, a function
        ``callback(event) -> bool | None`` called after every vector-environment step with a
        :class:`~rlkit.agents.callbacks.StepEvent`, or a list of these; False from one stops
        training there (None and True go on).

        ``log_interval``: None writes TensorBoard scalars every ``config.log_interval`` steps;
        an int, as SB3's off-policy agents, after every ``log_interval``-th finished episode.
        ``tb_log_name``: the run folder's name, ``<logdir>/<tb_log_name>_<N>`` (default: the
        algorithm's). ``reset_num_timesteps``: True (SB3's default) starts ``num_timesteps``,
        the episode count and the environment anew, and opens the next run folder (the replay
        buffer is kept); False goes on from where the last call stopped, in the latest folder.
        ``progress_bar``: a tqdm bar.

        ``check_finite``: what a NaN or an infinity in an observation or a reward the environment
        returns does: ``"raise"`` (ValueError naming the timestep, the lane and the value, before
        the step reaches the buffer) or ``"warn"`` (a RuntimeWarning, once per call; training
        goes on, its updates on such steps skipped and counted in ``skipped_updates``)."""
        if isinstance(total_timesteps, bool) or not isinstance(total_timesteps, int) or total_timesteps < 1:
            raise ValueError(f"learn: total_timesteps must be a positive int, got {total_timesteps!r}")
        if log_interval is not None:
            positive_int(log_interval, "learn: log_interval")
        check = FiniteCheck(self.algo, check_finite)
        callback = convert_callback(callback)
        if reset_num_timesteps:
            self.num_timesteps, self._episode_num = 0, 0
            self._episode_stats, self._last_obs = None, None
            self._restart_lanes()
        name = self.algo if tb_log_name is None else tb_log_name
        self.log_path = run_dir(self.logdir, name, reuse_latest=not reset_num_timesteps) if self.logdir else None
        writer = SummaryWriter(self.log_path) if self.log_path else None
        if writer is not None:
            writer.add_hparams({**asdict(self.config), "env": str(self.lanes.env_id or self.env)})
        self.logger.writer = writer
        bar = None
        if progress_bar:
            from tqdm import tqdm

            bar = tqdm(total=total_timesteps, desc=self.algo)
        try:
            with self.on_device():
                if callback is not None:
                    callback.init_callback(self)
                    callback.on_training_start(None, None)
                self._loop(total_timesteps, writer, bar, callback, check, log_interval)
                if callback is not None:
                    callback.on_training_end()
        finally:
            self._record_steps()  # the steps taken before an exception: stored, as they would be step by step
            self._finish_round()  # a round launched before an exception: read, its steps counted
            self.logger.writer = None
            if bar is not None:
                bar.close()
            if writer is not None:
                writer.close()
        return self

    def _restart_lanes(self) -> None:
        """Called when the lanes' episodes start anew (a learn call resetting, set_env): a
        recurrent agent forgets the lanes' states."""

    def _loop(self, total_timesteps: int, writer, bar, callback: BaseCallback | None, check: FiniteCheck,
              log_every_episodes: int | None) -> None:
        cfg, lanes = self.config, self.lanes
        self._learn_start, self._learn_total = self.num_timesteps, total_timesteps
        start_time = time.perf_counter()
        if self._last_obs is None:
            self.buffer.truncate_episodes()  # the lanes begin new episodes: those stored end where they stand
            obs = lanes.reset()
        else:
            obs = self._last_obs
        check(self.num_timesteps, "observation", obs)
        batch = self.obs_layout.batch(obs, lanes.n)  # [n, n_obs] float32, or [n, *image shape] bytes
        in_rollout, logged_at = False, None  # a rollout: the train_freq steps before a round of gradient steps
        while self.num_timesteps - self._learn_start < total_timesteps:
            if callback is not None and not in_rollout:
                callback.on_rollout_start()
            in_rollout = True
            if self.num_timesteps < cfg.learning_starts:
                actions = self._random_actions(lanes.n)
            else:
                actions = self._explore(batch)
            env_actions = self._to_env_action(actions)
            # Environments in other processes step while this step's round of gradient steps runs
            # (it then samples without this step's n transitions, and callbacks see the step after it).
            overlapped = lanes.steps_in_background and self._round_due(self._n_calls + 1)
            if overlapped:
                lanes.step_async(env_actions)
                in_rollout = self._train_round(callback, lanes.n)
                next_obs, reward, terminated, truncated, true_next = lanes.step_wait()
            else:
                next_obs, reward, terminated, truncated, true_next = lanes.step(env_actions)
            timestep = self.num_timesteps + lanes.n
            check(timestep, "observation", true_next)
            if next_obs is not true_next:  # a reset's first observation
                check(timestep, "observation", next_obs)
            check(timestep, "reward", reward)
            next_batch = self.obs_layout.batch(next_obs, lanes.n)
            stored_next = next_batch if true_next is next_obs else self.obs_layout.batch(true_next, lanes.n)
            before, episodes_before = self.num_timesteps, self._episode_num
            self._unrecorded.append((batch, actions, reward, stored_next, terminated, truncated))
            if self.recurrent:
                self._stepped(actions, terminated | truncated)
            if log_every_episodes is not None:
                self._record_steps()  # the episode count decides when to log
            obs, batch = next_obs, next_batch
            self.num_timesteps += lanes.n
            self._n_calls += 1
            if callback is not None:  # as SB3: after the step, before the rollout's gradient steps
                self._apply_deferred()
                callback.update_event(StepEvent(agent=self, num_timesteps=self.num_timesteps, actions=env_actions,
                                                rewards=reward, new_obs=next_obs, terminated=terminated,
                                                truncated=truncated, episodes=self._episodes(),
                                                writer=writer))
                if not callback.on_step():
                    in_rollout = False  # stopped: the rollout does not end, as SB3's
                    break
            if not overlapped and self._round_due(self._n_calls):
                in_rollout = self._train_round(callback, 0, act_on=batch)
            self._after_env_step()
            if writer is not None:
                if log_every_episodes is None:
                    due = self.num_timesteps // cfg.log_interval > before // cfg.log_interval
                else:  # SB3's off-policy log_interval: every log_interval-th episode
                    due = self._episode_num // log_every_episodes > episodes_before // log_every_episodes
                if due:
                    self._log(writer, start_time)
                    logged_at = self.num_timesteps
            if bar is not None:
                bar.update(lanes.n)
        if callback is not None and in_rollout:
            callback.on_rollout_end()  # training ends within a rollout: it ends there
        self._apply_deferred()
        self._last_obs = obs
        if writer is not None and logged_at != self.num_timesteps:
            self._log(writer, start_time)  # where training ended, so a short run has its points too

    def _round_due(self, n_calls: int) -> bool:
        """Whether the ``n_calls``-th vector step ends a rollout (every ``train_freq``-th)."""
        return n_calls % self.config.train_freq == 0

    def _train_round(self, callback: BaseCallback | None, steps_to_come: int, act_on=None) -> bool:
        """Ends the rollout and runs its gradient steps once past ``learning_starts`` (counting
        the ``steps_to_come`` of a step still running), computing the actions for the observation
        batch ``act_on`` with the last of them where the agent ``acts_in_updates``, or before them,
        the last one launched, under ``overlap_updates``; False (the loop is no longer in a
        rollout)."""
        self._record_steps()  # what the round samples, and what the callback sees
        if callback is not None:
            callback.on_rollout_end()
        if self.num_timesteps + steps_to_come > self.config.learning_starts:
            if act_on is not None and self.config.overlap_updates:
                self._launch_round(act_on)
                return False
            if act_on is not None and self.acts_in_updates:
                scalars = self._train(self.config.gradient_steps, act_on=act_on)
            else:
                scalars = self._train(self.config.gradient_steps)
            self._train_scalars.update(scalars)
        return False

    def _progress(self) -> float:
        """The fraction of training done (0 to 1), as SB3 counts it: ``num_timesteps`` over the
        timesteps this learn call ends at (those of earlier calls too when it does not reset)."""
        return min(1.0, self.num_timesteps / max(self._learn_start + self._learn_total, 1))

    def _log(self, writer: SummaryWriter, start_time: float) -> None:
        """Writes the scalars at ``num_timesteps``, with what callbacks recorded in ``logger``."""
        self._finish_round()  # its scalars too
        self._record_steps()  # the episodes they end too
        step = self.num_timesteps
        fps = (step - self._learn_start) / max(time.perf_counter() - start_time, 1e-9)
        means = self._episodes().means()
        scalars = {"time/fps": fps, **self._extra_scalars(), **self._train_scalars}
        if self._train_scalars:
            scalars["train/skipped_updates"] = self.skipped_updates
        if means is not None:
            scalars["rollout/ep_rew_mean"], scalars["rollout/ep_len_mean"] = means
        for tag, value in scalars.items():
            self.logger.record(tag, value)
        self.logger._write(writer, step)

    # ---- SB3's model API --------------------------------------------------------------------------

    def get_env(self):
        """The environment the agent trains on (a Gymnasium environment or vector environment;
        SB3's get_env returns a VecEnv)."""
        return self.env

    def set_env(self, env, force_reset: bool = True) -> None:
        """Trains on ``env`` from now on: its spaces must be the agent's and its lanes as many as
        the replay buffer's (ValueError otherwise). ``force_reset`` (SB3's default) starts the
        lanes' episodes anew at the next learn call; False goes on from the last observations."""
        lanes = EnvLanes(env, self.seed, self.config.n_envs)
        if (lanes.observation_space, lanes.action_space) != (self.observation_space, self.action_space):
            raise ValueError(f"{self.algo}.set_env: the environment's spaces ({lanes.observation_space}, "
                             f"{lanes.action_space}) are not the agent's ({self.observation_space}, {self.action_space})")
        if lanes.n != self.lanes.n:
            raise ValueError(f"{self.algo}.set_env: the environment has {lanes.n} lanes, the replay buffer is laid out "
                             f"for {self.lanes.n}")
        self.lanes, self.env = lanes, lanes.env
        if force_reset:
            self._last_obs = None
            self._episode_stats = None
            self._restart_lanes()
