"""Off-policy agents on Gymnasium environments. So far: DQN (and double DQN)."""

from rlkit.agents.common import evaluate
from rlkit.agents.dqn import DQN, DQNConfig

__all__ = ["DQN", "DQNConfig", "evaluate"]
