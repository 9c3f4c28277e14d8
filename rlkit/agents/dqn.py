"""DQN (Mnih et al., 2015) with the double-Q target (van Hasselt et al., 2016) as an option, on
a discrete-action Gymnasium environment.

Every gradient step is one captured program: a batch sampled on the device from the replay
buffer, the TD target from the target network, the Huber loss, backward, gradient clipping and
Adam; nothing crosses from the host but the coefficients of the step. Acting is one forward of
the Q-network per environment step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

import rlkit.core as rc
from rlkit.agents.common import EpisodeStats, Polyak, make_env
from rlkit.buffers import ReplayBuffer
from rlkit.checkpoint import load_checkpoint, save_checkpoint
from rlkit.core._checks import positive_int
from rlkit.logger import SummaryWriter, run_dir


@dataclass
class DQNConfig:
    """Hyperparameters (the defaults are RL Zoo's tuned CartPole-v1 settings)."""

    learning_rate: float = 2.3e-3
    """Adam's learning rate."""
    buffer_size: int = 100_000
    """Transitions the replay buffer holds."""
    learning_starts: int = 1000
    """Environment steps before the first gradient step."""
    batch_size: int = 64
    """Transitions per gradient step."""
    gamma: float = 0.99
    """Discount factor."""
    train_freq: int = 256
    """Environment steps between rounds of gradient steps."""
    gradient_steps: int = 128
    """Gradient steps per round."""
    target_update_interval: int = 10
    """Environment steps between target-network updates."""
    tau: float = 1.0
    """Polyak coefficient of the target update (1: copy)."""
    exploration_fraction: float = 0.16
    """Fraction of training over which epsilon falls linearly."""
    exploration_initial_eps: float = 1.0
    """Epsilon at the start."""
    exploration_final_eps: float = 0.04
    """Epsilon after the fall."""
    max_grad_norm: float = 10.0
    """Gradients are clipped to this global norm."""
    net_arch: tuple[int, ...] = field(default=(256, 256))
    """Hidden layer sizes of the Q-network."""
    double: bool = False
    """Double DQN: the online network chooses the next action, the target network values it."""
    dueling: bool = False
    """Dueling heads (Wang et al., 2016): Q = V + A - mean(A) over the actions, on a shared trunk."""
    log_interval: int = 1000
    """Environment steps between TensorBoard writes."""

    def __post_init__(self):
        for name in ("buffer_size", "batch_size", "train_freq", "gradient_steps", "target_update_interval",
                     "log_interval"):
            positive_int(getattr(self, name), f"DQNConfig: {name}")
        if isinstance(self.learning_starts, bool) or not isinstance(self.learning_starts, int) or self.learning_starts < 0:
            raise ValueError(f"DQNConfig: learning_starts must be an int >= 0, got {self.learning_starts!r}")
        for name, low, high, low_open in (("gamma", 0.0, 1.0, False), ("tau", 0.0, 1.0, True),
                                          ("exploration_fraction", 0.0, 1.0, True),
                                          ("exploration_initial_eps", 0.0, 1.0, False),
                                          ("exploration_final_eps", 0.0, 1.0, False)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not (
                    low < value <= high if low_open else low <= value <= high):
                interval = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
                raise ValueError(f"DQNConfig: {name} must lie in {interval}, got {value!r}")
        if not isinstance(self.max_grad_norm, (int, float)) or not self.max_grad_norm > 0:
            raise ValueError(f"DQNConfig: max_grad_norm must be a positive number, got {self.max_grad_norm!r}")
        for width in self.net_arch:
            positive_int(width, "DQNConfig: each net_arch width")
        if self.dueling and not self.net_arch:
            raise ValueError("DQNConfig: dueling needs at least one hidden layer in net_arch")


def _mlp(sizes: tuple[int, ...], final_activation: bool) -> rc.nn.Sequential:
    """Linear layers between ``sizes``, ReLU between them, initialised as PyTorch initialises
    nn.Linear (the scale the RL Zoo settings were tuned with)."""
    pairs = list(zip(sizes[:-1], sizes[1:]))
    return rc.nn.Sequential(*[
        rc.nn.Linear(a, b, activation="relu" if final_activation or i < len(pairs) - 1 else None,
                     init="fan_in_uniform")
        for i, (a, b) in enumerate(pairs)])


class DuelingQNetwork(rc.nn.Module):
    """A shared trunk, then a state value V [1, B] and advantages A [actions, B] combined as
    Q = V + A - mean(A): the mean pins V and A down (any constant could move between them)."""

    def __init__(self, n_obs: int, n_actions: int, hidden: tuple[int, ...]):
        super().__init__()
        self.trunk = _mlp((n_obs, *hidden), final_activation=True)
        self.value = _mlp((hidden[-1], 1), final_activation=False)
        self.advantage = _mlp((hidden[-1], n_actions), final_activation=False)

    def forward(self, obs):
        features = self.trunk(obs)  # [hidden, B]
        advantage = self.advantage(features)  # [actions, B]
        centred = rc.sub(advantage, rc.mean(advantage, dim=0))  # [actions, B]
        return rc.add(self.value(features), centred)  # [actions, B]


def _q_network(n_obs: int, n_actions: int, hidden: tuple[int, ...], dueling: bool) -> rc.nn.Module:
    """The Q-network: an MLP, or a dueling network on the same hidden layers."""
    if dueling:
        return DuelingQNetwork(n_obs, n_actions, hidden)
    return _mlp((n_obs, *hidden, n_actions), final_activation=False)


class DQN:
    """DQN on ``env`` (a Gymnasium environment or its id) with ``config`` on ``device``."""

    algo = "DQN"

    def __init__(self, env, config: DQNConfig | None = None, device: str | None = None, seed: int | None = None,
                 logdir: str | None = None):
        import gymnasium as gym

        self.config = config or DQNConfig()
        self.env = make_env(env, seed)
        if not isinstance(self.env.action_space, gym.spaces.Discrete):
            raise ValueError(f"DQN needs a Discrete action space, got {self.env.action_space}")
        if not isinstance(self.env.observation_space, gym.spaces.Box):
            raise ValueError(f"DQN needs a Box observation space, got {self.env.observation_space}")
        self.device = device or rc.device()
        self.seed = seed
        self.n_obs = int(np.prod(self.env.observation_space.shape))
        self.n_actions = int(self.env.action_space.n)
        self.logdir = logdir
        previous = rc.device(self.device)
        try:
            if seed is not None:
                rc.manual_seed(seed)
            cfg = self.config
            self.q = _q_network(self.n_obs, self.n_actions, cfg.net_arch, cfg.dueling)
            self.target = _q_network(self.n_obs, self.n_actions, cfg.net_arch, cfg.dueling)
            self.target.load_state_dict(self.q.state_dict())
            self.optimizer = rc.optim.Adam(self.q.parameters(), lr=cfg.learning_rate)
            self.buffer = ReplayBuffer(cfg.buffer_size, self.n_obs, 1, action_dtype="i32", gamma=cfg.gamma, seed=seed)
            self._update_target = Polyak(self.target.parameters(), self.q.parameters())
            self._train_step = rc.capture_step(self._loss, self.q.parameters(), self.optimizer,
                                               max_grad_norm=cfg.max_grad_norm)
        finally:
            rc.device(previous)
        self._rng = np.random.default_rng(seed)
        self.num_timesteps = 0

    # ---- the update (traced once, then replayed) ----------------------------------------------

    def _loss(self, stored):
        cfg = self.config
        s = self.buffer.sample_on_device(cfg.batch_size, stored)
        with rc.no_grad():
            next_q = self.target(s.next_obs)  # [actions, B]
            if cfg.double:
                best_next = rc.gather(next_q, rc.argmax(self.q(s.next_obs)))
            else:
                best_next = rc.max(next_q)
            td_target = rc.stop_gradient(s.reward + s.discount * (1.0 - s.done) * best_next)  # [1, B]
        q_taken = rc.gather(self.q(s.obs), s.action)  # [1, B]
        return rc.huber_loss(q_taken, td_target)

    # ---- acting ----------------------------------------------------------------------------------

    def predict(self, obs, deterministic: bool = True):
        """The greedy action for one observation (an int), or for a batch [n, obs] (an array)."""
        obs = np.asarray(obs, np.float32)
        single = obs.ndim == len(self.env.observation_space.shape)
        batch = obs.reshape(1 if single else obs.shape[0], self.n_obs)
        previous = rc.device(self.device)
        try:
            with rc.no_grad():
                actions = rc.argmax(self.q(rc.tensor(np.asfortranarray(batch.T)))).numpy()[0]
        finally:
            rc.device(previous)
        return int(actions[0]) if single else actions

    def _epsilon(self, total_timesteps: int) -> float:
        cfg = self.config
        progress = min(1.0, self.num_timesteps / max(1.0, cfg.exploration_fraction * total_timesteps))
        return cfg.exploration_initial_eps + progress * (cfg.exploration_final_eps - cfg.exploration_initial_eps)

    # ---- training --------------------------------------------------------------------------------

    def learn(self, total_timesteps: int, progress_bar: bool = False, callback=None) -> "DQN":
        """Trains for ``total_timesteps`` environment steps. ``callback(agent, locals)``
        returning False stops early."""
        if isinstance(total_timesteps, bool) or not isinstance(total_timesteps, int) or total_timesteps < 1:
            raise ValueError(f"learn: total_timesteps must be a positive int, got {total_timesteps!r}")
        cfg = self.config
        writer = SummaryWriter(run_dir(self.logdir, self.algo)) if self.logdir else None
        if writer is not None:
            writer.add_hparams({**asdict(self.config), "env": str(self.env.spec.id if self.env.spec else self.env)})
        stats = EpisodeStats()
        bar = None
        if progress_bar:
            from tqdm import tqdm

            bar = tqdm(total=total_timesteps, desc=self.algo)
        previous = rc.device(self.device)
        loss = float("nan")
        try:
            obs, _ = self.env.reset(seed=self.seed)
            for _ in range(total_timesteps):
                if self._rng.random() < self._epsilon(total_timesteps):
                    action = int(self.env.action_space.sample())
                else:
                    action = self.predict(obs)
                next_obs, reward, terminated, truncated, _ = self.env.step(action)
                self.buffer.add(obs[None], [[action]], [reward], next_obs[None], [terminated], [truncated])
                stats.step(reward, terminated or truncated)
                obs = self.env.reset()[0] if terminated or truncated else next_obs
                self.num_timesteps += 1
                if self.num_timesteps > cfg.learning_starts and self.num_timesteps % cfg.train_freq == 0:
                    stored = np.array([[len(self.buffer)]], np.float32)
                    for _ in range(cfg.gradient_steps):
                        loss, _ = self._train_step(stored=stored)
                if self.num_timesteps % cfg.target_update_interval == 0:
                    self._update_target(cfg.tau)
                if writer is not None and self.num_timesteps % cfg.log_interval == 0:
                    self._log(writer, stats, loss, total_timesteps)
                if bar is not None:
                    bar.update(1)
                if callback is not None and callback(self, locals()) is False:
                    break
        finally:
            rc.device(previous)
            if bar is not None:
                bar.close()
            if writer is not None:
                writer.close()
        return self

    def _log(self, writer, stats: EpisodeStats, loss: float, total_timesteps: int) -> None:
        step = self.num_timesteps
        means = stats.means()
        if means is not None:
            writer.add_scalar("rollout/ep_rew_mean", means[0], step)
            writer.add_scalar("rollout/ep_len_mean", means[1], step)
        writer.add_scalar("rollout/exploration_rate", self._epsilon(total_timesteps), step)
        if np.isfinite(loss):
            writer.add_scalar("train/loss", loss, step)
        writer.add_scalar("train/learning_rate", self.optimizer.lr, step)

    # ---- saving ----------------------------------------------------------------------------------

    def save(self, path: str) -> None:
        """The Q-network, target network and optimizer (safetensors) with the config (JSON)."""
        meta = {"algo": self.algo, "config": asdict(self.config), "n_obs": self.n_obs, "n_actions": self.n_actions,
                "env": self.env.spec.id if self.env.spec else None, "num_timesteps": self.num_timesteps}
        save_checkpoint(path, {"q": self.q, "target": self.target, "optimizer": self.optimizer}, metadata=meta)

    @classmethod
    def load(cls, path: str, env=None, device: str | None = None) -> "DQN":
        """An agent that acts exactly as the saved one."""
        from rlkit.checkpoint import read_checkpoint

        meta = read_checkpoint(path)["metadata"]
        config = DQNConfig(**{**meta["config"], "net_arch": tuple(meta["config"]["net_arch"])})
        agent = cls(env if env is not None else meta["env"], config, device=device)
        load_checkpoint(path, {"q": agent.q, "target": agent.target, "optimizer": agent.optimizer})
        agent.num_timesteps = meta["num_timesteps"]
        return agent

