"""The base of the off-policy agents: the environment loop, logging, saving and loading, and
acting on the agent's device.

An agent subclasses :class:`OffPolicyAgent` and supplies its networks (``_build``), how it
explores (``_explore``) and acts (``_act``), its gradient steps (``_train``) and what it
saves (``_state_objects``); everything between the environment and those pieces is here.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict, fields

import numpy as np

import rlkit.core as rc
from rlkit.agents.callbacks import StepEvent
from rlkit.agents.episodes import EpisodeStats
from rlkit.agents.lanes import EnvLanes, env_module
from rlkit.agents.observations import ObservationLayout
from rlkit.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from rlkit.core.tensor import Tensor
from rlkit.logger import SummaryWriter, run_dir


class default_device:
    """Makes ``device`` the default device for the block (ops without inputs, captures). A
    class rather than a generator function: entered at every host-acting step, where a
    generator-based context manager's overhead is a microsecond. Reusable and reentrant."""

    def __init__(self, device: str):
        self.device = device
        self._previous: list[str] = []  # the device each open block replaced, innermost last

    def __enter__(self) -> None:
        self._previous.append(rc.device(self.device))

    def __exit__(self, *exc_info) -> None:
        rc.device(self._previous.pop())


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

    def __call__(self, timestep: int, what: str, values: np.ndarray) -> None:
        """Checks ``values`` [n_lanes, ...], the ``what`` (observation or reward) of each lane at
        ``timestep``: one isfinite pass over the array where all is well."""
        if values.dtype.kind != "f" or np.isfinite(values).all():
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


