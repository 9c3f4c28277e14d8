"""Recurrent SAC: SAC (Haarnoja et al., 2018) whose actor and critics read observation
histories through state-space (Mamba) or RWKV encoders, for partially observed continuous
control, trained from sequences R2D2-style (Kapturowski et al., 2019).

The actor and the critics each have their own encoder (the critics share one, and the target
critics a copy of it). Each gradient step is one captured program: windows of
``burn_in + sequence_length`` steps sampled on the device, every network run over them from a
zero state (the burn-in steps carry no loss), the critics' update against the soft target
(the actor and the target critics run over the windows' next observations), the actor's
update, the entropy coefficient's and the polyak update of the target critics. Acting runs the
actor's encoder one step at a time with a state carried per environment lane.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import rlkit.core as rc
from rlkit.agents.config import OffPolicyConfig
from rlkit.agents.observations import ObservationLayout
from rlkit.agents.polyak import Polyak
from rlkit.agents.recurrent import (
    RecurrentAgent, SequenceEncoder, burn_in_weights, check_encoder_fields, flat_steps, learning_weights,
)
from rlkit.agents.sac import EntropyCoefficient, GaussianActor, initial_ent_coef
from rlkit.agents.td3 import Critics
from rlkit.buffers import ReplayBuffer
from rlkit.core.checks import positive_int


@dataclass
class RecurrentSACConfig(OffPolicyConfig):
    """Recurrent SAC's hyperparameters, the shared ones documented in OffPolicyConfig;
    ``batch_size`` counts sequences and ``net_arch`` sizes the actor's head and each critic's
    head. The defaults are set for velocity-hidden Pendulum (rlkit/PendulumNoVel-v1); the SAC
    ones are RL Zoo's Pendulum settings."""

    learning_rate: float = 1e-3
    buffer_size: int = 200_000
    learning_starts: int = 1000
    batch_size: int = 16
    net_arch: tuple[int, ...] = (64, 64)

    sequence_length: int = 16
    """Steps of each sequence that carry loss."""
    burn_in: int = 8
    """Steps before them that only warm the encoders' states up (R2D2's burn-in)."""
    ent_coef: float | str = "auto"
    """The entropy coefficient alpha: a fixed number, or "auto" (tuned, starting at 1) or
    "auto_<x>" (tuned, starting at x)."""
    target_entropy: float | str = "auto"
    """The entropy the tuning aims at; "auto" is minus the number of action dimensions."""
    n_critics: int = 2
    """Critics whose minimum makes the target (clipped double Q)."""
    encoder: str = "mamba"
    """The sequence layer: "mamba" (a Mamba block) or "rwkv" (an RWKV-7 block)."""
    d_model: int = 32
    """The encoders' width."""
    d_state: int = 16
    """The Mamba blocks' state size per channel (unused by RWKV)."""
    previous_action: bool = True
    """Feed each step's previous action to the encoders with the observation."""

    def __post_init__(self):
        super().__post_init__()
        check_encoder_fields(self)
        positive_int(self.n_critics, "RecurrentSACConfig: n_critics")
        if not (self.pi_arch and self.qf_arch):
            raise ValueError("RecurrentSACConfig: net_arch needs at least one hidden layer")
        initial_ent_coef(self.ent_coef)
        if self.target_entropy != "auto" and (isinstance(self.target_entropy, (bool, str))
                                              or not np.isfinite(float(self.target_entropy))):
            raise ValueError("RecurrentSACConfig: target_entropy must be a finite number or 'auto', "
                             f"got {self.target_entropy!r}")

class RecurrentActor(rc.nn.Module):
    """A sequence encoder, then SAC's tanh-squashed Gaussian head on each step's features."""

    def __init__(self, n_inputs: int, n_actions: int, config: RecurrentSACConfig):
        super().__init__()
        self.encoder = SequenceEncoder(n_inputs, config.d_model, config.d_state, config.encoder)
        self.head = GaussianActor(ObservationLayout.vector(config.d_model), n_actions, config.pi_arch)

    def sample(self, inputs):
        """(actions [actions, T * B], log-probabilities [1, T * B]) for windows of the encoder's
        inputs [n_inputs, T, B]."""
        features, _ = self.encoder(inputs)  # [d_model, T, B]
        return self.head.sample(flat_steps(features))


