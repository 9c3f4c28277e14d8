"""Hindsight Experience Replay (issue 26, item 6): HerReplayBuffer's relabelling against a numpy
reference over the stored episodes (same lane and episode, the strategy's steps, running
episodes and ring wraps), its rewards against the environment's compute_reward, the agents on
goal environments, and the HER paper's bit-flipping result."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlkit.agents import DDPG, DQN, SAC, TD3
from rlkit.buffers import HerReplayBuffer
from rlkit.envs import BitFlippingEnv


class PointGoalEnv(gym.Env):
    """A point in the plane moved by its action (a step of at most 0.1 per axis) toward a goal;
    reward -1 until it is within 0.1 of the goal (SB3's sparse distance reward), 20 steps."""

    def __init__(self):
        box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Dict({"observation": box, "achieved_goal": box, "desired_goal": box})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def _obs(self):
        return {"observation": self.point.copy(), "achieved_goal": self.point.copy(), "desired_goal": self.goal.copy()}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.point, self.goal = (self.np_random.uniform(-1, 1, 2).astype(np.float32) for _ in range(2))
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.point = np.clip(self.point + 0.1 * np.asarray(action, np.float32), -1, 1).astype(np.float32)
        self.t += 1
        reward = float(self.compute_reward(self.point, self.goal, None))
        return self._obs(), reward, reward == 0.0, self.t >= 20, {}

    def compute_reward(self, achieved_goal, desired_goal, info):
        distance = np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1)
        return -(distance > 0.1).astype(np.float32)


def _filled_buffer(strategy: str, reward_function, n_envs: int = 2, lane_length: int = 12, seed: int = 0):
    """A HerReplayBuffer whose ring has wrapped, after episodes of random lengths per lane (the
    last ones still running). Every goal names its step: achieved_goal [lane, episode, k] at the
    k-th step of the lane's episode (its next achieved goal), desired_goal [-1, -1, -1]. Returns
    the buffer and each lane's steps as added: (episode, k, ended) in order."""
    shape = {"observation": 3, "achieved_goal": 3, "desired_goal": 3}
    buffer = HerReplayBuffer(lane_length * n_envs, shape, 1, n_envs=n_envs, seed=seed, goal_selection_strategy=strategy,
                             reward_function=reward_function, distance_threshold=0.5, batch_size=64,
                             compute_reward=lambda achieved, desired, infos: -np.abs(achieved - desired).sum(axis=-1))
    rng = np.random.default_rng(seed)
    added = [[] for _ in range(n_envs)]
    episode, k = np.zeros(n_envs, int), np.zeros(n_envs, int)
    length = rng.integers(1, 7, n_envs)
    for _ in range(3 * lane_length + 5):
        ended = k + 1 >= length
        goal = np.stack([np.arange(n_envs), episode, k], axis=1).astype(np.float32)  # the step's next achieved goal
        previous = np.stack([np.arange(n_envs), episode, k - 1], axis=1).astype(np.float32)
        desired = np.full((n_envs, 3), -1.0, np.float32)
        buffer.add({"observation": goal, "achieved_goal": previous, "desired_goal": desired}, np.zeros((n_envs, 1)),
                   -np.ones(n_envs), {"observation": goal, "achieved_goal": goal, "desired_goal": desired},
                   ended & (k % 2 == 0), ended & (k % 2 == 1))
        for lane in range(n_envs):
            added[lane].append((int(episode[lane]), int(k[lane]), bool(ended[lane])))
        episode, k = np.where(ended, episode + 1, episode), np.where(ended, 0, k + 1)
        length = np.where(ended, rng.integers(1, 7, n_envs), length)
    return buffer, added


def _allowed_steps(added: list[tuple], lane_length: int, strategy: str) -> dict[tuple, set[int]]:
    """The reference: for each stored step (episode, k) of a lane, the k of the steps whose next
    achieved goal the strategy may choose: of the same episode, among the steps still stored
    (the lane's newest lane_length), at or after k (future), the episode's last stored step
    (final: its end, or the newest step while it runs), or any of them (episode)."""
    stored = added[-lane_length:]
    allowed = {}
    for episode, k, _ in stored:
        steps = [j for e, j, _ in stored if e == episode]
        last = max(steps)  # the end, or where a running episode has got to
        choice = {"future": set(range(k, last + 1)), "final": {last}, "episode": set(steps)}[strategy]
        allowed[(episode, k)] = choice
    return allowed


