"""Dict observation spaces (issue 26, item 4), as SB3's MultiInputPolicy reads them: each key
through its own path (a CNN for image keys, one-hot for Discrete and MultiDiscrete, flattened
otherwise), the features concatenated in the Dict's key order; each key in its own replay
tables. FrozenLake and Taxi are tests/test_spaces.py's."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlkit.core as rc
from rlkit.agents import DDPG, DQN, SAC, TD3
from rlkit.agents.dict_observations import DictEncoder, DictObservationLayout
from rlkit.agents.discrete_sac import DiscreteSAC
from rlkit.agents.evaluation import evaluate
from rlkit.agents.observations import ObservationLayout
from rlkit.buffers import ReplayBuffer

TINY_CNN = dict(conv_layers=((4, 3, 2),), cnn_output_dim=8)
"""Each image key's CNN kept small: one convolution, 8 features."""


def _mixed_space() -> gym.spaces.Dict:
    return gym.spaces.Dict({
        "image": gym.spaces.Box(0, 255, (3, 16, 16), np.uint8),
        "index": gym.spaces.Discrete(3, start=1),
        "flags": gym.spaces.MultiBinary(3),
        "counts": gym.spaces.MultiDiscrete([2, 4]),
        "position": gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32),
    })


class CountingDictEnv(gym.Env):
    """Observations that name their lane, step and episode (every key a function of them), so a
    stored transition can be traced to the step that gave it; episodes of 4 steps, truncated.
    ``returned`` lists every observation reset and step gave, in order."""

    def __init__(self, lane: int = 0, action_space=None):
        self.lane = lane
        self.observation_space = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, (3, 8, 8), np.uint8),
            "index": gym.spaces.Discrete(5),
            "position": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
        })
        self.action_space = action_space or gym.spaces.Discrete(2)
        self.returned: list[tuple[str, dict]] = []
        self.episode = -1

    def _obs(self) -> dict:
        return {"image": np.full((3, 8, 8), 10 * self.lane + self.t, np.uint8),
                "index": np.int64((self.t + self.episode) % 5),
                "position": np.array([self.lane, 100 * self.episode + self.t], np.float32)}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.episode = 0, self.episode + 1
        obs = self._obs()
        self.returned.append(("reset", obs))
        return obs, {}

    def step(self, action):
        self.t += 1
        obs = self._obs()
        self.returned.append(("step", obs))
        return obs, float(self.t), False, self.t >= 4, {}


class PositionAndTargetEnv(gym.Env):
    """A Dict task whose best action depends on both keys: ``position`` x in +-[0.1, 1] and
    ``target`` k in {0, 1}; action 1 earns 1 where (x > 0) xor k, action 0 where not. A new
    observation every step, 10 steps an episode: a random policy earns 5, the best 10."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"position": gym.spaces.Box(-1.0, 1.0, (1,), np.float32),
                                                  "target": gym.spaces.Discrete(2)})
        self.action_space = gym.spaces.Discrete(2)

    def _draw(self) -> dict:
        x = self.np_random.uniform(0.1, 1.0) * self.np_random.choice([-1.0, 1.0])
        self.obs = {"position": np.array([x], np.float32), "target": np.int64(self.np_random.integers(2))}
        return self.obs

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action):
        best = int((self.obs["position"][0] > 0) != bool(self.obs["target"]))
        self.t += 1
        return self._draw(), float(int(action) == best), False, self.t >= 10, {}


class PixelsAndPositionEnv(gym.Env):
    """A Box key and a 3x16x16 image key, continuous actions; reward -|a - position|."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"pixels": gym.spaces.Box(0, 255, (3, 16, 16), np.uint8),
                                                  "position": gym.spaces.Box(-1.0, 1.0, (1,), np.float32)})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.obs = self.observation_space.sample()
        return self.obs, {}

    def step(self, action):
        reward = -float(abs(action[0] - self.obs["position"][0]))
        self.t += 1
        self.obs = self.observation_space.sample()
        return self.obs, reward, False, self.t >= 20, {}


