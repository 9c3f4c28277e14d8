"""SAC (Haarnoja et al., 2018) for continuous actions: a tanh-squashed Gaussian policy, twin
critics whose minimum makes the soft target, and the entropy coefficient tuned automatically
toward a target entropy; on a Gymnasium environment with a bounded Box action space.

Each gradient step is one captured program: a batch sampled on the device from the replay
buffer, the critics' update, the actor's update, the entropy coefficient's update and the
polyak update of the target critics; the policy's noise is drawn on the device too. Acting is
one forward of the actor per environment step. Actions live in [-1, 1] (the tanh) and are
rescaled to the space's bounds on their way to the environment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import rlkit.core as rc
from rlkit.agents.base import OffPolicyAgent
from rlkit.agents.config import OffPolicyConfig
from rlkit.agents.networks import mlp
from rlkit.agents.observations import ObservationLayout
from rlkit.agents.polyak import Polyak
from rlkit.agents.td3 import Critics
from rlkit.core.checks import positive_int

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # the policy's log standard deviation is clamped here
HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)


@dataclass
class SACConfig(OffPolicyConfig):
    """SAC's hyperparameters, the shared ones documented in OffPolicyConfig (the defaults are
    RL Zoo's tuned Pendulum-v1 settings, which keep Stable-Baselines3's SAC defaults but the
    learning rate); ``net_arch`` sizes the actor and each critic."""

    learning_rate: float = 1e-3

    ent_coef: float | str = "auto"
    """The entropy coefficient alpha: a fixed number, or "auto" (tuned, starting at 1) or
    "auto_<x>" (tuned, starting at x)."""
    target_entropy: float | str = "auto"
    """The entropy the tuning aims at; "auto" is minus the number of action dimensions."""
    target_update_interval: int = 1
    """Gradient steps between target-critic updates."""
    n_critics: int = 2
    """Critics whose minimum makes the target (clipped double Q)."""

    def __post_init__(self):
        super().__post_init__()
        for name in ("target_update_interval", "n_critics"):
            positive_int(getattr(self, name), f"SACConfig: {name}")
        if not (self.pi_arch and self.qf_arch):
            raise ValueError("SACConfig: net_arch needs at least one hidden layer")
        initial_ent_coef(self.ent_coef)
        if self.target_entropy != "auto" and (isinstance(self.target_entropy, (bool, str))
                                              or not math.isfinite(float(self.target_entropy))):
            raise ValueError(f"SACConfig: target_entropy must be a finite number or 'auto', got {self.target_entropy!r}")

def initial_ent_coef(ent_coef) -> tuple[float, bool]:
    """(starting alpha, whether it is tuned) from a config's ``ent_coef``."""
    if isinstance(ent_coef, str) and (ent_coef == "auto" or ent_coef.startswith("auto_")):
        try:
            value = 1.0 if ent_coef == "auto" else float(ent_coef[len("auto_"):])
        except ValueError:
            value = -1.0
        if value > 0:
            return value, True
    elif isinstance(ent_coef, (int, float)) and not isinstance(ent_coef, bool) and 0 < ent_coef < math.inf:
        return float(ent_coef), False
    raise ValueError(f"ent_coef must be a positive number, 'auto' or 'auto_<positive number>', got {ent_coef!r}")


