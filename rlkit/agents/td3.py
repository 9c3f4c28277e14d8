"""TD3 (Fujimoto et al., 2018): twin critics whose minimum is the target, target-policy
smoothing noise, and actor and target updates delayed to every ``policy_delay`` critic updates;
on a Gymnasium environment with a bounded Box action space.

Each gradient step is one captured program: a batch sampled on the device from the replay
buffer, the critics' update and, every ``policy_delay``-th step, the actor's update and the
polyak update of all targets. Acting is one forward of the actor per environment step, with
Gaussian exploration noise added on the host. Actions live in [-1, 1] (the actor's tanh) and
are rescaled to the space's bounds on their way to the environment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import rlkit.core as rc
from rlkit.agents.base import OffPolicyAgent
from rlkit.agents.config import OffPolicyConfig, check_in_range
from rlkit.agents.networks import mlp
from rlkit.agents.observations import ObservationLayout
from rlkit.agents.polyak import Polyak
from rlkit.core.checks import positive_int


@dataclass
class TD3Config(OffPolicyConfig):
    """TD3's hyperparameters, the shared ones documented in OffPolicyConfig (the defaults are
    RL Zoo's tuned Pendulum-v1 settings); ``net_arch`` sizes the actor and each critic."""

    learning_rate: float = 1e-3
    buffer_size: int = 200_000
    learning_starts: int = 10_000
    gamma: float = 0.98
    net_arch: tuple[int, ...] = (400, 300)

    action_noise_std: float = 0.1
    """Standard deviation of the Gaussian exploration noise, in the [-1, 1] action scale."""
    policy_delay: int = 2
    """Critic updates per actor (and target) update."""
    target_policy_noise: float = 0.2
    """Standard deviation of the smoothing noise on the target actions."""
    target_noise_clip: float = 0.5
    """The smoothing noise is clipped to +- this."""
    n_critics: int = 2
    """Critics whose minimum makes the target (clipped double Q)."""

    def __post_init__(self):
        super().__post_init__()
        for name in ("policy_delay", "n_critics"):
            positive_int(getattr(self, name), f"{type(self).__name__}: {name}")
        for name in ("action_noise_std", "target_policy_noise", "target_noise_clip"):
            check_in_range(self, name, 0.0, 10.0)
        if not (self.pi_arch and self.qf_arch):
            raise ValueError(f"{type(self).__name__}: net_arch needs at least one hidden layer")

class Actor(rc.nn.Module):
    """The deterministic policy: the observation encoder, then an MLP ending in tanh, actions
    in [-1, 1]."""

    def __init__(self, layout: ObservationLayout, n_actions: int, hidden: tuple[int, ...], features_extractor_kwargs: dict | None = None):
        super().__init__()
        self.encoder, features = layout.features_extractor(features_extractor_kwargs)
        self.net = mlp((features, *hidden, n_actions), final_activation=False)

    def forward(self, obs):
        return rc.tanh(self.net(self.encoder(obs)))  # [actions, B]


class Critic(rc.nn.Module):
    """Q(s, a): an MLP on the observation's features and the action stacked as rows."""

    def __init__(self, features: int, n_actions: int, hidden: tuple[int, ...]):
        super().__init__()
        self.net = mlp((features + n_actions, *hidden, 1), final_activation=False)

    def forward(self, features, action):
        return self.net(rc.concat_rows(features, action))  # [1, B]


class Critics(rc.nn.Module):
    """``n`` independent critics, listed as ``q0``, ``q1``, ..., on one observation encoder
    (as SB3's critic shares its features extractor between its Q-networks; the actor has its
    own)."""

    def __init__(self, n: int, layout: ObservationLayout, n_actions: int, hidden: tuple[int, ...],
                 features_extractor_kwargs: dict | None = None):
        super().__init__()
        self.n = n
        self.encoder, features = layout.features_extractor(features_extractor_kwargs)
        for i in range(n):
            setattr(self, f"q{i}", Critic(features, n_actions, hidden))

    def forward(self, obs, action) -> list:
        features = self.encoder(obs)  # [features, B]
        return [getattr(self, f"q{i}")(features, action) for i in range(self.n)]  # n x [1, B]

    def first(self, obs, action):
        """The first critic's value alone: [1, B] (TD3's actor loss)."""
        return self.q0(self.encoder(obs), action)

    def squared_error(self, obs, action, target):
        """The critics' mean squared errors against ``target`` [1, B], summed: [1, 1]."""
        losses = [rc.mse_loss(q, target) for q in self(obs, action)]
        total = losses[0]
        for loss in losses[1:]:
            total = total + loss
        return total

    def min(self, obs, action):
        """The smallest of the critics' values: [1, B]."""
        values = self(obs, action)
        smallest = values[0]
        for value in values[1:]:
            smallest = rc.minimum(smallest, value)
        return smallest


