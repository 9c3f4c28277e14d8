"""SAC for discrete actions (Christodoulou, 2019): a categorical policy over the actions,
twin critics that value every action at once, expectations over the policy's probabilities in
place of sampled actions, and the entropy coefficient tuned toward a fraction of the largest
possible entropy; on a Gymnasium environment with a Discrete action space.

Each gradient step is one captured program: a batch sampled on the device from the replay
buffer, the critics', the actor's and the entropy coefficient's updates and the polyak update
of the target critics. Acting is one forward of the actor per environment step, the action
drawn on the device (Gumbel-max).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import rlkit.core as rc
from rlkit.agents.config import OffPolicyConfig, check_in_range
from rlkit.agents.networks import encoded_mlp, mlp
from rlkit.agents.observations import ObservationLayout
from rlkit.agents.sac import SAC, initial_ent_coef
from rlkit.core.checks import positive_int


@dataclass
class DiscreteSACConfig(OffPolicyConfig):
    """Discrete SAC's hyperparameters, the shared ones documented in OffPolicyConfig (CleanRL's
    discrete SAC, with a polyak target, sized for classic control); ``net_arch`` sizes the
    actor and each critic."""

    buffer_size: int = 100_000
    learning_starts: int = 1000

    ent_coef: float | str = "auto"
    """The entropy coefficient alpha: a fixed number, or "auto" (tuned, starting at 1) or
    "auto_<x>" (tuned, starting at x)."""
    target_entropy_scale: float = 0.89
    """The tuning aims at this fraction of the largest entropy, log(number of actions)."""
    target_update_interval: int = 1
    """Gradient steps between target-critic updates."""

    def __post_init__(self):
        super().__post_init__()
        positive_int(self.target_update_interval, "DiscreteSACConfig: target_update_interval")
        initial_ent_coef(self.ent_coef)
        check_in_range(self, "target_entropy_scale", 0.0, 1.0)

class DiscreteCritics(rc.nn.Module):
    """Two critics on one observation encoder, each giving Q of every action: [actions, B]."""

    def __init__(self, layout: ObservationLayout, n_actions: int, hidden: tuple[int, ...], features_extractor_kwargs: dict | None = None):
        super().__init__()
        self.encoder, features = layout.features_extractor(features_extractor_kwargs)
        self.q0 = mlp((features, *hidden, n_actions), final_activation=False)
        self.q1 = mlp((features, *hidden, n_actions), final_activation=False)

    def forward(self, obs) -> list:
        features = self.encoder(obs)  # [features, B]
        return [self.q0(features), self.q1(features)]  # 2 x [actions, B]

    def min(self, obs):
        """The smaller of the two critics' values, per action: [actions, B]."""
        q0, q1 = self(obs)
        return rc.minimum(q0, q1)


class DiscreteSAC(SAC):
    """Discrete SAC on ``env`` (a Gymnasium environment, its id, or a vector environment) with
    ``config`` on ``device``; TensorBoard runs go to ``<logdir>/DiscreteSAC_<N>``. Its networks,
    losses and acting are its own; how SAC builds optimizers and the buffer, orders each
    gradient step's updates and runs them, explores (by sampling the policy) and saves is
    shared."""

    algo = "DiscreteSAC"
    config_class = DiscreteSACConfig

    def _check_spaces(self) -> None:
        self._require_spaces("discrete")

    def _make_networks(self) -> None:
        """The actor (logits), the two critics and their targets, and the target entropy."""
        cfg = self.config
        self.n_actions = int(self.action_space.n)
        self.target_entropy = cfg.target_entropy_scale * math.log(self.n_actions)
        self.actor = encoded_mlp(self.obs_layout, cfg.pi_arch, self.n_actions, cfg.features_extractor_kwargs)  # logits
        self.critic = DiscreteCritics(self.obs_layout, self.n_actions, cfg.qf_arch, cfg.features_extractor_kwargs)
        self.critic_target = DiscreteCritics(self.obs_layout, self.n_actions, cfg.qf_arch, cfg.features_extractor_kwargs)

    def _buffer_action(self) -> tuple[int, str]:
        """Rows and dtype of a stored action: its index."""
        return 1, "i32"

    # ---- the update (traced once per variant, then replayed) ----------------------------------

    def _policy_distribution(self, obs):
        """(probabilities, log-probabilities) of every action: 2 x [actions, B]."""
        logits = self.actor(obs)  # [actions, B]
        return rc.softmax(logits), rc.log_softmax(logits)

    def _critic_loss(self, s, alpha):
        """The critics' mean squared errors, summed, against the soft target
        r + gamma (1 - done) sum_a' pi(a'|s') (min Q_target(s', a') - alpha log pi(a'|s'))."""
        with rc.no_grad():
            probs, log_probs = self._policy_distribution(s.next_obs)  # [actions, B]
            soft_q = self.critic_target.min(s.next_obs) - alpha * log_probs  # [actions, B]
            next_value = rc.sum(probs * soft_q, dim=0)  # [1, B]
            target = rc.stop_gradient(s.reward + s.discount * (1.0 - s.done) * next_value)  # [1, B]
        q0, q1 = self.critic(s.obs)
        return rc.mse_loss(rc.gather(q0, s.action), target) + rc.mse_loss(rc.gather(q1, s.action), target)

    def _actor_loss(self, s, alpha):
        """The mean over the batch of sum_a pi(a|s) (alpha log pi(a|s) - min Q(s, a)), against the
        critics just updated; and sum_a pi(a|s) log pi(a|s) [1, B], minus the policy's entropy,
        which the entropy coefficient's update reads where SAC's reads the sampled actions'
        log-probabilities (SAC._update, shared)."""
        with rc.no_grad():
            min_q = rc.stop_gradient(self.critic.min(s.obs))  # [actions, B]
        probs, log_probs = self._policy_distribution(s.obs)  # [actions, B]
        loss = rc.mean(rc.sum(probs * (alpha * log_probs - min_q), dim=0))
        return loss, rc.sum(probs * log_probs, dim=0)

    # ---- acting ----------------------------------------------------------------------------------

    def _onnx_policy(self):
        return [self.actor], "argmax"  # the most likely action: predict's deterministic choice

    def _act(self, obs, deterministic: bool):
        logits = self.actor(obs)  # [actions, n]
        return rc.argmax(logits) if deterministic else rc.sample_categorical(logits)  # [1, n] i32
