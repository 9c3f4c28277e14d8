"""agent.export_onnx (issue 26, item 7): onnxruntime, running the exported policy, gives the
actions predict(obs, deterministic=True) gives, on a batch of observations, for DQN (MLP,
dueling, one-hot, NatureCNN and ImpalaCNN on images), discrete SAC, SAC and TD3."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlkit.agents import DQN, SAC, TD3, DiscreteSAC, RecurrentDQN

onnxruntime = pytest.importorskip("onnxruntime", reason="the onnx extra is part of the test extra")
pytest.importorskip("onnx", reason="the onnx extra is part of the test extra")

from test_image_agents import QUICK, SMALL_CNN, Frames, _stacked  # noqa: E402  (tests/ is on sys.path)


def _observations(env: gym.Env, n: int = 12) -> np.ndarray:
    env.observation_space.seed(0)
    return np.stack([env.observation_space.sample() for _ in range(n)])


def _onnx_actions(agent, obs: np.ndarray, tmp_path) -> np.ndarray:
    path = str(tmp_path / "policy.onnx")
    agent.export_onnx(path)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(["actions"], {"obs": obs})[0]


CASES = {
    "dqn-mlp": lambda: DQN("CartPole-v1", seed=0, net_arch=(16, 8)),
    "dqn-dueling": lambda: DQN("CartPole-v1", seed=1, net_arch=(16,), dueling=True),
    "dqn-onehot": lambda: DQN("Taxi-v4", seed=2, net_arch=(16,)),
    "dqn-nature": lambda: DQN(_stacked(), seed=3, **SMALL_CNN),
    "dqn-impala-channel-last": lambda: DQN(Frames(channel_last=True), seed=4, features_extractor="impala",
                                           features_extractor_kwargs=dict(channels=(4, 8), features_dim=16)),
    "discrete-sac": lambda: DiscreteSAC("CartPole-v1", seed=5, net_arch=(16,)),
}


@pytest.mark.parametrize("case", CASES)
def test_discrete_policies_export_predicts_actions(case, tmp_path):
    agent = CASES[case]()
    agent.learn(300) if case == "dqn-mlp" else None  # trained weights too, not only initial ones
    obs = _observations(agent.env)
    expected, _ = agent.predict(obs, deterministic=True)
    dtype = np.uint8 if agent.obs_layout.image else np.int64 if agent.obs_layout.nvec else np.float32
    actions = _onnx_actions(agent, obs.astype(dtype), tmp_path)
    assert actions.dtype == np.int64 and actions.shape == (len(obs),)
    np.testing.assert_array_equal(actions, expected)


@pytest.mark.parametrize("cls", [SAC, TD3], ids=lambda c: c.__name__)
def test_continuous_policies_export_rescaled_actions(cls, tmp_path):
    agent = cls("Pendulum-v1", seed=6, net_arch=(16, 16), learning_starts=50, batch_size=16)
    agent.learn(120)
    obs = _observations(agent.env).astype(np.float32)
    expected, _ = agent.predict(obs, deterministic=True)
    actions = _onnx_actions(agent, obs, tmp_path)
    assert actions.shape == (len(obs), 1) and np.all(np.abs(actions) <= 2.0)  # Pendulum's torque bounds
    np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-5)


def test_image_actor_exports(tmp_path):
    agent = SAC(_stacked(continuous=True), seed=7, net_arch=(16,), **QUICK, **SMALL_CNN)
    obs = _observations(agent.env)
    expected, _ = agent.predict(obs, deterministic=True)
    np.testing.assert_allclose(_onnx_actions(agent, obs, tmp_path), expected, rtol=1e-5, atol=1e-5)


def test_recurrent_policies_refuse(tmp_path):
    agent = RecurrentDQN("rlkit/CartPoleNoVel-v1", seed=0)
    with pytest.raises(NotImplementedError, match="no ONNX form"):
        agent.export_onnx(str(tmp_path / "r.onnx"))
