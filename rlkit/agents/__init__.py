"""Off-policy agents on Gymnasium environments: DQN (double, dueling, n-step, prioritized),
DDPG, TD3, SAC and discrete SAC, and recurrent DQN and SAC with a Mamba or RWKV encoder for partially
observed tasks (rlkit.envs), one file each; ``ALGOS`` names them for the command line."""

import rlkit.envs  # noqa: F401  (registers the partially observed tasks)

from rlkit.agents.acting import AgentPolicy
from rlkit.agents.base import OffPolicyAgent
from rlkit.agents.callbacks import (
    BaseCallback, CallbackList, CheckpointCallback, EvalCallback, EveryNTimesteps, FunctionCallback, StepEvent,
    StopTrainingOnMaxEpisodes, StopTrainingOnNoModelImprovement, StopTrainingOnRewardThreshold,
)
from rlkit.agents.config import OffPolicyConfig
from rlkit.agents.ddpg import DDPG, DDPGConfig
from rlkit.agents.discrete_sac import DiscreteSAC, DiscreteSACConfig
from rlkit.agents.dqn import DQN, DQNConfig
from rlkit.agents.evaluation import evaluate
from rlkit.agents.recurrent_dqn import RecurrentDQN, RecurrentDQNConfig
from rlkit.agents.recurrent_sac import RecurrentSAC, RecurrentSACConfig
from rlkit.agents.sac import SAC, SACConfig
from rlkit.agents.td3 import TD3, TD3Config

ALGOS = {"dqn": DQN, "ddpg": DDPG, "td3": TD3, "sac": SAC, "discrete_sac": DiscreteSAC,
         "recurrent_dqn": RecurrentDQN, "recurrent_sac": RecurrentSAC}
"""The agent classes by their command-line names."""

__all__ = ["ALGOS", "AgentPolicy", "BaseCallback", "CallbackList", "CheckpointCallback", "DDPG", "DDPGConfig", "DQN",
           "DQNConfig", "DiscreteSAC", "DiscreteSACConfig", "EvalCallback", "EveryNTimesteps", "FunctionCallback",
           "OffPolicyAgent", "OffPolicyConfig", "RecurrentDQN", "RecurrentDQNConfig", "RecurrentSAC",
           "RecurrentSACConfig", "SAC", "SACConfig", "StepEvent", "StopTrainingOnMaxEpisodes",
           "StopTrainingOnNoModelImprovement", "StopTrainingOnRewardThreshold", "TD3", "TD3Config", "evaluate"]
