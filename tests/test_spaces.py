"""Observation spaces beyond Box vectors (issue 26, item 4): Discrete and MultiDiscrete
observations one-hot on the device (SB3's preprocessing), MultiBinary as 0/1 floats; on
FrozenLake, Taxi and small environments of each space."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlkit.core as rc
from rlkit.agents import DQN, SAC, RecurrentDQN
from rlkit.agents.evaluation import evaluate
from rlkit.agents.observations import ObservationLayout, OneHot
from rlkit.envs import BitFlippingEnv


def test_one_hot_layouts_match_numpy():
    space = gym.spaces.MultiDiscrete([3, 5], start=[1, -2])
    layout = ObservationLayout.of(space)
    assert layout.extractor == "onehot" and layout.nvec == (3, 5) and layout.buffer_shape == 2
    obs = np.array([[1, -2], [3, 2], [2, 0]])  # three observations of the space
    batch = layout.batch(obs, 3)  # indices from 0, as floats
    np.testing.assert_array_equal(batch, [[0, 0], [2, 4], [1, 2]])
    encoder, width = layout.features_extractor()
    assert isinstance(encoder, OneHot) and width == 8
    with rc.no_grad():
        hot = encoder(rc.tensor(batch.T)).numpy()  # [8, 3]
    expected = np.concatenate([np.eye(3)[batch[:, 0].astype(int)], np.eye(5)[batch[:, 1].astype(int)]], axis=1).T
    np.testing.assert_array_equal(hot, expected)
    assert ObservationLayout.of(gym.spaces.Discrete(4, start=2)).batch(np.array([5]), 1).tolist() == [[3.0]]
    binary = ObservationLayout.of(gym.spaces.MultiBinary((2, 3)))
    assert binary.extractor == "flatten" and binary.buffer_shape == 6


def test_spaces_that_are_not_read_are_refused_clearly():
    with pytest.raises(ValueError, match="needs an image observation space"):
        ObservationLayout.of(gym.spaces.Discrete(4), "nature")
    with pytest.raises(ValueError, match="observation spaces the agents read"):
        ObservationLayout.of(gym.spaces.Tuple((gym.spaces.Discrete(2),)))
    nested = gym.spaces.Dict({"a": gym.spaces.Dict({"b": gym.spaces.Discrete(2)})})
    with pytest.raises(ValueError, match="key 'a'"):  # Dict spaces: tests/test_dict_spaces.py
        ObservationLayout.of(nested)


def test_dqn_solves_deterministic_frozen_lake(device):
    env_kwargs = dict(is_slippery=False)
    agent = DQN(gym.make("FrozenLake-v1", **env_kwargs), seed=0, device=device, net_arch=(32,), learning_starts=200,
                train_freq=4, gradient_steps=4, target_update_interval=100, exploration_fraction=0.5,
                learning_rate=3e-3, gamma=0.9)
    agent.learn(4000)
    mean, _ = evaluate(agent, gym.make("FrozenLake-v1", **env_kwargs), n_eval_episodes=3)
    assert mean == 1.0  # reaches the goal from the start every time: the path is 6 steps


def test_dqn_on_taxi_acts_on_indices(tmp_path):
    agent = DQN("Taxi-v4", seed=1, net_arch=(32,), learning_starts=100, buffer_size=1000)
    assert agent.obs_layout.nvec == (500,)
    agent.learn(400)
    actions, _ = agent.predict(np.array([0, 17, 499]), deterministic=True)
    assert actions.shape == (3,)
    path = str(tmp_path / "taxi.safetensors")
    agent.save(path)
    np.testing.assert_array_equal(DQN.load(path).predict(np.array([0, 17, 499]), deterministic=True)[0], actions)


class Switches(gym.Env):
    """A MultiBinary (or MultiDiscrete) observation of 4 switches and a Box action whose sign
    flips the first switch; reward is the number of switches on."""

    def __init__(self, multi_discrete: bool = False):
        self.observation_space = gym.spaces.MultiDiscrete([2, 2, 2, 2]) if multi_discrete else gym.spaces.MultiBinary(4)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.state, self.t = np.zeros(4, np.int8), 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.state, self.t = self.np_random.integers(0, 2, 4).astype(np.int8), 0
        return self.state.copy(), {}

    def step(self, action):
        self.state[0] = int(float(action[0]) > 0)
        self.t += 1
        return self.state.copy(), float(self.state.sum()), False, self.t >= 10, {}


@pytest.mark.parametrize("multi_discrete", [False, True], ids=["multibinary", "multidiscrete"])
def test_sac_reads_multibinary_and_multidiscrete(multi_discrete):
    agent = SAC(Switches(multi_discrete), seed=2, net_arch=(16,), learning_starts=50, batch_size=16, buffer_size=500)
    assert agent.obs_layout.extractor == ("onehot" if multi_discrete else "flatten")
    agent.learn(200)
    actions, _ = agent.predict(np.array([[1, 0, 1, 1], [0, 0, 0, 0]]), deterministic=True)
    assert actions.shape == (2, 1) and np.all(np.abs(actions) <= 1)


class DiscreteDict(gym.Env):
    """Dict observations {"cell": Discrete(5), "flags": MultiBinary(3), "level": Box(2)}: a
    random cell, flags and level each step, 6 steps an episode."""

    observation_space = gym.spaces.Dict({"cell": gym.spaces.Discrete(5), "flags": gym.spaces.MultiBinary(3),
                                         "level": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), float(action), False, self.t >= 6, {}


def test_recurrent_agents_read_discrete_and_dict_observations_flattened_as_gymnasium_flattens():
    from rlkit.agents.flat_observations import FlatObservationLayout

    env = DiscreteDict()
    env.observation_space.seed(0)
    agent = RecurrentDQN(env, learning_starts=40, buffer_size=300, batch_size=4)
    assert isinstance(agent.obs_layout, FlatObservationLayout) and agent.n_obs == 5 + 3 + 2
    samples = [env.observation_space.sample() for _ in range(6)]
    batch = {key: np.stack([s[key] for s in samples]) for key in samples[0]}
    expected = np.stack([gym.spaces.flatten(env.observation_space, s) for s in samples]).astype(np.float32)
    np.testing.assert_array_equal(agent.obs_layout.batch(batch, 6), expected)  # Gymnasium's flattening
    one, vectorized = agent.obs_layout.batch_of(samples[0], None)
    assert not vectorized
    np.testing.assert_array_equal(one, expected[:1])
    agent.learn(80)
    action, state = agent.predict(samples[0], deterministic=True)
    assert action.shape == () and state is not None
    taxi = RecurrentDQN("Taxi-v4", learning_starts=40, buffer_size=300, batch_size=4)
    assert taxi.n_obs == 500
    taxi.learn(60)
    assert taxi.predict(np.int64(3))[0].shape == ()


def test_recurrent_agents_refuse_images_and_say_what_would_read_them():
    image_key = gym.spaces.Dict({"pixels": gym.spaces.Box(0, 255, (3, 8, 8), np.uint8),
                                 "v": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})

    class ImageDict(DiscreteDict):
        observation_space = image_key

    with pytest.raises(ValueError, match=r"image observations \(key 'pixels'\): images need a CNN agent"):
        RecurrentDQN(ImageDict())
