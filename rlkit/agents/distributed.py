"""Ape-X style off-policy training over MPI: rank 0 learns, the other ranks act.

    # train.py, run with: rlkit launch -n 4 train.py
    from rlkit.agents import DQN, DQNConfig
    from rlkit.agents.distributed import learn_distributed

    agent = learn_distributed(lambda n_envs, seed: DQN("CartPole-v1", DQNConfig(n_envs=n_envs), seed=seed),
                              total_timesteps=50_000, seed=0)

Each actor rank steps its own environments (``lanes_per_actor`` of them) with its copy of the
policy for ``rollout_steps`` steps a round and sends the transitions to the learner, which
writes them into its device replay buffer (one lane per actor environment, so each lane's
episodes stay whole) and trains exactly as its own environment loop would with that many
lanes: every ``train_freq`` steps ``gradient_steps`` updates, target updates, exploration and
learning starts on the global step count. Every ``sync_every`` rounds the learner's policy
weights are broadcast to the actors. Only the learner logs. With one rank (no mpiexec) this is
``agent.learn``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from rlkit.agents.base import OffPolicyAgent
from rlkit.agents.episodes import EpisodeStats
from rlkit.core import parallel
from rlkit.logger import SummaryWriter, run_dir


def learn_distributed(make_agent: Callable[[int, int], OffPolicyAgent], total_timesteps: int, seed: int = 0,
                      lanes_per_actor: int = 1, rollout_steps: int = 32, sync_every: int = 1,
                      comm: parallel.Communicator | None = None) -> OffPolicyAgent:
    """Trains the agent ``make_agent(n_envs, seed)`` builds for ``total_timesteps`` environment
    steps over all actors; returns this rank's agent (the learner's on rank 0)."""
    comm = comm or parallel.world()
    for name, value in (("total_timesteps", total_timesteps), ("lanes_per_actor", lanes_per_actor),
                        ("rollout_steps", rollout_steps), ("sync_every", sync_every)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"learn_distributed: {name} must be a positive int, got {value!r}")
    if comm.size == 1:
        return make_agent(lanes_per_actor, seed).learn(total_timesteps)
    n_actors = comm.size - 1
    if comm.is_root:
        agent = make_agent(n_actors * lanes_per_actor, seed)  # one buffer lane per actor environment
    else:
        agent = make_agent(lanes_per_actor, seed + comm.rank)
    if agent.obs_layout.extractor == "dict":  # every rank's agent reads the same space: all refuse
        raise ValueError("learn_distributed: Dict observations are not sent between ranks yet; train with "
                         "agent.learn (a vector environment of several lanes) instead")
    agent._learn_start, agent._learn_total = agent.num_timesteps, total_timesteps
    parallel.broadcast_parameters(agent._policy_parameters(), comm)
    writer = SummaryWriter(run_dir(agent.logdir, agent.algo)) if comm.is_root and agent.logdir else None
    learner = _Learner(agent, writer) if comm.is_root else None
    obs = None if comm.is_root else agent.lanes.reset()
    rounds = 0
    try:
        with agent.on_device():
            while agent.num_timesteps - agent._learn_start < total_timesteps:
                rollout = None if comm.is_root else _act(agent, obs, rollout_steps)
                if rollout is not None:
                    obs = rollout.pop("last_obs")
                gathered = comm.gather(rollout)
                if learner is not None:
                    learner.consume(gathered[1:])
                agent.num_timesteps = comm.broadcast_object(agent.num_timesteps)  # the global step count
                rounds += 1
                if rounds % sync_every == 0:
                    parallel.broadcast_parameters(agent._policy_parameters(), comm)
            agent._apply_deferred()  # as learn does when it returns (DQN's pending target updates)
    finally:
        if writer is not None:
            writer.close()
    return agent


def _act(agent: OffPolicyAgent, obs: np.ndarray, steps: int) -> dict:
    """``steps`` vector steps of an actor's environments: the transitions, stacked along a step
    axis, and the observation to continue from."""
    lanes, cfg = agent.lanes, agent.config
    columns = {key: [] for key in ("obs", "actions", "reward", "next_obs", "terminated", "truncated")}
    for _ in range(steps):
        batch = obs.reshape(lanes.n, agent.n_obs).astype(np.float32, copy=False)
        actions = agent._random_actions(lanes.n) if agent.num_timesteps < cfg.learning_starts else agent._explore(batch)
        obs, reward, terminated, truncated, true_next = lanes.step(agent._to_env_action(actions))
        for key, value in zip(columns, (batch, actions, reward, true_next.reshape(lanes.n, agent.n_obs),
                                        terminated, truncated)):
            columns[key].append(np.asarray(value))
    return {**{key: np.stack(values) for key, values in columns.items()}, "last_obs": obs}


class _Learner:
    """The learner's side of each round: the actors' transitions into the buffer, and training
    as the agent's own loop would do it with one lane per actor environment."""

    def __init__(self, agent: OffPolicyAgent, writer: SummaryWriter | None):
        self.agent, self.writer = agent, writer
        self.stats = EpisodeStats(agent.lanes.n)
        self.start_time = time.perf_counter()

    def consume(self, rollouts: list[dict]) -> None:
        agent, cfg = self.agent, self.agent.config
        steps = rollouts[0]["obs"].shape[0]
        for t in range(steps):  # lanes of actor 1, then actor 2, ...
            obs, actions, reward, next_obs, terminated, truncated = (
                np.concatenate([r[key][t] for r in rollouts])
                for key in ("obs", "actions", "reward", "next_obs", "terminated", "truncated"))
            agent.buffer.add(obs, actions, reward, next_obs, terminated, truncated)
            self.stats.step(reward, terminated | truncated)
            before = agent.num_timesteps
            agent.num_timesteps += agent.lanes.n
            agent._n_calls += 1
            if agent.num_timesteps > cfg.learning_starts and agent._n_calls % cfg.train_freq == 0:
                agent._train_scalars.update(agent._train(cfg.gradient_steps))
            agent._after_env_step()
            if self.writer is not None and agent.num_timesteps // cfg.log_interval > before // cfg.log_interval:
                agent._log(self.writer, self.stats, self.start_time)
