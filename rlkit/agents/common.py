"""What the off-policy agents share: environments stepped as lanes, the environment loop,
logging, saving, the polyak update on the device, config checks and evaluation.

An agent subclasses :class:`OffPolicyAgent` and supplies its networks (``_build``), how it
explores (``_explore``) and acts (``_act``), its gradient steps (``_train``) and what it
saves (``_state_objects``); everything between the environment and those pieces is here.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections import deque
from dataclasses import asdict, fields

import numpy as np

import rlkit.core as rc
from rlkit.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from rlkit.core._checks import number_in_range, positive_int
from rlkit.core.tensor import Tensor
from rlkit.logger import SummaryWriter, run_dir


def env_module(env_id: str) -> str | None:
    """The module ``gym.make(env_id)`` imports before it makes the environment: ``"pkg.mod"``
    for ``"pkg.mod:Env-v0"``, None for an id without a module prefix."""
    return env_id.split(":", 1)[0] if ":" in env_id else None


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
            self.env = gym.make_vec(env_or_id, num_envs=n_envs, vectorization_mode="sync",
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


class Polyak:
    """target <- tau * source + (1 - tau) * target for paired parameters, in place on the
    device (the target's storage stays the same, so captured programs reading it see the
    update). Usable inside a captured update."""

    def __init__(self, target: dict[str, Tensor], source: dict[str, Tensor]):
        if list(target) != list(source):
            raise ValueError("polyak: the target and source networks have different parameters")
        self._paired = tuple(x for name in target for x in (target[name], source[name]))  # target, source, ...

    def __call__(self, tau: float) -> None:
        rc.ops.apply("polyak_step", self._paired, floats=(float(tau),))  # every pair in one pass


class DeferredPolyak:
    """Polyak updates requested at environment steps and applied together by ``apply``, which
    the owner calls before anything reads the target or writes the source. While the source
    does not change, k updates with coefficient tau are one with coefficient 1 - (1 - tau)^k
    (exactly a copy for tau = 1): one device dispatch per round of gradient steps instead of
    one every few environment steps."""

    def __init__(self, update: Polyak, tau: float):
        self.update, self.tau = update, float(tau)
        self.pending = 0  # updates requested since the last apply

    def request(self) -> None:
        """Asks for one update (applied by the next ``apply``)."""
        self.pending += 1

    def apply(self) -> None:
        """Applies the requested updates as one (nothing when none is pending)."""
        if self.pending:
            coefficient = 1.0 - (1.0 - self.tau) ** self.pending
            self.pending = 0
            self.update(coefficient)


class EpisodeStats:
    """Returns and lengths of the last 100 finished episodes of all lanes (rollout/ep_rew_mean,
    rollout/ep_len_mean)."""

    def __init__(self, n_envs: int = 1, window: int = 100):
        self.returns: deque = deque(maxlen=window)
        self.lengths: deque = deque(maxlen=window)
        self.current_return = np.zeros(n_envs)
        self.current_length = np.zeros(n_envs, np.int64)

    def step(self, reward, done) -> None:
        """Counts one step of every lane; ``done`` marks lanes whose episode ended."""
        self.current_return += np.asarray(reward, np.float64).reshape(-1)
        self.current_length += 1
        ended = np.asarray(done).reshape(-1)
        if not np.count_nonzero(ended):
            return  # most steps end no episode (and the count is cheaper than the search below)
        for lane in np.flatnonzero(ended):
            self.returns.append(float(self.current_return[lane]))
            self.lengths.append(int(self.current_length[lane]))
            self.current_return[lane], self.current_length[lane] = 0.0, 0

    def means(self) -> tuple[float, float] | None:
        """(mean return, mean length) of the window, or None before the first episode ends."""
        if not self.returns:
            return None
        return float(np.mean(self.returns)), float(np.mean(self.lengths))


def mlp(sizes: tuple[int, ...], final_activation: bool) -> rc.nn.Sequential:
    """Linear layers between ``sizes``, ReLU between them, initialised as PyTorch initialises
    nn.Linear (the scale the RL Zoo settings were tuned with)."""
    pairs = list(zip(sizes[:-1], sizes[1:]))
    return rc.nn.Sequential(*[
        rc.nn.Linear(a, b, activation="relu" if final_activation or i < len(pairs) - 1 else None,
                     init="fan_in_uniform")
        for i, (a, b) in enumerate(pairs)])


class EpsilonGreedy:
    """Exploration of the DQN family (a mixin before OffPolicyAgent): each lane takes a uniform
    action with probability epsilon, else the greedy one; epsilon falls linearly from
    ``exploration_initial_eps`` to ``exploration_final_eps`` over ``exploration_fraction`` of
    training, and is logged as rollout/exploration_rate."""

    def _explore(self, obs: np.ndarray) -> np.ndarray:
        explore = self._rng.random(len(obs)) < self._epsilon()
        n_explore = int(np.count_nonzero(explore))
        if n_explore == len(obs) and not self.recurrent:  # as SB3: no forward for random actions only
            return self._rng.integers(0, self.n_actions, (len(obs), 1)).astype(np.int32)
        actions = self._policy(obs, deterministic=True)  # the greedy actions of every lane
        if n_explore:  # skipped when no lane explores: drawing no numbers leaves the generator as it is
            actions[explore, 0] = self._rng.integers(0, self.n_actions, n_explore)
        return actions

    def _epsilon(self) -> float:
        cfg = self.config
        progress = min(1.0, self._progress() / cfg.exploration_fraction)
        return cfg.exploration_initial_eps + progress * (cfg.exploration_final_eps - cfg.exploration_initial_eps)

    def _extra_scalars(self) -> dict[str, float]:
        return {"rollout/exploration_rate": self._epsilon()}


# ---- config checks ------------------------------------------------------------------------------

def check_in_range(config, name: str, low: float, high: float, low_open: bool = False) -> None:
    """``config.name`` is a number in [low, high] (or (low, high] when ``low_open``)."""
    number_in_range(getattr(config, name), f"{type(config).__name__}: {name}", low, high, low_open)


def check_positive_number(config, name: str) -> None:
    """``config.name`` is a finite number > 0."""
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise ValueError(f"{type(config).__name__}: {name} must be a positive number, got {value!r}")


def check_common_fields(config) -> None:
    """The checks every off-policy config shares: counts, rates, the discount, tau and the
    network widths."""
    prefix = type(config).__name__
    for name in ("buffer_size", "batch_size", "train_freq", "gradient_steps", "log_interval", "n_envs"):
        positive_int(getattr(config, name), f"{prefix}: {name}")
    starts = config.learning_starts
    if isinstance(starts, bool) or not isinstance(starts, int) or starts < 0:
        raise ValueError(f"{prefix}: learning_starts must be an int >= 0, got {starts!r}")
    check_positive_number(config, "learning_rate")
    check_in_range(config, "gamma", 0.0, 1.0)
    check_in_range(config, "tau", 0.0, 1.0, low_open=True)
    for width in config.net_arch:
        positive_int(width, f"{prefix}: each net_arch width")


# ---- what the environment returns ----------------------------------------------------------------

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


# ---- the agent ------------------------------------------------------------------------------------

class OffPolicyAgent:
    """The environment loop, logging and saving of an off-policy agent.

    Subclasses set ``algo`` and ``config_class`` and define ``_build`` (networks, optimizers,
    the replay buffer ``self.buffer`` and the captured updates), ``_explore`` (actions while
    training), ``_act`` (the policy's forward, captured per batch size), ``_train`` (gradient steps) and
    ``_state_objects`` (what ``save`` writes).

    ``skipped_updates`` counts the gradient updates that skipped themselves because their
    gradients were not finite (see ``rc.capturing.update_step``); it is logged as
    ``train/skipped_updates``.
    """

    algo = ""
    config_class: type = type(None)

    def __init__(self, env, config=None, device: str | None = None, seed: int | None = None,
                 logdir: str | None = None):
        if config is None:
            config = self.config_class()
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
        """Observations as [n, n_obs] float32, and whether a single one was given."""
        obs = np.asarray(obs, np.float32)
        single = obs.ndim == len(self.observation_space.shape)
        if obs.size % self.n_obs or (single and obs.size != self.n_obs):
            raise ValueError(f"{self.algo}.predict: observations of shape {obs.shape} do not match the "
                             f"observation space {self.observation_space.shape}")
        return obs.reshape(-1, self.n_obs), single

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
        """Trains for ``total_timesteps`` environment steps (summed over the lanes);
        ``callback(agent, locals)`` returning False stops early. Returns the agent.

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
            batch = obs.reshape(lanes.n, self.n_obs).astype(np.float32, copy=False)
            if self.num_timesteps < cfg.learning_starts:
                actions = self._random_actions(lanes.n)
            else:
                actions = self._explore(batch)
            next_obs, reward, terminated, truncated, true_next = lanes.step(self._to_env_action(actions))
            timestep = self.num_timesteps + lanes.n
            check(timestep, "observation", true_next)
            if next_obs is not true_next:  # a reset's first observation
                check(timestep, "observation", next_obs)
            check(timestep, "reward", reward)
            self.buffer.add(batch, actions, reward, true_next.reshape(lanes.n, self.n_obs), terminated, truncated)
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
                if callback(self, locals()) is False:
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


def evaluate(agent, env, n_episodes: int = 10, seed: int | None = None,
             lengths: list | None = None) -> tuple[float, float]:
    """Mean and standard deviation of the returns of ``n_episodes`` deterministic episodes
    (episode ``i`` reset with ``seed + i``); their lengths are appended to ``lengths`` if given."""
    if isinstance(n_episodes, bool) or not isinstance(n_episodes, int) or n_episodes < 1:
        raise ValueError(f"evaluate: n_episodes must be a positive int, got {n_episodes!r}")
    env = make_env(env, seed)
    recurrent = getattr(agent, "recurrent", False)
    returns = []
    for episode in range(n_episodes):
        obs, _ = env.reset(seed=None if seed is None else seed + episode)
        total, steps, done, state = 0.0, 0, False, None
        while not done:
            if recurrent:  # the state carried through the episode, from zeros
                action, state = agent.predict(obs, state, deterministic=True)
            else:
                action = agent.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            steps += 1
            done = terminated or truncated
        returns.append(total)
        if lengths is not None:
            lengths.append(steps)
    return float(np.mean(returns)), float(np.std(returns))