class OffPolicyAgent:
    """The environment loop, logging and saving of an off-policy agent.

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

    def __init__(self, env, config=None, device: str | None = None, seed: int | None = None,
                 logdir: str | None = None):
        if config is None:
            config = self.default_config(env)
        elif not isinstance(config, self.config_class):
            raise TypeError(f"{self.algo}: config must be a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config
        self.lanes = EnvLanes(env, seed, config.n_envs)
        self.env = self.lanes.env
        self.observation_space, self.action_space = self.lanes.observation_space, self.lanes.action_space
        self._check_spaces()
        import gymnasium as gym

        self._discrete = isinstance(self.action_space, gym.spaces.Discrete)  # asked at every step
        self.device = device or rc.device()
        self.seed, self.logdir = seed, logdir
        self.n_obs = int(np.prod(self.observation_space.shape))
        self.obs_layout = ObservationLayout.of(self.observation_space, config.features_extractor,
                                               config.normalize_images)
        self.num_timesteps = 0
        self._n_calls = 0  # vector-environment steps taken
        self._last_obs: np.ndarray | None = None
        self._train_scalars: dict[str, float] = {}
        self.skipped_updates = 0
        self._acting: dict[bool, rc.capturing.CapturedFunction] = {}  # the captured policy, by determinism
        self._rng = np.random.default_rng(seed)
        self.log_path: str | None = None  # the run folder of the latest learn call, when logging
        with self.on_device():
            if seed is not None:
                rc.manual_seed(seed)
            self._build()

    # ---- what a subclass supplies -------------------------------------------------------------

    @classmethod
    def default_config(cls, env=None):
        """The config an agent made on ``env`` without one gets: the config class's defaults
        (DQN's for an Atari id are RL Zoo's Atari settings)."""
        return cls.config_class()

    def _check_spaces(self) -> None:
        """Raises ValueError where the environment's spaces are not ones the agent acts in."""
        raise NotImplementedError

    def _require_spaces(self, action_kind: str) -> None:
        """A Box observation space and a ``"discrete"`` or ``"bounded box"`` action space."""
        import gymnasium as gym

        space = self.action_space
        if action_kind == "discrete":
            fits = isinstance(space, gym.spaces.Discrete)
        else:
            fits = isinstance(space, gym.spaces.Box) and bool(np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high)))
        if not fits:
            wanted = "a Discrete" if action_kind == "discrete" else "a bounded Box"
            raise ValueError(f"{self.algo} needs {wanted} action space, got {space}")
        if not isinstance(self.observation_space, gym.spaces.Box):
            raise ValueError(f"{self.algo} needs a Box observation space, got {self.observation_space}")

    def _build(self) -> None:
        raise NotImplementedError

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

    def _policy(self, obs: np.ndarray, deterministic: bool) -> np.ndarray:
        """Actions (in the buffer's space) for observations [n, n_obs]: one replay of the
        captured forward (one upload and one download on the GPU), no Python per op."""
        act = self._acting.get(deterministic)
        if act is None:
            act = self._acting[deterministic] = rc.capture(
                lambda obs: self._act(obs, deterministic), self._policy_parameters())
        return act(obs=obs.T).T  # [n, actions]

    def _train(self, gradient_steps: int) -> dict[str, float]:
        """Runs gradient steps; returns the scalars to log (SB3's train/ tags)."""
        raise NotImplementedError

    def _state_objects(self) -> dict:
        """{name: object with state_dict()} that save writes and load restores."""
        raise NotImplementedError

    def _after_env_step(self) -> None:
        """Work after every vector-environment step (a target update, for DQN)."""

    def _apply_deferred(self) -> None:
        """Completes work deferred from environment steps (DQN's target updates), so that a
        callback or whatever runs after ``learn`` sees the agent as if nothing were deferred.
        An agent that defers work also calls it before its own readers (its train round, save)."""

    def _stepped(self, actions: np.ndarray, done: np.ndarray) -> None:
        """Called after every step with the actions taken (in the buffer's space) and the lanes
        whose episode ended (a recurrent agent keeps the actions and zeroes those lanes' states)."""

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
        if self.discrete:
            return actions.reshape(-1).astype(np.int64)
        low, high = self.action_space.low, self.action_space.high
        scaled = low + 0.5 * (np.clip(actions, -1.0, 1.0) + 1.0) * (high - low)
        return scaled.reshape((-1, *self.action_space.shape)).astype(self.action_space.dtype)

    def _random_actions(self, n: int) -> np.ndarray:
        """Uniform actions in the buffer's space, for the steps before learning starts."""
        if self.discrete:
            return self._rng.integers(0, self.action_space.n, (n, 1)).astype(np.int32)
        return self._rng.uniform(-1.0, 1.0, (n, int(np.prod(self.action_space.shape)))).astype(np.float32)

    def _obs_batch(self, obs) -> tuple[np.ndarray, bool]:
        """Observations as [n, n_obs] float32 (images: [n, *shape] bytes), and whether a single
        one was given."""
        obs = np.asarray(obs)
        single = obs.ndim == len(self.observation_space.shape)
        if obs.size % self.n_obs or (single and obs.size != self.n_obs):
            raise ValueError(f"{self.algo}.predict: observations of shape {obs.shape} do not match the "
                             f"observation space {self.observation_space.shape}")
        return self.obs_layout.batch(obs, obs.size // self.n_obs), single

    # ---- acting -----------------------------------------------------------------------------------

    def predict(self, obs, deterministic: bool = True):
        """The action for one observation, or actions for a batch [n, *obs_shape], in the
        environment's action space: an int (Discrete) or an array rescaled to [low, high] (Box).
        An observation holding NaN or an infinity raises ValueError: its Q values or actions
        would be NaN, and an argmax over NaN picks action 0, which would pass for a choice."""
        batch, single = self._obs_batch(obs)
        if not np.isfinite(batch).all():
            row = int(np.flatnonzero(~np.isfinite(batch).all(axis=1))[0])
            raise ValueError(f"{self.algo}.predict: observation {row} holds NaN or an infinity")
        with self.on_device():
            actions = self._to_env_action(self._policy(batch, deterministic))
        if single:
            return int(actions[0]) if self.discrete else actions[0]
        return actions

    # ---- training -----------------------------------------------------------------------------------

    def learn(self, total_timesteps: int, progress_bar: bool = False, callback=None, check_finite: str = "raise"):
        """Trains for ``total_timesteps`` environment steps (summed over the lanes). Returns
        the agent.

        ``callback``: called after every vector-environment step with a
        :class:`~rlkit.agents.callbacks.StepEvent`; returning False stops training there
        (None and True go on).

        ``check_finite``: what a NaN or an infinity in an observation or a reward the environment
        returns does: ``"raise"`` (ValueError naming the timestep, the lane and the value, before
        the step reaches the buffer) or ``"warn"`` (a RuntimeWarning, once per call; training
        goes on, its updates on such steps skipped and counted in ``skipped_updates``)."""
        if isinstance(total_timesteps, bool) or not isinstance(total_timesteps, int) or total_timesteps < 1:
            raise ValueError(f"learn: total_timesteps must be a positive int, got {total_timesteps!r}")
        check = FiniteCheck(self.algo, check_finite)
        self.log_path = run_dir(self.logdir, self.algo) if self.logdir else None
        writer = SummaryWriter(self.log_path) if self.log_path else None
        if writer is not None:
            writer.add_hparams({**asdict(self.config), "env": str(self.lanes.env_id or self.env)})
        bar = None
        if progress_bar:
            from tqdm import tqdm

            bar = tqdm(total=total_timesteps, desc=self.algo)
        try:
            with self.on_device():
                self._loop(total_timesteps, writer, bar, callback, check)
        finally:
            if bar is not None:
                bar.close()
            if writer is not None:
                writer.close()
        return self

    def _loop(self, total_timesteps: int, writer, bar, callback, check: FiniteCheck) -> None:
        cfg, lanes = self.config, self.lanes
        stats = EpisodeStats(lanes.n)
        self._learn_start, self._learn_total = self.num_timesteps, total_timesteps
        start_time = time.perf_counter()
        obs = lanes.reset() if self._last_obs is None else self._last_obs
        check(self.num_timesteps, "observation", obs)
        while self.num_timesteps - self._learn_start < total_timesteps:
            batch = self.obs_layout.batch(obs, lanes.n)  # [n, n_obs] float32, or [n, *image shape] bytes
            if self.num_timesteps < cfg.learning_starts:
                actions = self._random_actions(lanes.n)
            else:
                actions = self._explore(batch)
            env_actions = self._to_env_action(actions)
            next_obs, reward, terminated, truncated, true_next = lanes.step(env_actions)
            timestep = self.num_timesteps + lanes.n
            check(timestep, "observation", true_next)
            if next_obs is not true_next:  # a reset's first observation
                check(timestep, "observation", next_obs)
            check(timestep, "reward", reward)
            self.buffer.add(batch, actions, reward, self.obs_layout.batch(true_next, lanes.n), terminated, truncated)
            done = terminated | truncated
            stats.step(reward, done)
            self._stepped(actions, done)
            obs = next_obs
            before = self.num_timesteps
            self.num_timesteps += lanes.n
            self._n_calls += 1
            if self.num_timesteps > cfg.learning_starts and self._n_calls % cfg.train_freq == 0:
                self._train_scalars.update(self._train(cfg.gradient_steps))
            self._after_env_step()
            if writer is not None and self.num_timesteps // cfg.log_interval > before // cfg.log_interval:
                self._log(writer, stats, start_time)
            if bar is not None:
                bar.update(lanes.n)
            if callback is not None:
                self._apply_deferred()
                event = StepEvent(agent=self, num_timesteps=self.num_timesteps, actions=env_actions, rewards=reward,
                                  new_obs=next_obs, terminated=terminated, truncated=truncated, episodes=stats,
                                  writer=writer)
                if callback(event) is False:
                    break
        self._apply_deferred()
        self._last_obs = obs
        if writer is not None and self.num_timesteps % cfg.log_interval:
            self._log(writer, stats, start_time)  # where training ended, so a short run has its points too

    def _progress(self) -> float:
        """The fraction of the current learn call done (0 to 1)."""
        return min(1.0, (self.num_timesteps - self._learn_start) / self._learn_total)

    def _log(self, writer: SummaryWriter, stats: EpisodeStats, start_time: float) -> None:
        step = self.num_timesteps
        fps = (step - self._learn_start) / max(time.perf_counter() - start_time, 1e-9)
        means = stats.means()
        scalars = {"time/fps": fps, **self._extra_scalars(), **self._train_scalars}
        if self._train_scalars:
            scalars["train/skipped_updates"] = self.skipped_updates
        if means is not None:
            scalars["rollout/ep_rew_mean"], scalars["rollout/ep_len_mean"] = means
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, step)  # NaN and infinities as they are: TensorBoard shows them

    # ---- saving -----------------------------------------------------------------------------------

    def save_replay_buffer(self, path: str) -> None:
        """Writes the replay buffer to the folder ``path`` (ReplayBuffer.save: chunked, swapped in
        whole; ``path`` must be absent or an earlier buffer save, anything else is refused)."""
        self.buffer.save(path)

    def load_replay_buffer(self, path: str) -> None:
        """Replaces the replay buffer with the one saved at ``path``, which must have the same
        layout; the captured updates are traced anew to read it."""
        loaded = type(self.buffer).load(path, device=self.device)
        mine, theirs = self.buffer._settings(), loaded._settings()
        mine.pop("state"), theirs.pop("state")
        if mine != theirs:
            raise ValueError(f"{self.algo}.load_replay_buffer: {path!r} holds a buffer laid out as {theirs}, "
                             f"this agent's is {mine}")
        self.buffer = loaded
        for captured in self._captured_programs():
            captured.reset()

    def _captured_programs(self) -> list:
        """Every captured program the agent holds (attributes, or values of dict attributes)."""
        found = []
        for value in vars(self).values():
            for item in value.values() if isinstance(value, dict) else (value,):
                if isinstance(item, rc.capturing.CapturedStep):
                    item = item.captured
                if isinstance(item, rc.capturing.CapturedFunction):
                    found.append(item)
        return found

    def save(self, path: str) -> None:
        """Networks and optimizers (safetensors) with the config and the algorithm (JSON)."""
        meta = {"algo": self.algo, "config": asdict(self.config), "env": self.lanes.env_id,
                "num_timesteps": self.num_timesteps}
        save_checkpoint(path, self._state_objects(), metadata=meta)

    @classmethod
    def load(cls, path: str, env=None, device: str | None = None, *, allow_env_import: bool = False):
        """An agent that acts exactly as the saved one, on ``env`` (default: the environment id
        saved in the file). A saved id with a module prefix (``"package.module:Env-v0"``) would
        make Gymnasium import that module, running code that the file names (its checksum is no
        signature): such an id is refused with a ValueError unless ``allow_env_import`` is True,
        or ``env`` is passed (the saved id is then not used)."""
        meta = read_checkpoint(path)["metadata"]
        if meta.get("algo") != cls.algo:
            raise ValueError(f"{cls.algo}.load: {path!r} holds a {meta.get('algo')!r} agent, not {cls.algo}")
        if env is None:
            env = meta.get("env")
            if not isinstance(env, str) or not env:
                raise ValueError(f"{cls.algo}.load: {path!r} names no environment id; pass env=")
            module = env_module(env)
            if module is not None and not allow_env_import:
                raise ValueError(f"{cls.algo}.load: {path!r} names the environment {env!r}, which would import the "
                                 f"module {module!r}; pass env= (that id or another), or allow_env_import=True to "
                                 "run that module's code")
        tuples = {f.name for f in fields(cls.config_class) if isinstance(f.default, tuple)}
        config = cls.config_class(**{k: tuple(v) if k in tuples else v for k, v in meta["config"].items()})
        agent = cls(env, config, device=device)
        load_checkpoint(path, agent._state_objects())
        agent.num_timesteps = meta["num_timesteps"]
        return agent