class RecurrentCritics(rc.nn.Module):
    """One sequence encoder shared by ``n`` critic heads (SAC's twin critics)."""

    def __init__(self, n_inputs: int, n_actions: int, config: RecurrentSACConfig):
        super().__init__()
        self.encoder = SequenceEncoder(n_inputs, config.d_model, config.d_state, config.encoder)
        self.heads = Critics(config.n_critics, ObservationLayout.vector(config.d_model), n_actions, config.qf_arch)

    def features(self, inputs):
        """The encoder's features of input windows [n_inputs, T, B], one column per step:
        [d_model, T * B]."""
        return flat_steps(self.encoder(inputs)[0])


class RecurrentSAC(RecurrentAgent):
    """Recurrent SAC on ``env`` (a Gymnasium environment, its id, or a vector environment) with
    ``config`` on ``device``; TensorBoard runs go to ``<logdir>/RecurrentSAC_<N>``."""

    algo = "RecurrentSAC"
    config_class = RecurrentSACConfig

    def _check_spaces(self) -> None:
        self._require_spaces("bounded box")

    def _build(self) -> None:
        cfg = self.config
        alpha, self.tune_alpha = initial_ent_coef(cfg.ent_coef)
        self.n_actions = int(np.prod(self.action_space.shape))
        self.target_entropy = -float(self.n_actions) if cfg.target_entropy == "auto" else float(cfg.target_entropy)
        self.actor = RecurrentActor(self.encoder_inputs, self.n_actions, cfg)
        self.critic = RecurrentCritics(self.encoder_inputs, self.n_actions, cfg)
        self.critic_target = RecurrentCritics(self.encoder_inputs, self.n_actions, cfg)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.ent_coef = EntropyCoefficient(alpha)
        self.actor_optimizer = rc.optim.Adam(self.actor.parameters(), lr=cfg.learning_rate)
        self.critic_optimizer = rc.optim.Adam(self.critic.parameters(), lr=cfg.learning_rate)
        self.ent_coef_optimizer = rc.optim.Adam(self.ent_coef.parameters(), lr=cfg.learning_rate)
        self.buffer = ReplayBuffer(cfg.buffer_size, self.n_obs, self.n_actions, n_envs=self.lanes.n,
                                   device=self.device, gamma=cfg.gamma, seed=self.seed)
        self._burn_in_weights = burn_in_weights(cfg.burn_in, cfg.sequence_length, self.device)  # [1, T, 1]
        self._update_target = Polyak(self.critic_target.parameters(), self.critic.parameters())
        params = [*self.actor.parameters().values(), *self.critic.parameters().values(),
                  *self.critic_target.parameters().values(), self.ent_coef.log_alpha]
        self._step = rc.capture(self._update, params)

    # ---- the update (traced once, then replayed) ----------------------------------------------

    def _critic_loss(self, s, inputs, next_inputs, weights, count, alpha):
        """Half the critics' summed weighted mean squared errors against the soft target
        r + gamma (1 - terminated) (min Q_target(h', a') - alpha log pi(a' | h'))."""
        with rc.no_grad():
            next_action, next_log_prob = self.actor.sample(next_inputs)  # [actions, T * B], [1, T * B]
            next_features = self.critic_target.features(next_inputs)  # [d_model, T * B]
            next_q = self.critic_target.heads.min(next_features, next_action) - alpha * next_log_prob
            not_terminated = rc.sub(1.0, flat_steps(s.terminated))  # [1, T * B]
            target = rc.stop_gradient(flat_steps(s.reward) + self.config.gamma * not_terminated * next_q)
        features = self.critic.features(inputs)  # [d_model, T * B]
        action = flat_steps(s.action)  # [actions, T * B]
        total = None
        for q in self.critic.heads(features, action):  # n x [1, T * B]
            error = rc.div(rc.sum(weights * rc.square(q - target)), count)  # [1, 1]
            total = error if total is None else total + error
        return 0.5 * total

    def _actor_loss(self, inputs, features, weights, count, alpha):
        """The weighted mean over the windows' steps of alpha log pi(a | h) - min Q(h, a), a
        sampled from the policy and Q read from the updated critics' ``features``; and the
        sampled actions' log-probabilities [1, T * B], which the entropy coefficient's update reads."""
        action, log_prob = self.actor.sample(inputs)  # [actions, T * B], [1, T * B]
        value = alpha * log_prob - self.critic.heads.min(features, action)  # [1, T * B]
        return rc.div(rc.sum(weights * value), count), log_prob

    def _update(self, starts):
        cfg = self.config
        s = self.buffer.sample_sequences_on_device(cfg.batch_size, cfg.sequence_length, cfg.burn_in, starts)
        inputs, next_inputs = self._window_inputs(s)  # [encoder_inputs, T, B] each
        weights, count = learning_weights(s, self._burn_in_weights)  # [1, T * B], [1, 1]
        alpha = rc.stop_gradient(rc.exp(self.ent_coef.log_alpha))  # [1, 1], this step's alpha
        critic_loss, critic_norm = rc.update_step(
            lambda: self._critic_loss(s, inputs, next_inputs, weights, count, alpha),
            self.critic.parameters(), self.critic_optimizer)
        with rc.no_grad():
            features = rc.stop_gradient(self.critic.features(inputs))  # the updated critics' view of the windows
        actor_loss, actor_norm, log_prob = rc.update_step(
            lambda: self._actor_loss(inputs, features, weights, count, alpha), self.actor.parameters(),
            self.actor_optimizer)
        outputs, norms = [critic_loss, actor_loss, alpha], [critic_norm, actor_norm]
        if self.tune_alpha:  # fixed for the agent's life: decided once, when the update is traced
            error = rc.stop_gradient(log_prob + self.target_entropy)  # [1, T * B]
            ent_coef_loss, ent_coef_norm = rc.update_step(
                lambda: -rc.div(rc.sum(weights * self.ent_coef.log_alpha * error), count),
                self.ent_coef.parameters(), self.ent_coef_optimizer)
            outputs.append(ent_coef_loss)
            norms.append(ent_coef_norm)
        self._update_target(cfg.tau)
        return (*outputs, rc.capturing.skipped_count(norms))  # the skipped updates last

    def _train(self, gradient_steps: int) -> dict[str, float]:
        starts = self.buffer.sequence_starts()
        if starts[1, 0] < self.config.burn_in + self.config.sequence_length:
            return {}  # not a whole window stored per lane yet
        for _ in range(gradient_steps):
            *outputs, skipped = [float(np.asarray(v).reshape(-1)[0]) for v in self._step(starts=starts)]
            self.skipped_updates += int(skipped)
        scalars = {"train/critic_loss": outputs[0], "train/actor_loss": outputs[1], "train/ent_coef": outputs[2],
                   "train/learning_rate": self.actor_optimizer.lr}
        if self.tune_alpha:
            scalars["train/ent_coef_loss"] = outputs[3]
        return scalars

    # ---- acting ----------------------------------------------------------------------------------

    def _policy_encoder(self) -> SequenceEncoder:
        return self.actor.encoder

    def _act_step(self, inputs, state, deterministic: bool):
        features, state = self.actor.encoder.step(inputs, state)  # [d_model, n]
        head = self.actor.head
        return (head(features) if deterministic else head.sample(features)[0]), state  # [actions, n]

    def _policy_parameters(self) -> list:
        return list(self.actor.parameters().values())

    def _explore(self, obs: np.ndarray) -> np.ndarray:
        """A sample of the policy (its noise drawn on the device), advancing the lanes' states."""
        return self._policy(obs, deterministic=False)

    def _state_objects(self) -> dict:
        return {"actor": self.actor, "critic": self.critic, "critic_target": self.critic_target,
                "ent_coef": self.ent_coef, "actor_optimizer": self.actor_optimizer,
                "critic_optimizer": self.critic_optimizer, "ent_coef_optimizer": self.ent_coef_optimizer}
