"""Recurrent agents (rlkit.agents.RecurrentDQN, RecurrentSAC) and the partially observed tasks
(rlkit.envs): acting step by step gives what training computes over whole windows, lane states
reset where episodes end, the sequence loss against a numpy reference, save/load, smoke runs on
both backends and encoders, and the learning gate on velocity-hidden CartPole (slow)."""

import re

import gymnasium as gym
import numpy as np
import pytest

import rlkit.core as rc
from conftest import DEVICES
from rlkit.agents import (
    DQN, EvalCallback, RecurrentDQN, RecurrentDQNConfig, RecurrentSAC, RecurrentSACConfig, evaluate,
)
from rlkit.envs import HideVelocity

CARTPOLE, PENDULUM = "rlkit/CartPoleNoVel-v1", "rlkit/PendulumNoVel-v1"
SMALL_DQN = dict(learning_starts=100, train_freq=50, gradient_steps=2, batch_size=4, sequence_length=4, burn_in=2,
                 d_model=8, d_state=4, net_arch=(8,), buffer_size=2000)
SMALL_SAC = dict(learning_starts=100, train_freq=20, gradient_steps=2, batch_size=4, sequence_length=4, burn_in=2, d_model=8, d_state=4,
                 net_arch=(8,), buffer_size=2000)


# ---- the partially observed tasks ---------------------------------------------------------------

@pytest.mark.parametrize("hidden_id, base_id, kept", [(CARTPOLE, "CartPole-v1", [0, 2]),
                                                      (PENDULUM, "Pendulum-v1", [0, 1])])
def test_hidden_velocity_tasks_keep_the_positions_of_the_full_task(hidden_id, base_id, kept):
    hidden, full = gym.make(hidden_id), gym.make(base_id)
    assert hidden.spec.id == hidden_id and hidden.spec.max_episode_steps == full.spec.max_episode_steps
    assert hidden.observation_space.shape == (2,)
    np.testing.assert_array_equal(hidden.observation_space.low, full.observation_space.low[kept])
    obs, _ = hidden.reset(seed=3)
    full_obs, _ = full.reset(seed=3)
    np.testing.assert_array_equal(obs, full_obs[kept])
    for _ in range(20):  # the same dynamics: the same actions give the same positions and rewards
        action = full.action_space.sample()
        obs, reward, terminated, truncated, _ = hidden.step(action)
        full_obs, full_reward, full_terminated, full_truncated, _ = full.step(action)
        np.testing.assert_array_equal(obs, full_obs[kept])
        assert (reward, terminated, truncated) == (full_reward, full_terminated, full_truncated)
        if terminated or truncated:
            break


def test_hide_velocity_refuses_environments_it_does_not_know():
    with pytest.raises(ValueError, match="only for .*CartPoleEnv.*got MountainCarEnv"):
        HideVelocity(gym.make("MountainCar-v0"))


# ---- acting step by step equals the training-time pass over the window ---------------------------

def _with_previous_actions(obs: np.ndarray, actions: np.ndarray, n_actions: int) -> np.ndarray:
    """Encoder inputs written out in numpy: obs [n_obs, T, B] with the one-hot of the action
    taken one step earlier (zeros at the first step) below it: [n_obs + n_actions, T, B]."""
    one_hot = np.eye(n_actions, dtype=np.float32)[actions.astype(int)]  # [T, B, actions]
    previous = np.concatenate([np.zeros_like(one_hot[:1]), one_hot[:-1]])  # [T, B, actions]
    return np.concatenate([obs, previous.transpose(2, 0, 1)]).astype(np.float32)


@pytest.mark.parametrize("encoder, previous_action", [("mamba", True), ("mamba", False), ("rwkv", True)])
def test_acting_steps_match_the_whole_sequence_pass(device, encoder, previous_action):
    config = RecurrentDQNConfig(**SMALL_DQN, encoder=encoder, previous_action=previous_action)
    agent = RecurrentDQN(CARTPOLE, config, device=device, seed=1)
    episode = np.random.default_rng(0).standard_normal((12, 2)).astype(np.float32)  # [T, n_obs]
    state, actions = None, []
    for t in range(12):
        action, state = agent.predict(episode[t], state)
        actions.append(action)
    obs = episode.T.reshape(2, 12, 1)
    inputs = _with_previous_actions(obs, np.array(actions)[:, None], 2) if previous_action else obs
    q_sequence, _ = agent.q(rc.tensor(inputs.copy(), device=device))  # [actions, T]
    np.testing.assert_array_equal(actions, q_sequence.numpy().argmax(axis=0))
    # a lane flagged as starting an episode forgets its history
    fresh, _ = agent.predict(episode[5], None)
    restarted, _ = agent.predict(episode[5], state, episode_start=True)
    assert restarted == fresh
    with pytest.raises(ValueError, match="state has shapes"):
        agent.predict(episode[:2], state)
    with pytest.raises(ValueError, match="episode_start has 2 entries for 1 observations"):
        agent.predict(episode[5], state, episode_start=[True, False])
    with pytest.raises(ValueError, match="do not match the observation space"):
        agent.predict(np.zeros(3, np.float32))


