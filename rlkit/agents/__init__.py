"""Off-policy agents on Gymnasium environments: DQN (double, dueling), and, by name for the
command line, ``ALGOS``."""

from rlkit.agents.common import OffPolicyAgent, evaluate
from rlkit.agents.dqn import DQN, DQNConfig

ALGOS = {"dqn": DQN}
"""The agent classes by their command-line names."""

__all__ = ["ALGOS", "DQN", "DQNConfig", "OffPolicyAgent", "evaluate"]