class GaussianActor(rc.nn.Module):
    """The policy: the observation encoder and an MLP trunk, then the mean and log standard deviation of a Gaussian whose
    samples are squashed by tanh into [-1, 1]."""

    def __init__(self, layout: ObservationLayout, n_actions: int, hidden: tuple[int, ...], features_extractor_kwargs: dict | None = None):
        super().__init__()
        self.encoder, features = layout.features_extractor(features_extractor_kwargs)
        self.trunk = mlp((features, *hidden), final_activation=True)
        self.mu = mlp((hidden[-1], n_actions), final_activation=False)
        self.log_std = mlp((hidden[-1], n_actions), final_activation=False)

    def forward(self, obs):
        """The deterministic action tanh(mean): [actions, B]."""
        return rc.tanh(self.mu(self.trunk(self.encoder(obs))))

    def sample(self, obs):
        """(action [actions, B], its log-probability [1, B]), reparameterised: a = tanh(u),
        u = mean + std * eps. log pi(a) = log N(u) - sum log(1 - tanh(u)^2), the second term
        written as 2 (log 2 - u - softplus(-2u)), which stays finite where tanh saturates."""
        features = self.trunk(self.encoder(obs))  # [hidden, B]
        mu = self.mu(features)  # [actions, B]
        log_std = rc.clamp(self.log_std(features), LOG_STD_MIN, LOG_STD_MAX)  # [actions, B]
        eps = rc.randn(mu.shape)  # [actions, B]
        u = mu + rc.exp(log_std) * eps
        gaussian = -0.5 * rc.square(eps) - log_std - HALF_LOG_TWO_PI  # log N(u; mu, std), per dimension
        squash = 2.0 * (math.log(2.0) - u - rc.softplus(-2.0 * u))  # log(1 - tanh(u)^2)
        return rc.tanh(u), rc.sum(gaussian - squash, dim=0)  # [actions, B], [1, B]


class EntropyCoefficient(rc.nn.Module):
    """log alpha, a trained scalar (the log keeps alpha positive)."""

    def __init__(self, initial: float):
        super().__init__()
        self.log_alpha = rc.param(np.array([[math.log(initial)]]))  # [1, 1]


