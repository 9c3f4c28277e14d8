"""DDPG (Lillicrap et al., 2016): a deterministic actor and one critic, updated together at
every gradient step, with no target-policy smoothing. As in Stable-Baselines3 it is TD3 with
those three choices fixed (one critic, no delay, no smoothing noise); the code is TD3's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlkit.agents.config import OffPolicyConfig, check_in_range
from rlkit.agents.td3 import TD3


@dataclass
class DDPGConfig(OffPolicyConfig):
    """DDPG's hyperparameters, the shared ones documented in OffPolicyConfig (the defaults are
    RL Zoo's tuned Pendulum-v1 settings); ``net_arch`` sizes the actor and the critic."""

    learning_rate: float = 1e-3
    buffer_size: int = 200_000
    learning_starts: int = 10_000
    gamma: float = 0.98
    net_arch: tuple[int, ...] = (400, 300)

    action_noise_std: float = 0.1
    """Standard deviation of the Gaussian exploration noise, in the [-1, 1] action scale."""

    policy_delay: ClassVar[int] = 1
    """DDPG updates the actor at every critic update."""
    target_policy_noise: ClassVar[float] = 0.0
    """DDPG's target actions are the target actor's, unsmoothed."""
    target_noise_clip: ClassVar[float] = 0.0
    n_critics: ClassVar[int] = 1
    """One critic (TD3 takes the minimum of two)."""

    def __post_init__(self):
        super().__post_init__()
        check_in_range(self, "action_noise_std", 0.0, 10.0)
        if not (self.pi_arch and self.qf_arch):
            raise ValueError("DDPGConfig: net_arch needs at least one hidden layer")

class DDPG(TD3):
    """DDPG on ``env`` (a Gymnasium environment, its id, or a vector environment) with
    ``config`` on ``device``; TensorBoard runs go to ``<logdir>/DDPG_<N>``."""

    algo = "DDPG"
    config_class = DDPGConfig