@pytest.mark.parametrize("reward_function", ["sparse_distance", None])
@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_relabelled_goals_are_of_the_same_episode_and_the_strategys_steps(strategy, reward_function):
    buffer, added = _filled_buffer(strategy, reward_function)
    allowed = [_allowed_steps(lane_steps, buffer.lane_length, strategy) for lane_steps in added]
    n_virtual = buffer.n_virtual(64)
    assert n_virtual == int((1 - 1 / 5) * 64)  # SB3's her_ratio for n_sampled_goal=4
    chosen = [set() for _ in added]
    for _ in range(20):
        s = buffer.sample_on_device(64)
        own = s.obs["observation"].numpy().T  # [64, 3]: lane, episode, k of each transition
        desired = s.obs["desired_goal"].numpy().T
        np.testing.assert_array_equal(desired, s.next_obs["desired_goal"].numpy().T)
        np.testing.assert_array_equal(desired[n_virtual:], -1.0)  # the rest as stored
        for (lane, episode, k), goal in zip(own[:n_virtual].astype(int), desired[:n_virtual].astype(int)):
            assert goal[0] == lane and goal[1] == episode  # the same lane's same episode
            assert goal[2] in allowed[lane][(episode, k)], (strategy, lane, episode, k, goal)
            chosen[lane].add((episode, k, goal[2]))
    possible = sum(len(choices) for lane in allowed for choices in lane.values())
    assert sum(map(len, chosen)) > 0.5 * possible  # the draws spread over the strategy's choices


@pytest.mark.parametrize("strategy", ["future", "final"])
def test_episodes_cut_by_truncate_episodes_end_where_they_stood(strategy):
    """Lanes reset mid-episode (a resumed run): the cut episodes' goals come from their own
    steps, never from the episodes the lanes begin next."""
    buffer, added = _filled_buffer(strategy, "sparse_distance")
    n_envs = len(added)
    assert not all(steps[-1][2] for steps in added)  # some lanes are mid-episode
    buffer.truncate_episodes()
    episode = np.array([steps[-1][0] + 1 for steps in added])
    for k in range(3):  # the next episodes' first steps
        goal = np.stack([np.arange(n_envs), episode, np.full(n_envs, k)], axis=1).astype(np.float32)
        previous = goal - np.array([0, 0, 1], np.float32)
        desired = np.full((n_envs, 3), -1.0, np.float32)
        buffer.add({"observation": goal, "achieved_goal": previous, "desired_goal": desired}, np.zeros((n_envs, 1)),
                   -np.ones(n_envs), {"observation": goal, "achieved_goal": goal, "desired_goal": desired},
                   np.zeros(n_envs, bool), np.zeros(n_envs, bool))
        for lane in range(n_envs):
            added[lane].append((int(episode[lane]), k, False))
    allowed = [_allowed_steps(lane_steps, buffer.lane_length, strategy) for lane_steps in added]
    n_virtual = buffer.n_virtual(64)
    for _ in range(20):
        s = buffer.sample_on_device(64)
        own = s.obs["observation"].numpy().T.astype(int)
        goals = s.obs["desired_goal"].numpy().T.astype(int)
        for (lane, ep, k), goal in zip(own[:n_virtual], goals[:n_virtual]):
            assert goal[0] == lane and goal[1] == ep and goal[2] in allowed[lane][(ep, k)], (lane, ep, k, goal)


def test_relabelled_rewards_are_compute_rewards(device):
    env = BitFlippingEnv(6)
    agent = DQN(env, seed=0, learning_starts=10_000, batch_size=64, replay_buffer_class=HerReplayBuffer,
                replay_buffer_kwargs=dict(reward_function="bit_equal", goal_selection_strategy="future"))
    agent.learn(300)  # random actions: episodes of every length, a few reaching their goal
    s = agent.buffer.sample_on_device(64)
    achieved, desired = s.next_obs["achieved_goal"].numpy().T, s.obs["desired_goal"].numpy().T
    # every transition's reward is compute_reward's for its (relabelled or stored) desired goal
    np.testing.assert_array_equal(s.reward.numpy().reshape(-1), env.compute_reward(achieved, desired, None))
    assert (s.reward.numpy()[0, :agent.buffer.n_virtual(64)] == 0).any()  # hindsight: goals reached

    points = PointGoalEnv()
    agent = SAC(points, seed=0, learning_starts=10_000, batch_size=64, replay_buffer_class="HerReplayBuffer",
                replay_buffer_kwargs=dict(reward_function="sparse_distance", distance_threshold=0.1))
    agent.learn(200)
    s = agent.buffer.sample_on_device(64)
    achieved, desired = s.next_obs["achieved_goal"].numpy().T, s.obs["desired_goal"].numpy().T
    np.testing.assert_array_equal(s.reward.numpy().reshape(-1), points.compute_reward(achieved, desired, None))


