"""Run by tests/test_parallel.py under mpiexec: DQN on CartPole, rank 0 learning from the
other ranks' environments; rank 0 saves what it saw to argv[1] (steps stored in its buffer, its
return on 10 evaluation episodes) and every rank its policy's checksum after the last sync."""

import sys

import numpy as np

from rlkit.agents import DQN, DQNConfig, evaluate
from rlkit.agents.distributed import learn_distributed
from rlkit.core import parallel

total, out = int(sys.argv[2]), sys.argv[1]
comm = parallel.world()
config = dict(learning_starts=1000, train_freq=16, gradient_steps=8, target_update_interval=1000,
              exploration_fraction=0.3, batch_size=64, learning_rate=2.3e-3, net_arch=(64, 64))
agent = learn_distributed(lambda n_envs, seed: DQN("CartPole-v1", DQNConfig(n_envs=n_envs, **config), seed=seed),
                          total_timesteps=total, seed=0, rollout_steps=16, comm=comm)
checksum = float(sum(np.abs(p.numpy()).sum() for p in agent._policy_parameters()))
checksums = comm.gather(checksum)
if comm.is_root:
    mean, _ = evaluate(agent, "CartPole-v1", n_episodes=10, seed=100)
    np.savez(out, stored=len(agent.buffer), steps=agent.num_timesteps, lanes=agent.lanes.n, ret=mean,
             checksums=np.array(checksums))