def test_features_are_each_keys_encoding_concatenated(device):
    space = _mixed_space()
    layout = ObservationLayout.of(space)
    assert isinstance(layout, DictObservationLayout)
    assert list(layout.keys) == list(space.spaces)  # Gymnasium's (sorted) key order, as SB3 concatenates
    extractors = {key: sub.extractor for key, sub in layout.layouts.items()}
    assert extractors == {"counts": "onehot", "flags": "flatten", "image": "nature", "index": "onehot",
                          "position": "flatten"}
    encoder, width = layout.features_extractor({"conv_layers": ((4, 3, 2),)})
    assert isinstance(encoder, DictEncoder) and width == 6 + 3 + 256 + 3 + 4  # SB3's cnn_output_dim: 256
    space.seed(0)
    samples = [space.sample() for _ in range(5)]
    obs = {key: np.stack([s[key] for s in samples]) for key in space.spaces}
    batch = layout.batch(obs, 5)
    inputs = {key: rc.tensor(values.T) for key, values in batch.items()}  # [*shape reversed, 5] each
    with rc.no_grad():
        features = encoder(inputs).numpy()  # [width, 5]
        image = getattr(encoder, str(layout.keys.index("image")))(inputs["image"]).numpy()  # [256, 5]
    reference = {
        "counts": np.concatenate([np.eye(2)[obs["counts"][:, 0]], np.eye(4)[obs["counts"][:, 1]]], axis=1).T,
        "flags": obs["flags"].T.astype(np.float32),
        "image": image,
        "index": np.eye(3)[obs["index"] - 1].T,  # from the space's start
        "position": obs["position"].reshape(5, 4).T,
    }
    np.testing.assert_allclose(features, np.concatenate([reference[key] for key in layout.keys]), rtol=1e-6)