class SAC(OffPolicyAgent):
    """SAC on ``env`` (a Gymnasium environment, its id, or a vector environment) with
    ``config`` on ``device``; TensorBoard runs go to ``<logdir>/SAC_<N>``."""

    algo = "SAC"
    config_class = SACConfig

    def _check_spaces(self) -> None:
        self._require_spaces("bounded box")

    def _make_networks(self) -> None:
        """The actor, the critics and their targets, and the target entropy."""
        cfg = self.config
        self.n_actions = int(np.prod(self.action_space.shape))
        self.target_entropy = -float(self.n_actions) if cfg.target_entropy == "auto" else float(cfg.target_entropy)
        self.actor = GaussianActor(self.obs_layout, self.n_actions, cfg.pi_arch, cfg.features_extractor_kwargs)
        self.critic = Critics(cfg.n_critics, self.obs_layout, self.n_actions, cfg.qf_arch, cfg.features_extractor_kwargs)
        self.critic_target = Critics(cfg.n_critics, self.obs_layout, self.n_actions, cfg.qf_arch, cfg.features_extractor_kwargs)

    def _buffer_action(self) -> tuple[int, str]:
        """Rows and dtype of a stored action: the [-1, 1] action vector."""
        return self.n_actions, "f32"

    def _build(self) -> None:
        cfg = self.config
        alpha, self.tune_alpha = initial_ent_coef(cfg.ent_coef)
        self._make_networks()
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.ent_coef = EntropyCoefficient(alpha)
        self.actor_optimizer = rc.optim.Adam(self.actor.parameters(), lr=cfg.learning_rate)
        self.critic_optimizer = rc.optim.Adam(self.critic.parameters(), lr=cfg.learning_rate)
        self.ent_coef_optimizer = rc.optim.Adam(self.ent_coef.parameters(), lr=cfg.learning_rate)
        action_rows, action_dtype = self._buffer_action()
        self.buffer = self._replay_buffer(action_shape=action_rows, **self.obs_layout.buffer_options(self.env), n_envs=self.lanes.n,
                                   device=self.device, action_dtype=action_dtype, gamma=cfg.gamma, seed=self.seed)
        self._update_target = Polyak(self.critic_target.parameters(), self.critic.parameters())
        params = [*self.actor.parameters().values(), *self.critic.parameters().values(),
                  *self.critic_target.parameters().values(), self.ent_coef.log_alpha]
        self._capture_updates((False, True), params, deterministic=False)  # by with_target
        self._n_updates = 0

    # ---- the update (traced once per variant, then replayed) ----------------------------------

    def _critic_loss(self, s, alpha):
        """Half the summed mean squared errors of the critics against the soft target
        r + gamma (1 - done) (min Q_target(s', a') - alpha log pi(a' | s'))."""
        with rc.no_grad():
            next_action, next_log_prob = self.actor.sample(s.next_obs)  # [actions, B], [1, B]
            next_q = self.critic_target.min(s.next_obs, next_action) - alpha * next_log_prob  # [1, B]
            target = rc.stop_gradient(s.reward + s.discount * (1.0 - s.done) * next_q)  # [1, B]
        return 0.5 * self.critic.squared_error(s.obs, s.action, target)

    def _actor_loss(self, s, alpha):
        """The mean over the batch of alpha log pi(a | s) - min Q(s, a), a sampled from the
        policy; and the log-probabilities of the sampled actions [1, B], which the entropy
        coefficient's update reads (the same sample: update_step returns them after the norm)."""
        action, log_prob = self.actor.sample(s.obs)  # [actions, B], [1, B]
        return rc.mean(alpha * log_prob - self.critic.min(s.obs, action)), log_prob

    def _update(self, stored, with_target: bool):
        # Traced once per with_target, then replayed: a Python `if` in this function is decided
        # while tracing and frozen into the program. So with_target picks one of two programs
        # (self._steps) instead of being tested in one, and only what is fixed for the agent's
        # life (tune_alpha) is tested here.
        s = self.buffer.sample_on_device(self.config.batch_size, stored)
        alpha = rc.stop_gradient(rc.exp(self.ent_coef.log_alpha))  # [1, 1], this step's alpha
        critic_loss, critic_norm = rc.update_step(lambda: self._critic_loss(s, alpha),
                                                             self.critic.parameters(), self.critic_optimizer)
        actor_loss, actor_norm, log_prob = rc.update_step(lambda: self._actor_loss(s, alpha),
                                                                     self.actor.parameters(), self.actor_optimizer)
        outputs, norms = [critic_loss, actor_loss, alpha], [critic_norm, actor_norm]
        if self.tune_alpha:
            error = rc.stop_gradient(log_prob + self.target_entropy)  # [1, B]
            ent_coef_loss, ent_coef_norm = rc.update_step(
                lambda: -rc.mean(self.ent_coef.log_alpha * error), self.ent_coef.parameters(), self.ent_coef_optimizer)
            outputs.append(ent_coef_loss)
            norms.append(ent_coef_norm)
        if with_target:
            self._update_target(self.config.tau)
        return (*outputs, rc.capturing.skipped_count(norms))  # the skipped updates last

    acts_in_updates = True

    def _next_variant(self) -> bool:
        """with_target: whether this gradient step updates the target critics too."""
        self._n_updates += 1
        return self._n_updates % self.config.target_update_interval == 0

    def _update_scalars(self, outputs: list[np.ndarray], with_target: bool) -> dict[str, float]:
        *values, skipped = [float(np.asarray(v).reshape(-1)[0]) for v in outputs]
        self.skipped_updates += int(skipped)
        scalars = {"train/critic_loss": values[0], "train/actor_loss": values[1], "train/ent_coef": values[2],
                   "train/learning_rate": self.actor_optimizer.lr}
        if self.tune_alpha:
            scalars["train/ent_coef_loss"] = values[3]
        return scalars

    # ---- acting ----------------------------------------------------------------------------------

    def _act(self, obs, deterministic: bool):
        return self.actor(obs) if deterministic else self.actor.sample(obs)[0]  # [actions, n]

    def _policy_parameters(self) -> list:
        return list(self.actor.parameters().values())

    def _onnx_policy(self):
        return [self.actor.encoder, self.actor.trunk, self.actor.mu], "tanh"  # tanh(mean): the deterministic action

    def _explore(self, obs: np.ndarray) -> np.ndarray:
        """A sample of the policy (its noise drawn on the device)."""
        return self._policy(obs, deterministic=False)

    def _state_objects(self) -> dict:
        return {"actor": self.actor, "critic": self.critic, "critic_target": self.critic_target,
                "ent_coef": self.ent_coef, "actor_optimizer": self.actor_optimizer,
                "critic_optimizer": self.critic_optimizer, "ent_coef_optimizer": self.ent_coef_optimizer}
