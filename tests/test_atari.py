"""rlkit.envs.make_atari: the standard Atari preprocessing from Gymnasium's wrappers (needs the
atari extra, ale-py and opencv, which the test extra installs)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlkit.envs import EpisodicLife, FireReset, is_atari_id, make_atari

pytest.importorskip("ale_py", reason="the atari extra (ale-py) is part of the test extra: pip install 'rlkit[test]'")


def _wrappers(env: gym.Env) -> list[type]:
    found = []
    while isinstance(env, gym.Wrapper):
        found.append(type(env))
        env = env.env
    return found


def test_observations_are_four_stacked_84x84_bytes_sharing_three_frames():
    env = make_atari("ALE/Breakout-v5", seed=0)
    assert env.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    rng = np.random.default_rng(0)
    for _ in range(50):
        previous = obs
        obs, reward, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        if terminated or truncated:
            obs, _ = env.reset()
            continue
        np.testing.assert_array_equal(obs[:3], previous[1:])  # oldest frame first: one new frame per step
        assert reward in (-1.0, 0.0, 1.0)


def test_a_lost_life_ends_a_training_episode_but_not_the_game():
    env = make_atari("ALE/Breakout-v5", seed=1)
    assert EpisodicLife in _wrappers(env) and FireReset in _wrappers(env)
    env.reset(seed=1)
    ale = env.unwrapped.ale
    lives = ale.lives()
    assert lives == 5
    rng = np.random.default_rng(1)
    for _ in range(5000):
        _, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        if terminated:
            break
    assert terminated and not truncated and ale.lives() == lives - 1  # the episode ended at the first lost life
    env.reset()
    assert ale.lives() == lives - 1  # the game went on: no new game was started


def test_the_evaluation_form_plays_whole_games_with_unclipped_rewards():
    env = make_atari("ALE/Breakout-v5", training=False, seed=2)
    kinds = _wrappers(env)
    assert EpisodicLife not in kinds and gym.wrappers.TransformReward not in kinds and FireReset in kinds
    env.reset(seed=2)
    ale = env.unwrapped.ale
    rng = np.random.default_rng(2)
    for _ in range(20000):
        _, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        if terminated or truncated:
            break
    assert terminated and ale.lives() == 0  # the episode is the whole game


def test_pong_needs_no_life_wrapper_change_and_vector_envs_reset_in_the_same_step():
    env = make_atari("PongNoFrameskip-v4", n_envs=3, seed=3)
    assert isinstance(env, gym.vector.VectorEnv) and env.num_envs == 3
    assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    obs, _ = env.reset(seed=3)
    assert obs.shape == (3, 4, 84, 84) and obs.dtype == np.uint8
    obs, reward, *_ = env.step(np.zeros(3, np.int64))
    assert obs.shape == (3, 4, 84, 84) and reward.shape == (3,)
    env.close()


def test_is_atari_id():
    assert is_atari_id("ALE/Pong-v5") and is_atari_id("PongNoFrameskip-v4") and is_atari_id("BreakoutDeterministic-v4")
    assert not is_atari_id("CartPole-v1") and not is_atari_id(None) and not is_atari_id("MinAtar/Breakout-v1")


def test_bad_input():
    with pytest.raises(ValueError, match="not an Atari id"):
        make_atari("CartPole-v1")
    with pytest.raises(ValueError, match="n_envs must be a positive int"):
        make_atari("ALE/Pong-v5", n_envs=0)
    with pytest.raises(ValueError, match="frame_stack must be a positive int"):
        make_atari("ALE/Pong-v5", frame_stack=0)
    with pytest.raises(ValueError, match="vectorization_mode"):
        make_atari("ALE/Pong-v5", n_envs=2, vectorization_mode="threads")
    with pytest.raises(ValueError, match="expected FIRE"):
        FireReset(gym.make("ALE/Skiing-v5"))


def test_the_command_line_trains_dqn_on_an_atari_id_with_rl_zoo_settings(tmp_path, capsys):
    import json

    from rlkit.checkpoint import read_checkpoint
    from rlkit.cli import main

    model = str(tmp_path / "pong.safetensors")
    code = main(["train", "dqn", "--env", "ALE/Pong-v5", "--total-timesteps", "300", "--logdir", str(tmp_path),
                 "--save", model, "--eval-episodes", "0", "--hyperparams", "buffer_size=1000", "learning_starts=100"])
    assert code == 0 and "trained DQN on ALE/Pong-v5 for 300 timesteps" in capsys.readouterr().out
    config = read_checkpoint(model)["metadata"]["config"]
    config = json.loads(config) if isinstance(config, str) else config
    assert config["learning_rate"] == 1e-4 and config["train_freq"] == 4 and config["net_arch"] in ([], ())
    assert config["buffer_size"] == 1000  # the command line's overrides on top of the Atari settings
