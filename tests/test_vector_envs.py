"""Vector environments in every form users bring (issue 26, item 5): Gymnasium's default
NEXT_STEP autoreset, SAME_STEP, and SB3 VecEnvs (DummyVecEnv): the transitions stored are the
environment's own, never a pair of steps of two episodes nor a reset step."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlkit.agents import DQN


class Counter(gym.Env):
    """Observation (episode number, step in it): episodes end after 3 to 6 steps, terminated
    when the action is 1 at an odd step, truncated at the length otherwise. Reward is the step."""

    observation_space = gym.spaces.Box(0.0, 1e6, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.episode, self.t, self.length = -1, 0, 3

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        self.length = int(self.np_random.integers(3, 7))
        return np.array([self.episode, 0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        terminated = int(action) == 1 and self.t % 2 == 1
        truncated = not terminated and self.t >= self.length
        return np.array([self.episode, self.t], np.float32), float(self.t), terminated, truncated, {}


def _stored_transitions(agent, steps: int) -> list[tuple]:
    """(obs, reward, next_obs, terminated, truncated) rows of every step the agent stores (with
    add, or in runs of steps with extend)."""
    rows = []
    add, extend = agent.buffer.add, agent.buffer.extend

    def record(obs, reward, next_obs, terminated, truncated):
        for lane in range(len(obs)):
            rows.append((np.array(obs[lane]), float(reward[lane]), np.array(next_obs[lane]), bool(terminated[lane]),
                         bool(truncated[lane])))

    def recording_add(obs, action, reward, next_obs, terminated, truncated):
        record(obs, reward, next_obs, terminated, truncated)
        return add(obs, action, reward, next_obs, terminated, truncated)

    def recording_extend(obs, action, reward, next_obs, terminated, truncated):
        for step in zip(obs, reward, next_obs, terminated, truncated):
            record(*step)
        return extend(obs, action, reward, next_obs, terminated, truncated)

    agent.buffer.add, agent.buffer.extend = recording_add, recording_extend
    agent.learn(steps)
    return rows


def _check(rows: list[tuple]) -> None:
    ends = 0
    for obs, reward, next_obs, terminated, truncated in rows:
        assert next_obs[0] == obs[0] and next_obs[1] == obs[1] + 1, (obs, next_obs)  # one step of one episode
        assert reward == next_obs[1]  # the step's own reward, not a reset's 0
        ends += terminated or truncated
    assert ends > 10  # the run crossed many episode ends


def _vector(mode) -> gym.vector.VectorEnv:
    return gym.vector.SyncVectorEnv([Counter] * 3, autoreset_mode=mode)


@pytest.mark.parametrize("mode", [gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.SAME_STEP],
                         ids=["next-step", "same-step"])
def test_gymnasium_vector_envs_store_the_environments_own_transitions(mode):
    agent = DQN(_vector(mode), seed=0, learning_starts=1000, buffer_size=1000)
    _check(_stored_transitions(agent, 300))


class InPlaceCounter(Counter):
    """Counter writing each observation into the one array it returns, as Gymnasium's vector
    envs with ``copy=False`` write theirs."""

    def __init__(self):
        super().__init__()
        self.obs = np.zeros(2, np.float32)

    def reset(self, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        self.obs[:] = obs
        return self.obs, info

    def step(self, action):
        obs, *rest = super().step(action)
        self.obs[:] = obs
        return self.obs, *rest


def test_an_environment_writing_its_observation_in_place_stores_its_own_transitions():
    # the loop keeps a run of steps until a round of gradient steps stores it: it must keep copies
    agent = DQN(InPlaceCounter(), seed=0, learning_starts=1000, buffer_size=1000)
    _check(_stored_transitions(agent, 300))


@pytest.mark.parametrize("mode", [gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.SAME_STEP],
                         ids=["next-step", "same-step"])
def test_vector_envs_without_copies_store_the_environments_own_transitions(mode):
    env = gym.vector.SyncVectorEnv([Counter] * 3, autoreset_mode=mode, copy=False)  # one observation array
    agent = DQN(env, seed=0, learning_starts=1000, buffer_size=1000)
    _check(_stored_transitions(agent, 300))


def _async_vector(mode) -> gym.vector.VectorEnv:
    return gym.vector.AsyncVectorEnv([Counter] * 3, autoreset_mode=mode, context="fork")


@pytest.mark.parametrize("mode", [gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.SAME_STEP],
                         ids=["next-step", "same-step"])
def test_async_vector_envs_store_the_environments_own_transitions(mode):
    env = _async_vector(mode)
    try:
        agent = DQN(env, seed=0, learning_starts=60, buffer_size=1000, train_freq=2, gradient_steps=1)
        _check(_stored_transitions(agent, 300))
    finally:
        env.close()


def _train_rounds(agent, steps: int) -> tuple[list[str], list[int]]:
    """The order of the lanes' step calls and gradient rounds, and num_timesteps at each round."""
    events, rounds = [], []
    lanes, train = agent.lanes, agent._train
    for name in ("step", "step_async", "step_wait"):
        def recorded(*args, _call=getattr(lanes, name), _name=name):
            events.append(_name)
            return _call(*args)
        setattr(lanes, name, recorded)

    def recording_train(gradient_steps):
        events.append("train")
        rounds.append(agent.num_timesteps)
        return train(gradient_steps)

    agent._train = recording_train
    agent.learn(steps)
    return events, rounds


