"""Off-policy agents (DQN family, DDPG, TD3, SAC) on Gymnasium environments: not built yet."""