class TD3(OffPolicyAgent):
    """TD3 on ``env`` (a Gymnasium environment, its id, or a vector environment) with
    ``config`` on ``device``; TensorBoard runs go to ``<logdir>/TD3_<N>``."""

    algo = "TD3"
    config_class = TD3Config

    def _check_spaces(self) -> None:
        self._require_spaces("bounded box")

    def _build(self) -> None:
        cfg = self.config
        self.n_actions = int(np.prod(self.action_space.shape))
        self.actor = Actor(self.obs_layout, self.n_actions, cfg.pi_arch, cfg.features_extractor_kwargs)
        self.actor_target = Actor(self.obs_layout, self.n_actions, cfg.pi_arch, cfg.features_extractor_kwargs)
        self.actor_target.load_state_dict(self.actor.state_dict())
        self.critic = Critics(cfg.n_critics, self.obs_layout, self.n_actions, cfg.qf_arch, cfg.features_extractor_kwargs)
        self.critic_target = Critics(cfg.n_critics, self.obs_layout, self.n_actions, cfg.qf_arch, cfg.features_extractor_kwargs)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.actor_optimizer = rc.optim.Adam(self.actor.parameters(), lr=cfg.learning_rate)
        self.critic_optimizer = rc.optim.Adam(self.critic.parameters(), lr=cfg.learning_rate)
        self.buffer = self._replay_buffer(action_shape=self.n_actions, **self.obs_layout.buffer_options(self.env), n_envs=self.lanes.n,
                                   device=self.device, gamma=cfg.gamma, seed=self.seed)
        self._update_targets = [Polyak(self.critic_target.parameters(), self.critic.parameters()),
                                Polyak(self.actor_target.parameters(), self.actor.parameters())]
        params = [*self.actor.parameters().values(), *self.critic.parameters().values(),
                  *self.actor_target.parameters().values(), *self.critic_target.parameters().values()]
        self._capture_updates((False, True), params, deterministic=True)  # by with_actor
        self._n_updates = 0

    # ---- the update (traced once per variant, then replayed) ----------------------------------

    def _critic_loss(self, s):
        """Mean squared TD error of every critic against the clipped double-Q target, summed."""
        cfg = self.config
        with rc.no_grad():
            next_action = self.actor_target(s.next_obs)  # [actions, B]
            if cfg.target_policy_noise > 0:
                noise = rc.clamp(rc.scale(rc.randn(next_action.shape), cfg.target_policy_noise),
                                 -cfg.target_noise_clip, cfg.target_noise_clip)
                next_action = rc.clamp(next_action + noise, -1.0, 1.0)
            next_q = self.critic_target.min(s.next_obs, next_action)  # [1, B]
            target = rc.stop_gradient(s.reward + s.discount * (1.0 - s.done) * next_q)  # [1, B]
        return self.critic.squared_error(s.obs, s.action, target)

    def _actor_loss(self, s):
        """-Q of the first critic at the actor's actions, averaged over the batch."""
        return -rc.mean(self.critic.first(s.obs, self.actor(s.obs)))

    def _update(self, stored, with_actor: bool):
        s = self.buffer.sample_on_device(self.config.batch_size, stored)
        critic_loss, critic_norm = rc.update_step(lambda: self._critic_loss(s), self.critic.parameters(),
                                                             self.critic_optimizer)
        if not with_actor:  # decided while tracing: with_actor picks one of two programs
            return critic_loss, rc.full((1, 1), float("nan")), rc.capturing.skipped_count([critic_norm])
        actor_loss, actor_norm = rc.update_step(lambda: self._actor_loss(s), self.actor.parameters(),
                                                           self.actor_optimizer)
        for update in self._update_targets:
            update(self.config.tau)
        return critic_loss, actor_loss, rc.capturing.skipped_count([critic_norm, actor_norm])

    acts_in_updates = True

    def _next_variant(self) -> bool:
        """with_actor: whether this gradient step updates the actor and the targets too (every
        ``policy_delay``-th)."""
        self._n_updates += 1
        return self._n_updates % self.config.policy_delay == 0

    def _update_scalars(self, outputs: list[np.ndarray], with_actor: bool) -> dict[str, float]:
        critic_loss, actor_loss, skipped = [float(np.asarray(v).reshape(-1)[0]) for v in outputs]
        self.skipped_updates += int(skipped)
        scalars = {"train/critic_loss": critic_loss, "train/learning_rate": self.actor_optimizer.lr}
        if with_actor:
            scalars["train/actor_loss"] = actor_loss
        return scalars

    # ---- acting ----------------------------------------------------------------------------------

    def _act(self, obs, deterministic: bool):
        return self.actor(obs)  # [actions, n]

    def _policy_parameters(self) -> list:
        return list(self.actor.parameters().values())

    def _onnx_policy(self):
        return [self.actor.encoder, self.actor.net], "tanh"

    def _explore(self, obs: np.ndarray) -> np.ndarray:
        """The actor's actions plus Gaussian noise, clipped to [-1, 1]."""
        actions = self._policy(obs, deterministic=True)
        noise = self._rng.normal(0.0, self.config.action_noise_std, actions.shape)
        return np.clip(actions + noise, -1.0, 1.0).astype(np.float32)

    def _state_objects(self) -> dict:
        return {"actor": self.actor, "actor_target": self.actor_target, "critic": self.critic,
                "critic_target": self.critic_target, "actor_optimizer": self.actor_optimizer,
                "critic_optimizer": self.critic_optimizer}
