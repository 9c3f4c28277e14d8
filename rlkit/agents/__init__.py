"""Off-policy agents on Gymnasium environments: DQN (double, dueling, n-step, prioritized),
DDPG, TD3, SAC and discrete SAC, one file each; ``ALGOS`` names them for the command line."""

from rlkit.agents.common import CheckpointCallback, EvalCallback, OffPolicyAgent, evaluate
from rlkit.agents.ddpg import DDPG, DDPGConfig
from rlkit.agents.discrete_sac import DiscreteSAC, DiscreteSACConfig
from rlkit.agents.dqn import DQN, DQNConfig
from rlkit.agents.sac import SAC, SACConfig
from rlkit.agents.td3 import TD3, TD3Config

ALGOS = {"dqn": DQN, "ddpg": DDPG, "td3": TD3, "sac": SAC, "discrete_sac": DiscreteSAC}
"""The agent classes by their command-line names."""

__all__ = ["ALGOS", "CheckpointCallback", "DDPG", "DDPGConfig", "DQN", "DQNConfig", "DiscreteSAC", "DiscreteSACConfig",
           "EvalCallback", "OffPolicyAgent", "SAC", "SACConfig", "TD3", "TD3Config", "evaluate"]