def test_lane_states_keep_the_actions_taken_and_reset_where_episodes_end():
    agent = RecurrentDQN(CARTPOLE, RecurrentDQNConfig(**SMALL_DQN, n_envs=2), seed=2)
    agent._policy(np.ones((2, 2), np.float32), True)
    agent._stepped(np.array([[1], [0]]), np.array([False, False]))
    np.testing.assert_array_equal(agent._lane_state[-1], [[0, 1], [1, 0]])  # one-hot, lanes in columns
    assert all(np.abs(part).sum(axis=tuple(range(part.ndim - 1))).min() > 0 for part in agent._lane_state)
    agent._stepped(np.array([[0], [1]]), np.array([False, True]))
    for part in agent._lane_state:
        assert np.all(part[..., 1] == 0) and np.any(part[..., 0] != 0)


# ---- the sequence loss against numpy ----------------------------------------------------------------

def _reference_loss(agent, seq):
    """The masked Huber TD loss with n-step targets written out in numpy from the networks'
    outputs on inputs assembled in numpy (episodes here end by termination only)."""
    cfg = agent.config
    actions = seq.action.numpy()[0]  # [T, B]
    window, batch = actions.shape
    one_hot = np.eye(2, dtype=np.float32)[actions.astype(int)].transpose(2, 0, 1)  # [actions, T, B]
    inputs = rc.tensor(_with_previous_actions(seq.obs.numpy(), actions, 2))
    next_inputs = rc.tensor(np.concatenate([seq.next_obs.numpy(), one_hot]))  # a step's own action precedes its next obs
    q = agent.q(inputs)[0].numpy().reshape(2, window, batch, order="F")
    next_target = agent.target(next_inputs)[0].numpy().reshape(2, window, batch, order="F")
    next_online = agent.q(next_inputs)[0].numpy().reshape(2, window, batch, order="F")
    reward, terminated, mask = (t.numpy()[0] for t in (seq.reward, seq.terminated, seq.mask))  # [T, B]
    total, count = 0.0, 0.0
    for b in range(batch):
        for t in range(cfg.burn_in, cfg.burn_in + cfg.sequence_length):
            if not mask[t, b]:
                continue
            ret, k = 0.0, 0
            while True:  # sum up to n rewards, stopping at the episode's end
                ret += cfg.gamma ** k * reward[t + k, b]
                if terminated[t + k, b] or k == cfg.n_steps - 1:
                    break
                k += 1
            best = next_target[next_online[:, t + k, b].argmax(), t + k, b]
            target = ret + cfg.gamma ** (k + 1) * (1 - terminated[t + k, b]) * best
            d = q[int(actions[t, b]), t, b] - target
            total += 0.5 * d * d if abs(d) <= 1 else abs(d) - 0.5
            count += 1
    return total / max(count, 1.0)


@pytest.mark.parametrize("n_steps", [1, 3])
def test_sequence_loss_matches_numpy(device, monkeypatch, n_steps):
    agent = RecurrentDQN(CARTPOLE, RecurrentDQNConfig(**SMALL_DQN, n_steps=n_steps), device=device, seed=4)
    agent.learn(300)  # episodes of a random policy end often (by termination): windows cross their ends
    cfg = agent.config
    with agent.on_device():
        seq = agent.buffer.sample_sequences(16, cfg.sequence_length + n_steps - 1, burn_in=cfg.burn_in)
        assert seq.mask.numpy().min() == 0  # some steps masked after an episode's end
        assert not agent.buffer._truncated.any()
        monkeypatch.setattr(agent.buffer, "sample_sequences_on_device", lambda *args: seq)
        loss = float(agent._loss(None).numpy().reshape(-1)[0])
        reference = _reference_loss(agent, seq)
    assert loss == pytest.approx(reference, rel=1e-5)


# ---- saving, smoke runs --------------------------------------------------------------------------