def test_async_vector_envs_step_while_the_gradient_steps_run():
    """With environments in other processes, each round of gradient steps runs between the
    step's start and its end: as many rounds as a sync run, from the same step on (the round
    of step k counts step k's timesteps as a sync run does; it samples before they are added)."""
    settings = dict(seed=0, learning_starts=30, buffer_size=1000, train_freq=4, gradient_steps=1)
    env = _async_vector(gym.vector.AutoresetMode.SAME_STEP)
    try:
        events, rounds = _train_rounds(DQN(env, **settings), 300)
    finally:
        env.close()
    sync_events, sync_rounds = _train_rounds(DQN(_vector(gym.vector.AutoresetMode.SAME_STEP), **settings), 300)
    assert events.count("step") + events.count("step_async") == 100 == sync_events.count("step")
    for i, event in enumerate(events):
        if event == "train":
            assert events[i - 1] == "step_async" and events[i + 1] == "step_wait"
    lanes = 3
    assert [timesteps + lanes for timesteps in rounds] == sync_rounds  # a sync round runs after the count rises
    assert len(rounds) == len([n for n in range(4, 101, 4) if 3 * n > 30])


def test_the_default_vector_env_is_accepted():
    env = gym.make_vec("CartPole-v1", num_envs=2)  # NEXT_STEP: Gymnasium's default
    agent = DQN(env, seed=1, learning_starts=50, buffer_size=500)
    agent.learn(200)
    assert agent.num_timesteps == 200


def test_sb3_vec_envs_store_the_environments_own_transitions():
    pytest.importorskip("stable_baselines3", reason="SB3 VecEnvs are tested where SB3 is installed (the sb3 extra)")
    from stable_baselines3.common.vec_env import DummyVecEnv

    agent = DQN(DummyVecEnv([Counter] * 2), seed=2, learning_starts=1000, buffer_size=1000)
    rows = _stored_transitions(agent, 300)
    _check(rows)
    assert any(truncated for *_, truncated in rows) and any(terminated for *_, terminated, _ in rows)


def test_sb3_subproc_vec_envs_step_while_the_gradient_steps_run():
    pytest.importorskip("stable_baselines3", reason="SB3 VecEnvs are tested where SB3 is installed (the sb3 extra)")
    from stable_baselines3.common.vec_env import SubprocVecEnv

    env = SubprocVecEnv([Counter] * 2, start_method="fork")
    try:
        agent = DQN(env, seed=2, learning_starts=40, buffer_size=1000, train_freq=2, gradient_steps=1)
        assert agent.lanes.steps_in_background
        _check(_stored_transitions(agent, 300))
    finally:
        env.close()


def test_a_vector_env_that_never_resets_is_refused():
    with pytest.raises(ValueError, match="must reset finished episodes itself"):
        DQN(_vector(gym.vector.AutoresetMode.DISABLED))
