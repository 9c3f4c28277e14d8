"""DDPG (Lillicrap et al., 2016): a deterministic actor and one critic, updated together at
every gradient step, with no target-policy smoothing. As in Stable-Baselines3 it is TD3 with
those three choices fixed (one critic, no delay, no smoothing noise); the code is TD3's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rlkit.agents.config import check_common_fields, check_in_range
from rlkit.agents.td3 import TD3


@dataclass
class DDPGConfig:
    """Hyperparameters (the defaults are RL Zoo's tuned Pendulum-v1 settings)."""

    learning_rate: float = 1e-3
    """Adam's learning rate, for the actor and the critic."""
    buffer_size: int = 200_000
    """Transitions the replay buffer holds."""
    learning_starts: int = 10_000
    """Environment steps taken with uniform random actions before the first gradient step."""
    batch_size: int = 256
    """Transitions per gradient step."""
    tau: float = 0.005
    """Polyak coefficient of the target updates."""
    gamma: float = 0.98
    """Discount factor."""
    train_freq: int = 1
    """Environment steps between rounds of gradient steps."""
    gradient_steps: int = 1
    """Gradient steps per round."""
    action_noise_std: float = 0.1
    """Standard deviation of the Gaussian exploration noise, in the [-1, 1] action scale."""
    net_arch: tuple[int, ...] = field(default=(400, 300))
    """Hidden layer sizes of the actor and of the critic."""
    n_envs: int = 1
    """Environments stepped together (a vector environment made from the id when > 1)."""
    log_interval: int = 1000
    """Environment steps between TensorBoard writes."""

    policy_delay: ClassVar[int] = 1
    """DDPG updates the actor at every critic update."""
    target_policy_noise: ClassVar[float] = 0.0
    """DDPG's target actions are the target actor's, unsmoothed."""
    target_noise_clip: ClassVar[float] = 0.0
    n_critics: ClassVar[int] = 1
    """One critic (TD3 takes the minimum of two)."""

    def __post_init__(self):
        check_common_fields(self)
        check_in_range(self, "action_noise_std", 0.0, 10.0)
        if not self.net_arch:
            raise ValueError("DDPGConfig: net_arch needs at least one hidden layer")


class DDPG(TD3):
    """DDPG on ``env`` (a Gymnasium environment, its id, or a vector environment) with
    ``config`` on ``device``; TensorBoard runs go to ``<logdir>/DDPG_<N>``."""

    algo = "DDPG"
    config_class = DDPGConfig