def test_target_updates_wait_for_the_next_reader_and_combine(device):
    """Updates requested every step with no gradient step between them are applied as one when
    learn returns: target = (1 - tau)^k target + (1 - (1 - tau)^k) q, as k updates in a row."""
    config = RecurrentDQNConfig(**{**SMALL_DQN, "learning_starts": 10_000, "target_update_interval": 1, "tau": 0.5})
    agent = RecurrentDQN(CARTPOLE, config, device=device, seed=3)
    q = {name: value.copy() for name, value in agent.q.state_dict().items()}
    target = {name: value + 1.0 for name, value in q.items()}  # the target starts as a copy: move it
    agent.target.load_state_dict(target)
    coefficients = []
    update = agent._target_updates.update
    agent._target_updates.update = lambda coefficient: coefficients.append(coefficient) or update(coefficient)
    agent.learn(3)
    assert coefficients == [pytest.approx(0.875)] and agent._target_updates.pending == 0  # one dispatch
    for name, value in agent.target.state_dict().items():
        np.testing.assert_allclose(value, 0.125 * target[name] + 0.875 * q[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_loaded_agent_acts_identically(tmp_path):
    agent = RecurrentSAC(PENDULUM, RecurrentSACConfig(**SMALL_SAC), seed=5)
    agent.learn(160)
    agent.save(str(tmp_path / "agent.safetensors"))
    loaded = RecurrentSAC.load(str(tmp_path / "agent.safetensors"))
    obs = np.random.default_rng(1).uniform(-1, 1, (10, 2)).astype(np.float32)
    state_a = state_b = None
    for t in range(10):
        a, state_a = agent.predict(obs[t], state_a, deterministic=True)
        b, state_b = loaded.predict(obs[t], state_b, deterministic=True)
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("agent_class, env_id, small", [(RecurrentDQN, CARTPOLE, SMALL_DQN),
                                                        (RecurrentSAC, PENDULUM, SMALL_SAC)])
@pytest.mark.parametrize("encoder", ["mamba", "rwkv"])
def test_smoke_runs(device, agent_class, env_id, small, encoder, tmp_path):
    agent = agent_class(env_id, agent_class.config_class(**small, encoder=encoder, n_envs=2), device=device,
                        seed=0, logdir=str(tmp_path))
    agent.learn(300)
    assert agent.num_timesteps == 300 and agent._train_scalars
    assert all(np.isfinite(v) for v in agent._train_scalars.values())
    mean, _ = evaluate(agent, env_id, n_episodes=1, seed=0)
    assert np.isfinite(mean)


def test_config_errors():
    with pytest.raises(ValueError, match="encoder must be one of"):
        RecurrentDQNConfig(encoder="lstm")
    with pytest.raises(ValueError, match="previous_action must be a bool"):
        RecurrentSACConfig(previous_action=1)
    with pytest.raises(ValueError, match="burn_in must be an int >= 0"):
        RecurrentDQNConfig(burn_in=-1)
    with pytest.raises(ValueError, match="does not fit"):
        RecurrentSACConfig(buffer_size=20, sequence_length=16, burn_in=8)
    with pytest.raises(ValueError, match=r"window of 26 steps \(burn_in \+ sequence_length \+ n_steps - 1\)"):
        RecurrentDQNConfig(buffer_size=25, sequence_length=16, burn_in=8, n_steps=3)
    with pytest.raises(ValueError, match="n_steps must be a positive int"):
        RecurrentDQNConfig(n_steps=0)
    with pytest.raises(TypeError, match="acts with a carried state"):
        RecurrentDQN(CARTPOLE, RecurrentDQNConfig(**SMALL_DQN))._act(None, True)


# ---- the learning gate -------------------------------------------------------------------------------

@pytest.mark.slow
def test_learning_gate_recurrent_dqn_on_velocity_hidden_cartpole():
    """The recurrent-agents issue's gate: RecurrentDQN (its config defaults, seed 0) reaches a
    mean evaluation return of at least 400 on rlkit/CartPoleNoVel-v1 within 100k steps,
    evaluated every 5k steps on 10 episodes (training stops once reached), while DQN with RL
    Zoo's CartPole settings, given the same budget and evaluations, never gets near it."""
    agent = RecurrentDQN(CARTPOLE, seed=0)
    gate = EvalCallback(CARTPOLE, eval_freq=5000, n_episodes=10, reward_threshold=400, seed=100)
    agent.learn(100_000, callback=gate)
    assert gate.best >= 400, gate.evaluations
    assert evaluate(agent, CARTPOLE, 10, seed=100)[0] >= 400  # the agent it stopped with
    feed_forward = DQN(CARTPOLE, seed=0)
    baseline = EvalCallback(CARTPOLE, eval_freq=5000, n_episodes=10, seed=100)
    feed_forward.learn(100_000, callback=baseline)
    assert baseline.best < 200, baseline.evaluations  # memoryless: it cannot tell which way the pole moves


def test_command_line_trains_and_evaluates_a_recurrent_agent(tmp_path, capsys):
    from rlkit.cli import main

    argv = ["train", "recurrent_dqn", "--env", CARTPOLE, "--total-timesteps", "300", "--logdir", str(tmp_path),
            "--eval-episodes", "2", "--hyperparams", "learning_starts=100", "train_freq=50", "gradient_steps=2",
            "encoder=rwkv", "previous_action=false"]
    assert main(argv) == 0
    trained = capsys.readouterr().out
    model = tmp_path / "RecurrentDQN_1" / "model.safetensors"
    assert f"model: {model}" in trained
    assert main(["eval", str(model), "--episodes", "2"]) == 0
    returns = re.findall(r"mean return (\S+)", trained + capsys.readouterr().out)
    assert len(returns) == 2 and returns[0] == returns[1]  # the loaded agent acts as the trained one did