def test_bad_dict_spaces_are_refused_naming_the_key():
    nested = gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": gym.spaces.Dict({"c": gym.spaces.Discrete(2)})})
    with pytest.raises(ValueError, match="key 'b'.*Box, Discrete, MultiDiscrete or MultiBinary"):
        ObservationLayout.of(nested)
    with pytest.raises(ValueError, match="key 'b'"):
        ObservationLayout.of(gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": gym.spaces.Tuple((gym.spaces.Discrete(2),))}))
    with pytest.raises(ValueError, match="empty Dict"):
        ObservationLayout.of(gym.spaces.Dict({}))
    env = CountingDictEnv()
    env.observation_space = nested
    with pytest.raises(ValueError, match="DQN: Dict observation key 'b'"):
        DQN(env)


@pytest.mark.parametrize("kwargs, message", [
    (dict(obs_shape={}), "obs_shape is an empty dict"),
    (dict(obs_shape={"": 2}), "keys of a dict obs_shape must be non-empty strings, got ''"),
    (dict(obs_shape={"a": 2, "b": 3}, obs_dtype={"b": "f32", "a": "f32"}), r"obs_dtype's keys \['b', 'a'\] are not"),
    (dict(obs_shape={"a": 2}, frame_stack=4), "stored key by key; not with frame_stack or optimize_memory"),
    (dict(obs_shape={"a": 2}, optimize_memory=True), "not with frame_stack or optimize_memory"),
    (dict(obs_shape={"a": 0}), r"obs_shape\['a'\]"),
])
def test_dict_replay_settings_that_do_not_fit_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReplayBuffer(20, action_shape=1, n_envs=2, **kwargs)


def test_dict_replay_adds_that_do_not_fit_are_refused_and_nothing_is_stored():
    buf = ReplayBuffer(20, {"pos": 2, "cell": 1}, 1, n_envs=2, obs_dtype={"pos": "f32", "cell": "i32"})
    good = {"pos": np.zeros((2, 2), np.float32), "cell": np.zeros((2, 1), np.int32)}
    step = dict(action=np.zeros((2, 1)), reward=np.zeros(2), terminated=np.zeros(2, bool), truncated=np.zeros(2, bool))
    bad = [
        ({"pos": good["pos"]}, r"obs must be a dict with the keys \['pos', 'cell'\], got \['pos'\]"),
        (good["pos"], "obs must be a dict with the keys .*got ndarray"),
        ({**good, "pos": np.zeros((3, 2))}, r"obs\['pos'\] has shape \(3, 2\), expected \(2, 2\)"),
        ({**good, "cell": np.full((2, 1), 0.5)}, r"obs\['cell'\]"),  # not a whole number for the i32 table
    ]
    for obs, message in bad:
        with pytest.raises(ValueError, match=message):
            buf.add(obs, next_obs=good, **step)
    assert len(buf) == 0
    buf.add(good, next_obs=good, **step)
    assert len(buf) == 2


def test_predict_takes_one_dict_observation_or_a_batch():
    agent = DQN(CountingDictEnv(), seed=0, net_arch=(8,), features_extractor_kwargs=TINY_CNN)
    env = CountingDictEnv()
    obs, _ = env.reset()
    action, _ = agent.predict(obs, deterministic=True)
    assert action.shape == ()
    batch = {key: np.stack([value, value, value]) for key, value in obs.items()}
    actions, _ = agent.predict(batch, deterministic=True)
    assert actions.shape == (3,) and (actions == action).all()
    with pytest.raises(ValueError, match="keys"):
        agent.predict({"image": obs["image"]})
    with pytest.raises(ValueError, match="observation\\['position'\\]"):
        agent.predict({**obs, "position": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="different numbers"):
        agent.predict({**batch, "index": obs["index"]})
    with pytest.raises(ValueError, match="NaN"):
        agent.predict({**obs, "position": np.array([np.nan, 0.0], np.float32)})
    with pytest.raises(ValueError, match="Dict observations are not exported yet"):
        agent.export_onnx("unused.onnx")


@pytest.mark.parametrize("autoreset", ["next_step", "same_step"])
def test_stored_transitions_of_each_key_are_the_environments(device, autoreset):
    mode = gym.vector.AutoresetMode.NEXT_STEP if autoreset == "next_step" else gym.vector.AutoresetMode.SAME_STEP
    envs = gym.vector.SyncVectorEnv([lambda lane=lane: CountingDictEnv(lane) for lane in range(3)], autoreset_mode=mode)
    agent = DQN(envs, seed=0, net_arch=(8,), features_extractor_kwargs=TINY_CNN, learning_starts=10_000,
                buffer_size=60)
    agent.learn(30)  # 10 steps of 3 lanes: the buffer holds them all
    for lane, env in enumerate(envs.envs):
        steps = [i for i, (kind, _) in enumerate(env.returned) if kind == "step"]
        expected = [(env.returned[i - 1][1], env.returned[i][1]) for i in steps]  # (obs, next obs) of each step
        assert len(expected) == 10
        columns = np.arange(10) * 3 + lane  # step t of the lane: column t * n_envs + lane
        for key, layout in agent.obs_layout.layouts.items():
            stored = agent.buffer._keyed.obs[key].read()[:, columns]  # [rows, 10]
            stored_next = agent.buffer._keyed.next_obs[key].read()[:, columns]
            for t, (obs, next_obs) in enumerate(expected):
                np.testing.assert_array_equal(stored[:, t], layout.batch(np.asarray(obs[key])[None], 1)[0].reshape(-1))
                np.testing.assert_array_equal(stored_next[:, t],
                                              layout.batch(np.asarray(next_obs[key])[None], 1)[0].reshape(-1))
    assert agent.buffer._keyed.obs["image"].dtype == "u8" and agent.buffer._keyed.obs["position"].dtype == "f32"
    sample = agent.buffer.sample_on_device(16)
    # the keys of a sampled observation come from one step: the image's value is 10 lane + t, position's lane, t
    image, position = sample.obs["image"].numpy(), sample.obs["position"].numpy()  # [8, 8, 3, 16], [2, 16]
    np.testing.assert_array_equal(image[0, 0, 0], 10 * position[0] + position[1] % 100)


def test_replay_buffer_keeps_dict_observations_through_save_and_load(tmp_path):
    shapes, dtypes = {"image": (3, 4, 4), "position": 2}, {"image": "u8", "position": "f32"}
    buffer = ReplayBuffer(20, shapes, 1, n_envs=2, obs_dtype=dtypes, seed=0, n_step=2)
    for t in range(7):
        obs = {"image": np.full((2, 3, 4, 4), t, np.uint8), "position": np.full((2, 2), t, np.float32)}
        buffer.add(obs, np.zeros((2, 1)), np.ones(2), {key: value + 1 for key, value in obs.items()},
                   np.zeros(2, bool), np.zeros(2, bool))
    assert buffer.nbytes == ReplayBuffer.estimate_nbytes(20, shapes, 1, n_envs=2, obs_dtype=dtypes, n_step=2)
    buffer.save(str(tmp_path / "buffer"))
    loaded = ReplayBuffer.load(str(tmp_path / "buffer"))
    assert loaded.obs_shape == {"image": (3, 4, 4), "position": (2,)} and len(loaded) == 14
    a, b = buffer.sample(8), loaded.sample(8)  # the same generator state: the same draws
    for key in shapes:
        np.testing.assert_array_equal(a.obs[key].numpy(), b.obs[key].numpy())
        np.testing.assert_array_equal(a.next_obs[key].numpy(), b.next_obs[key].numpy())
    with pytest.raises(ValueError, match="keys"):
        buffer.add({"image": obs["image"]}, np.zeros((2, 1)), np.ones(2), obs, np.zeros(2, bool), np.zeros(2, bool))
    with pytest.raises(ValueError, match="not with frame_stack or optimize_memory"):
        ReplayBuffer(20, shapes, 1, obs_dtype=dtypes, optimize_memory=True)
    with pytest.raises(ValueError, match="not with dict observations"):
        buffer.sample_sequences(2, 2)


def test_dqn_learns_a_task_of_both_keys():
    """Seed 0: DQN (double, dueling) must act on the position and the target together; a final
    greedy evaluation over 20 episodes earns at least 9.5 of 10 (random: 5; a policy reading
    one key alone: 5)."""
    agent = DQN(PositionAndTargetEnv(), seed=0, net_arch=(64, 64), learning_starts=500, train_freq=4,
                gradient_steps=4, target_update_interval=200, exploration_fraction=0.3, learning_rate=2e-3,
                gamma=0.5, batch_size=64, double=True, dueling=True)
    agent.learn(6000)
    mean, _ = evaluate(agent, PositionAndTargetEnv(), n_eval_episodes=20, seed=100)
    assert mean >= 9.5


@pytest.mark.parametrize("agent_class", [DQN, DiscreteSAC])
def test_discrete_agents_learn_on_dict_observations_with_every_buffer(agent_class, tmp_path):
    options = dict(n_steps=3, prioritized=True, double=True, dueling=True) if agent_class is DQN else {}
    agent = agent_class(CountingDictEnv(), seed=0, net_arch=(8,), features_extractor_kwargs=TINY_CNN,
                        learning_starts=20, train_freq=4, gradient_steps=2, batch_size=8, **options)
    agent.learn(60)
    obs, _ = CountingDictEnv().reset()
    path = str(tmp_path / "agent.safetensors")
    agent.save(path)
    loaded = agent_class.load(path, env=CountingDictEnv())
    assert agent.predict(obs, deterministic=True)[0] == loaded.predict(obs, deterministic=True)[0]
    agent.save_replay_buffer(str(tmp_path / "buffer"))
    agent.load_replay_buffer(str(tmp_path / "buffer"))
    agent.learn(20, reset_num_timesteps=False)  # the captured update reads the loaded buffer


@pytest.mark.parametrize("agent_class", [SAC, TD3, DDPG])
def test_actor_critics_learn_and_act_on_a_box_and_an_image_key(agent_class, tmp_path):
    agent = agent_class(PixelsAndPositionEnv(), seed=0, net_arch=(16,), features_extractor_kwargs=TINY_CNN,
                        learning_starts=40, batch_size=16, train_freq=1, gradient_steps=1)
    agent.learn(100)
    env = PixelsAndPositionEnv()
    env.observation_space.seed(1)
    obs, _ = env.reset(seed=1)
    action, _ = agent.predict(obs, deterministic=True)
    assert action.shape == (1,) and env.action_space.contains(action)
    batch = {key: np.stack([value] * 4) for key, value in obs.items()}
    assert agent.predict(batch, deterministic=True)[0].shape == (4, 1)
    path = str(tmp_path / "agent.safetensors")
    agent.save(path)
    loaded = agent_class.load(path, env=PixelsAndPositionEnv())
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], action)
    mean, _ = evaluate(loaded, gym.vector.SyncVectorEnv([PixelsAndPositionEnv] * 2), n_eval_episodes=2)
    assert np.isfinite(mean)


def test_sb3_vec_env_of_dict_observations():
    vec_env = pytest.importorskip("stable_baselines3.common.vec_env")
    envs = vec_env.DummyVecEnv([lambda lane=lane: CountingDictEnv(lane) for lane in range(2)])
    agent = DQN(envs, seed=0, net_arch=(8,), features_extractor_kwargs=TINY_CNN, learning_starts=10_000)
    agent.learn(10)  # 5 steps of 2 lanes: the truncation at step 4 stores the terminal observation
    final = envs.envs[1].returned[4][1]  # lane 1's step 4, the end of its first episode
    np.testing.assert_array_equal(agent.buffer._keyed.next_obs["position"].read()[:, 3 * 2 + 1], final["position"])
    mean, _ = evaluate(agent, envs, n_eval_episodes=2)
    assert mean == 10.0  # 1 + 2 + 3 + 4