@pytest.mark.parametrize("agent_class", [SAC, TD3, DDPG])
def test_actor_critics_learn_with_her_on_a_point_goal_env(agent_class, tmp_path):
    """SB3's keywords: the environment's compute_reward (the host path) gives the rewards."""
    agent = agent_class("MultiInputPolicy", PointGoalEnv(), seed=0, learning_starts=100, batch_size=32,
                        net_arch=(32, 32), replay_buffer_class=HerReplayBuffer,
                        replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future"))
    agent.learn(300)
    obs, _ = PointGoalEnv().reset(seed=1)
    action, _ = agent.predict(obs, deterministic=True)
    assert action.shape == (2,) and np.all(np.abs(action) <= 1)
    path = str(tmp_path / "agent.safetensors")
    agent.save(path)
    loaded = agent_class.load(path, env=PointGoalEnv())
    assert loaded.config.replay_buffer_class == "HerReplayBuffer"
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], action)
    agent.save_replay_buffer(str(tmp_path / "buffer"))
    agent.load_replay_buffer(str(tmp_path / "buffer"))  # compute_reward carried over: learning goes on
    agent.learn(50, reset_num_timesteps=False)


def test_her_buffer_keeps_its_episodes_through_save_and_load(tmp_path):
    buffer, _ = _filled_buffer("episode", "sparse_distance")
    buffer.save(str(tmp_path / "her"))
    loaded = HerReplayBuffer.load(str(tmp_path / "her"))
    assert (loaded.goal_selection_strategy, loaded.n_sampled_goal) == ("episode", 4)
    for name in ("_from_start", "_to_end", "_next_achieved", "_episode_first"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(buffer, name))
    s = loaded.sample_on_device(64)
    own, goal = s.obs["observation"].numpy(), s.obs["desired_goal"].numpy()
    np.testing.assert_array_equal(own[:2, :51], goal[:2, :51])  # relabelled within each lane's episode


@pytest.mark.parametrize("n_bits", [0, -3, True, 2.0])
def test_bit_flipping_refuses_a_bit_count_that_is_not_a_positive_int(n_bits):
    with pytest.raises(ValueError, match=f"BitFlippingEnv: n_bits must be a positive int, got {n_bits!r}"):
        BitFlippingEnv(n_bits)


def test_her_settings_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="achieved_goal"):
        DQN("CartPole-v1", replay_buffer_class=HerReplayBuffer)
    with pytest.raises(ValueError, match="prioritized"):
        DQN(BitFlippingEnv(4), replay_buffer_class=HerReplayBuffer, prioritized=True)
    with pytest.raises(ValueError, match="n-step"):
        DQN(BitFlippingEnv(4), replay_buffer_class=HerReplayBuffer, n_steps=3)
    with pytest.raises(ValueError, match="goal_selection_strategy"):
        DQN(BitFlippingEnv(4), replay_buffer_class=HerReplayBuffer, replay_buffer_kwargs=dict(goal_selection_strategy="x"))
    with pytest.raises(ValueError, match="replay_buffer_class"):
        DQN(BitFlippingEnv(4), replay_buffer_class="DictReplayBuffer")
    with pytest.raises(ValueError, match="replay_buffer_kwargs are HerReplayBuffer's"):
        DQN(BitFlippingEnv(4), replay_buffer_kwargs=dict(n_sampled_goal=2))


def _success_rate(agent, n_bits: int, episodes: int = 100) -> float:
    """The fraction of ``episodes`` (reset with seeds 1000, 1001, ...) the greedy policy solves."""
    env, solved = BitFlippingEnv(n_bits), 0
    for i in range(episodes):
        obs, _ = env.reset(seed=1000 + i)
        done = False
        while not done:
            action, _ = agent.predict(obs, deterministic=True)
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        solved += info["is_success"]
    return solved / episodes


@pytest.mark.slow
def test_dqn_with_her_solves_15_bits_where_dqn_alone_does_not():
    """The HER paper's figure 1 on the CPU: 15 bits, random start and goal, seed 0, 15k steps
    each (about 30 s each on 2 cores). Final greedy success over 100 episodes: with HER (future,
    4 goals, rewards on the device) >= 0.9 (seed 0 gave 0.99 at 12k steps), without HER < 0.2
    (gave 0.0: no reward but -1 is ever seen)."""
    settings = dict(seed=0, net_arch=(256, 256), learning_starts=1000, train_freq=1, gradient_steps=1,
                    batch_size=128, learning_rate=1e-3, gamma=0.95, exploration_fraction=0.2,
                    exploration_final_eps=0.05, target_update_interval=500, buffer_size=100_000)
    her = DQN("MultiInputPolicy", BitFlippingEnv(15), replay_buffer_class=HerReplayBuffer,
              replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future", reward_function="bit_equal"),
              **settings)
    her.learn(15_000)
    assert _success_rate(her, 15) >= 0.9
    alone = DQN("MultiInputPolicy", BitFlippingEnv(15), **settings)
    alone.learn(15_000)
    assert _success_rate(alone, 15) < 0.2
