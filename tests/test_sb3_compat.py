"""rlkit's agents as Stable-Baselines3 users know them (issue 26): ``predict`` with SB3's
signature, shapes and dtypes; SB3's own ``evaluate_policy`` on rlkit agents, and rlkit's
``evaluate`` with SB3's keywords and results; SB3's callbacks, hooks and file names; ``learn``'s
keywords; the model API (get/set_env, get/set_parameters, ``policy``) and the constructor's
keywords. Where SB3 itself is the reference the test needs stable_baselines3 (the ``sb3`` extra)
and skips where it is not importable; short runs, no learning gates."""

import os

import gymnasium as gym
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlkit.agents import (
    DDPG, DQN, SAC, TD3, BaseCallback, CallbackList, CheckpointCallback, DDPGConfig, DiscreteSAC, DQNConfig,
    EvalCallback, EveryNTimesteps, RecurrentDQN, RecurrentDQNConfig, SACConfig, StepEvent, StopTrainingOnMaxEpisodes,
    StopTrainingOnNoModelImprovement, StopTrainingOnRewardThreshold, TD3Config, evaluate,
)

SMALL = dict(learning_starts=50, net_arch=(16,), batch_size=16, buffer_size=1000)
CARTPOLE, PENDULUM = "CartPole-v1", "Pendulum-v1"


def sb3():
    """stable_baselines3, or a skip where it is not installed (pip install rlkit[sb3])."""
    return pytest.importorskip("stable_baselines3")


def small_dqn(**overrides):
    return DQN(CARTPOLE, DQNConfig(**{**SMALL, "train_freq": 4, **overrides}), seed=0)


# ---- 1. predict ----------------------------------------------------------------------------------

@pytest.mark.parametrize("algo, env_id", [("DQN", CARTPOLE), ("SAC", PENDULUM), ("TD3", PENDULUM)])
def test_predict_returns_what_sb3s_predict_returns(algo, env_id):
    """Shapes, dtypes and the state of the actions for one observation, a batch of one and a
    batch of three, against an SB3 model on the same environment."""
    stable_baselines3 = sb3()
    reference = getattr(stable_baselines3, algo)("MlpPolicy", env_id, seed=0, device="cpu")
    agent = {"DQN": DQN, "SAC": SAC, "TD3": TD3}[algo](env_id, seed=0, net_arch=(16,))
    space = agent.observation_space
    for obs in (space.sample(), np.stack([space.sample()]), np.stack([space.sample() for _ in range(3)])):
        for deterministic in (True, False):
            expected, expected_state = reference.predict(obs, deterministic=deterministic)
            actions, state = agent.predict(obs, deterministic=deterministic)
            assert type(actions) is type(expected) and actions.dtype == expected.dtype
            assert actions.shape == expected.shape and state is expected_state is None
            assert all(agent.action_space.contains(a) for a in (actions.reshape(-1, *agent.action_space.shape)
                                                                 if obs.ndim > 1 else [actions]))


def test_predict_of_one_discrete_observation_is_a_0d_int64_array():
    actions, state = small_dqn().predict(np.zeros(4, np.float32), state=("kept",), episode_start=[True])
    assert actions.shape == () and actions.dtype == np.int64 and state == ("kept",)  # a state passes through


def test_predict_refuses_shapes_sb3_refuses_and_the_reset_tuple():
    agent = small_dqn()
    for bad in (np.zeros(8), np.zeros((2, 2)), np.zeros((3, 4, 1))):
        with pytest.raises(ValueError, match=r"do not match the observation space: expected \(4,\) for one, "
                                             r"or \(n_envs, 4\) for a batch"):
            agent.predict(bad)
    with pytest.raises(ValueError, match=r"got a tuple \(observation, info\).*obs, info = env.reset\(\)"):
        agent.predict(gym.make(CARTPOLE).reset(seed=0))


def test_dqn_predict_explores_with_the_exploration_rate_and_its_policy_does_not():
    """As SB3's DQN.predict: deterministic=False takes epsilon-greedy actions at the current
    exploration rate (0 before learning); model.policy.predict is the greedy policy alone."""
    agent = small_dqn(exploration_initial_eps=1.0, exploration_final_eps=1.0)
    obs = np.zeros((400, 4), np.float32)
    greedy, _ = agent.predict(obs, deterministic=True)
    assert agent.exploration_rate == 0.0
    np.testing.assert_array_equal(agent.predict(obs)[0], greedy)
    agent.learn(60)
    assert agent.exploration_rate == 1.0
    explored, _ = agent.predict(obs)
    assert 120 < np.count_nonzero(explored != greedy) < 280  # uniform actions: half differ from greedy
    np.testing.assert_array_equal(agent.policy.predict(obs)[0], agent.predict(obs, deterministic=True)[0])
    assert agent.policy.name == "MlpPolicy" and agent.policy.action_space == agent.action_space


def test_recurrent_predict_carries_its_state_and_restarts_lanes_flagged_by_episode_start():
    agent = RecurrentDQN("rlkit/CartPoleNoVel-v1", RecurrentDQNConfig(learning_starts=50, buffer_size=1000), seed=0)
    rng = np.random.default_rng(0)
    steps = rng.standard_normal((6, 2, 2)).astype(np.float32)  # [T, lanes, n_obs]
    state = None
    for obs in steps[:5]:
        actions, state = agent.predict(obs, state, deterministic=True)
    assert actions.shape == (2,) and actions.dtype == np.int64
    assert all(part.shape[-1] == 2 for part in state)  # lanes in the last dimension
    mixed, _ = agent.predict(steps[5], state, episode_start=np.array([True, False]), deterministic=True)
    fresh, _ = agent.predict(steps[5], None, deterministic=True)
    carried, _ = agent.predict(steps[5], state, deterministic=True)
    assert (mixed[0], mixed[1]) == (fresh[0], carried[1])
    lane_state = tuple(part[..., 1:] for part in state)  # lane 1 alone gives the same action
    alone, _ = agent.predict(steps[5][1], lane_state, deterministic=True)
    assert alone.shape == () and alone == carried[1]


# ---- 1. evaluation: SB3's evaluate_policy on rlkit agents, rlkit's evaluate as SB3's --------------

def test_sb3_evaluate_policy_runs_rlkit_agents_and_rlkit_evaluate_agrees_with_it():
    """The same deterministic agent on identically seeded environments: one environment, an
    SB3 VecEnv of three, a recurrent agent; rlkit's evaluate gives SB3's episodes."""
    sb3()
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    agent = small_dqn()
    agent.learn(200)
    single = [gym.make(CARTPOLE) for _ in range(2)]
    for env in single:
        env.reset(seed=3)  # both go on from the same generator: evaluate_policy resets without a seed
    expected = evaluate_policy(agent, single[0], n_eval_episodes=4, return_episode_rewards=True, warn=False)
    returns, lengths = evaluate(agent, single[1], n_eval_episodes=4, return_episode_rewards=True)
    assert (returns, lengths) == expected and len(returns) == 4
    assert all(type(r) is float for r in returns) and all(type(n) is int for n in lengths)
    vec_args = dict(n_envs=3, seed=0)
    expected = evaluate_policy(agent, make_vec_env(CARTPOLE, **vec_args), n_eval_episodes=5,
                               return_episode_rewards=True, warn=False)
    assert evaluate(agent, make_vec_env(CARTPOLE, **vec_args), 5, return_episode_rewards=True) == expected
    mean, std = evaluate_policy(agent, make_vec_env(CARTPOLE, **vec_args), n_eval_episodes=5, warn=False)
    assert (mean, std) == pytest.approx((np.mean(expected[0]), np.std(expected[0])))
    recurrent = RecurrentDQN("rlkit/CartPoleNoVel-v1", RecurrentDQNConfig(learning_starts=50, buffer_size=1000), seed=0)
    expected = evaluate_policy(recurrent, make_vec_env("rlkit/CartPoleNoVel-v1", **vec_args), n_eval_episodes=4,
                               return_episode_rewards=True, warn=False)
    assert evaluate(recurrent, make_vec_env("rlkit/CartPoleNoVel-v1", **vec_args), 4,
                    return_episode_rewards=True) == expected


@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP"])
def test_evaluate_on_gymnasium_vector_envs_counts_the_episodes_of_the_lanes_run_alone(mode):
    """Lane i of a vector reset with seed s is the environment reset with seed s + i: its
    episodes, run alone, are the returns evaluate counts for it (in next-step autoreset mode
    the reset steps add nothing)."""
    agent = small_dqn()
    vector = gym.make_vec(CARTPOLE, num_envs=2, vectorization_mode="sync",
                          vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode[mode]})
    returns, lengths = evaluate(agent, vector, 5, return_episode_rewards=True, seed=10)
    alone = []
    for lane, episodes in ((0, 2), (1, 3)):  # (5 + i) // 2 episodes each
        env = gym.make(CARTPOLE)
        obs, _ = env.reset(seed=10 + lane)
        for _ in range(episodes):
            total, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(agent.predict(obs, deterministic=True)[0])
                total, done = total + reward, terminated or truncated
            alone.append(total)
            obs, _ = env.reset()
    assert sorted(returns) == sorted(alone) and lengths == [int(r) for r in returns]  # CartPole: 1 per step


def test_evaluate_takes_sb3s_keywords():
    agent = small_dqn()
    seen = []
    mean, std = evaluate(agent, CARTPOLE, n_eval_episodes=3, deterministic=True, seed=1,
                         callback=lambda locals_, globals_: seen.append((locals_["i"], locals_["done"])))
    returns, lengths = evaluate(agent, CARTPOLE, 3, seed=1, return_episode_rewards=True)
    assert isinstance(mean, float) and (mean, std) == pytest.approx((np.mean(returns), np.std(returns)))
    assert len(seen) == sum(lengths) and sum(done for _, done in seen) == 3
    assert evaluate(agent, CARTPOLE, n_episodes=3, seed=1) == (mean, std)  # the older keyword
    with pytest.raises(AssertionError, match="is not above reward_threshold"):
        evaluate(agent, CARTPOLE, 3, seed=1, reward_threshold=mean)
    evaluate(agent, CARTPOLE, 3, seed=1, reward_threshold=mean - 1)

    class CountRenders(gym.Wrapper):
        renders = 0

        def render(self):
            CountRenders.renders += 1

    evaluate(agent, CountRenders(gym.make(CARTPOLE)), 2, render=True, seed=1)
    assert CountRenders.renders == sum(lengths[:2])
    with pytest.raises(ValueError, match="n_eval_episodes must be a positive int"):
        evaluate(agent, CARTPOLE, 0)


# ---- 2. callbacks --------------------------------------------------------------------------------

class Recording(BaseCallback):
    """Records every hook with the counters it saw; stops at ``stop_at`` calls."""

    def __init__(self, stop_at=None):
        super().__init__()
        self.hooks, self.stop_at = [], stop_at

    def _init_callback(self):
        self.hooks.append(("init", self.model.num_timesteps))

    def _on_training_start(self):
        self.hooks.append(("training_start", self.num_timesteps))

    def _on_rollout_start(self):
        self.hooks.append(("rollout_start", self.model.num_timesteps))

    def _on_step(self):
        assert isinstance(self.event, StepEvent) and self.event.num_timesteps == self.num_timesteps
        self.hooks.append(("step", self.n_calls, self.num_timesteps))
        return self.n_calls != self.stop_at

    def _on_rollout_end(self):
        self.hooks.append(("rollout_end", self.model.num_timesteps))

    def _on_training_end(self):
        self.hooks.append(("training_end", self.num_timesteps))


def test_base_callback_hooks_run_in_sb3s_order_with_its_attributes():
    agent = small_dqn()
    callback = Recording()
    assert agent.learn(10, callback=callback) is agent
    steps = [("step", n, n) for n in range(1, 11)]
    assert callback.hooks == [("init", 0), ("training_start", 0),
                              ("rollout_start", 0), *steps[:4], ("rollout_end", 4),
                              ("rollout_start", 4), *steps[4:8], ("rollout_end", 8),
                              ("rollout_start", 8), *steps[8:], ("rollout_end", 10), ("training_end", 10)]
    assert callback.model is agent and callback.training_env is agent.get_env() and callback.logger is agent.logger
    with pytest.raises(AttributeError, match="self.event is the step just taken"):
        callback.locals


def test_on_step_returning_false_stops_at_once_without_ending_the_rollout():
    agent = small_dqn()
    callback = Recording(stop_at=6)
    agent.learn(100, callback=callback)
    assert agent.num_timesteps == 6 and callback.n_calls == 6
    assert callback.hooks[-3:] == [("step", 5, 5), ("step", 6, 6), ("training_end", 6)]


def test_a_callback_list_and_a_plain_list_run_every_callback_and_stop_if_any_says_so():
    agent = small_dqn(n_envs=2)
    events, recording = [], Recording()
    agent.learn(100, callback=[lambda event: events.append(event.num_timesteps) or len(events) < 3, recording])
    assert agent.num_timesteps == 6 and events == [2, 4, 6]
    assert recording.n_calls == 3  # run on the stopping step too
    listed = CallbackList([Recording(stop_at=2), Recording()])
    small_dqn().learn(100, callback=listed)
    assert [c.n_calls for c in listed.callbacks] == [2, 2]


def test_values_a_callback_records_reach_tensorboard(tmp_path):
    class RecordsActions(BaseCallback):
        def _on_step(self):
            self.logger.record("custom/action", float(self.event.actions[0]))
            self.logger.record("custom/hidden", 1.0, exclude="tensorboard")

    agent = DQN(CARTPOLE, DQNConfig(**SMALL, log_interval=25), seed=0, logdir=str(tmp_path))
    agent.learn(100, callback=RecordsActions())
    acc = EventAccumulator(agent.log_path)
    acc.Reload()
    assert [e.step for e in acc.Scalars("custom/action")] == [25, 50, 75, 100]
    assert "custom/hidden" not in acc.Tags()["scalars"]


def test_eval_callback_as_sb3s_with_stop_on_reward_threshold(tmp_path):
    """Evaluations every eval_freq calls, equal to evaluate on the same episodes, written to
    evaluations.npz with SB3's keys; the best model saved; training stops at the threshold."""
    agent = small_dqn(learning_starts=10_000)  # no gradient steps: the same policy at each evaluation
    stop = StopTrainingOnRewardThreshold(reward_threshold=-1.0)
    callback = EvalCallback(CARTPOLE, callback_on_new_best=stop, n_eval_episodes=3, eval_freq=40,
                            log_path=str(tmp_path), best_model_save_path=str(tmp_path), verbose=0, seed=4)
    agent.learn(1000, callback=callback)
    returns, lengths = evaluate(agent, CARTPOLE, 3, seed=4, return_episode_rewards=True)
    assert agent.num_timesteps == 40 and stop.parent is callback
    assert callback.evaluations_timesteps == [40] and callback.evaluations_results == [returns]
    assert callback.last_mean_reward == callback.best_mean_reward == pytest.approx(np.mean(returns))
    saved = np.load(tmp_path / "evaluations.npz")
    assert sorted(saved.files) == ["ep_lengths", "results", "timesteps"]  # SB3's keys
    np.testing.assert_array_equal(saved["results"], [returns])
    np.testing.assert_array_equal(saved["ep_lengths"], [lengths])
    best = DQN.load(str(tmp_path / "best_model.safetensors"))
    obs = np.random.default_rng(0).standard_normal((20, 4)).astype(np.float32)
    np.testing.assert_array_equal(best.predict(obs, deterministic=True)[0], agent.predict(obs, deterministic=True)[0])


def test_a_callback_object_still_works_as_a_function_of_the_event():
    """rlkit's callbacks were functions of the event: one can still be called from another."""
    agent = small_dqn()
    gate = EvalCallback(CARTPOLE, n_eval_episodes=1, eval_freq=20, verbose=0, seed=0)
    agent.learn(60, callback=lambda event: gate(event))
    assert gate.model is agent and [step for step, _, _ in gate.evaluations] == [20, 40, 60]


def test_stop_on_no_model_improvement_counts_evaluations_without_a_new_best():
    """An unchanging policy on the same evaluation episodes: the first evaluation is a new
    best, none after it; with max_no_improvement_evals=2 the fourth stops training."""
    agent = small_dqn(learning_starts=10_000)
    stop = StopTrainingOnNoModelImprovement(max_no_improvement_evals=2)
    callback = EvalCallback(CARTPOLE, callback_after_eval=stop, n_eval_episodes=2, eval_freq=20, verbose=0, seed=0)
    agent.learn(1000, callback=callback)
    assert agent.num_timesteps == 80 and len(callback.evaluations) == 4 and stop.no_improvement_evals == 3
    with_min = StopTrainingOnNoModelImprovement(max_no_improvement_evals=2, min_evals=3)
    small_dqn(learning_starts=10_000).learn(1000, callback=EvalCallback(
        CARTPOLE, callback_after_eval=with_min, n_eval_episodes=2, eval_freq=20, verbose=0, seed=0))
    assert with_min.n_calls == 6  # three evaluations not judged, then three without improvement


def test_stop_callbacks_outside_an_eval_callback_are_refused():
    for stop in (StopTrainingOnRewardThreshold(100), StopTrainingOnNoModelImprovement(3)):
        with pytest.raises(ValueError, match="runs inside an EvalCallback"):
            small_dqn().learn(10, callback=stop)


def test_stop_on_max_episodes_counts_episodes_per_lane():
    agent = small_dqn(n_envs=2)
    ended = []
    stop = StopTrainingOnMaxEpisodes(max_episodes=3)
    agent.learn(10_000, callback=[lambda event: ended.append(int(event.dones.sum())), stop])
    assert sum(ended) >= 6 > sum(ended[:-1]) and stop.n_episodes == sum(ended)  # 3 episodes x 2 lanes


def test_every_n_timesteps_fires_once_per_n_steps():
    fired = Recording()
    small_dqn(n_envs=2).learn(40, callback=EveryNTimesteps(n_steps=10, callback=fired))
    assert [hook[2] for hook in fired.hooks if hook[0] == "step"] == [10, 20, 30, 40]


def test_checkpoint_names_follow_num_timesteps_across_learn_calls(tmp_path):
    """SB3's names, rl_model_<num_timesteps>_steps and rl_model_replay_buffer_<n>_steps:
    num_timesteps goes on with reset_num_timesteps=False and starts anew with True."""
    agent = small_dqn()
    callback = CheckpointCallback(save_freq=100, save_path=str(tmp_path / "ckpt"), save_replay_buffer=True)
    agent.learn(200, callback=callback)
    agent.learn(200, callback=callback, reset_num_timesteps=False)
    assert agent.num_timesteps == 400
    agent.learn(100, callback=callback)
    assert agent.num_timesteps == 100
    names = [os.path.basename(path) for path in callback.saved]
    assert names == [f"rl_model_{n}_steps.safetensors" for n in (100, 200, 300, 400, 100)]
    assert sorted(os.listdir(tmp_path / "ckpt")) == sorted(
        [f"rl_model_{n}_steps.safetensors" for n in (100, 200, 300, 400)]
        + [f"rl_model_replay_buffer_{n}_steps" for n in (100, 200, 300, 400)])
    assert DQN.load(str(tmp_path / "ckpt" / "rl_model_300_steps.safetensors")).num_timesteps == 300


# ---- 3. learn and the model API ------------------------------------------------------------------

def test_learn_run_folders_and_timesteps_as_sb3(tmp_path):
    agent = DQN(CARTPOLE, DQNConfig(**SMALL, log_interval=50), seed=0, tensorboard_log=str(tmp_path))
    agent.learn(100, tb_log_name="run")
    agent.learn(100, tb_log_name="run", reset_num_timesteps=False)  # the same folder, going on
    assert agent.log_path == str(tmp_path / "run_1") and agent.num_timesteps == 200
    acc = EventAccumulator(agent.log_path)
    acc.Reload()
    assert [e.step for e in acc.Scalars("time/fps")] == [50, 100, 150, 200]
    agent.learn(100, tb_log_name="run")
    assert agent.log_path == str(tmp_path / "run_2") and agent.num_timesteps == 100
    assert agent.learn(10, progress_bar=True) is agent and agent.log_path == str(tmp_path / "DQN_1")


def test_log_interval_counts_episodes_as_sb3s_off_policy_agents(tmp_path):
    agent = DQN(CARTPOLE, DQNConfig(**SMALL), seed=0, logdir=str(tmp_path))
    ends = []
    agent.learn(300, log_interval=2, callback=lambda e: ends.extend([e.num_timesteps] * int(e.dones.sum())))
    acc = EventAccumulator(agent.log_path)
    acc.Reload()
    written = [e.step for e in acc.Scalars("rollout/ep_rew_mean")]
    assert written[:-1] == ends[1::2] and written[-1] == 300  # every second episode, then the end
    with pytest.raises(ValueError, match="log_interval must be a positive int"):
        agent.learn(10, log_interval=0)


def test_get_env_and_set_env():
    agent = small_dqn()
    assert agent.get_env() is agent.env
    other = gym.make(CARTPOLE)
    agent.set_env(other)
    assert agent.get_env() is other
    agent.learn(60, reset_num_timesteps=False)
    with pytest.raises(ValueError, match="spaces .* are not the agent's"):
        agent.set_env(gym.make("Acrobot-v1"))
    with pytest.raises(ValueError, match="the environment has 2 lanes, the replay buffer is laid out for 1"):
        agent.set_env(gym.make_vec(CARTPOLE, 2, vectorization_mode="sync",
                                   vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}))


def test_get_and_set_parameters(tmp_path):
    source, target = (SAC(PENDULUM, SACConfig(**SMALL), seed=s) for s in (1, 2))
    source.learn(100)
    obs = np.random.default_rng(0).uniform(-1, 1, (10, 3)).astype(np.float32)

    def acts_alike():
        return np.array_equal(source.predict(obs, deterministic=True)[0], target.predict(obs, deterministic=True)[0])

    assert not acts_alike()
    parameters = source.get_parameters()
    assert sorted(parameters) == sorted(source._state_objects())
    target.set_parameters(parameters)
    assert acts_alike()
    target = SAC(PENDULUM, SACConfig(**SMALL), seed=2)
    source.save(str(tmp_path / "sac.safetensors"))
    target.set_parameters(str(tmp_path / "sac.safetensors"))
    assert acts_alike()
    target = SAC(PENDULUM, SACConfig(**SMALL), seed=2)
    with pytest.raises(ValueError, match=r"missing: \['actor_optimizer', 'critic', "):
        target.set_parameters({"actor": parameters["actor"]})
    target.set_parameters({"actor": parameters["actor"]}, exact_match=False)  # the actor alone
    assert acts_alike()
    with pytest.raises(ValueError, match=r"unknown: \['policy'\]"):
        target.set_parameters({"policy": {}}, exact_match=False)
    before = target.get_parameters()["critic"]
    with pytest.raises(KeyError):
        target.set_parameters({**parameters, "critic_target": {"q0.net.0.W": np.zeros(1)}})
    for name, value in target.get_parameters()["critic"].items():  # all or none: the critic restored
        np.testing.assert_array_equal(value, before[name])


def test_dqn_set_parameters_reaches_the_acting_copy():
    source, target = small_dqn(), DQN(CARTPOLE, DQNConfig(**SMALL), seed=5)
    source.learn(200)
    target.set_parameters(source.get_parameters())
    obs = np.random.default_rng(1).standard_normal((50, 4)).astype(np.float32)
    np.testing.assert_array_equal(target.predict(obs, deterministic=True)[0], source.predict(obs, deterministic=True)[0])


# ---- 3. the constructor --------------------------------------------------------------------------

def test_hyperparameters_as_keywords_by_config_names_and_sb3s():
    agent = DQN(CARTPOLE, learning_rate=1e-3, buffer_size=500)
    assert (agent.config.learning_rate, agent.config.buffer_size, agent.buffer.capacity) == (1e-3, 500, 500)
    agent = DQN(CARTPOLE, DQNConfig(batch_size=8), learning_rate=1e-3)  # keywords override the config's fields
    assert (agent.config.batch_size, agent.config.learning_rate) == (8, 1e-3)
    agent = DQN(CARTPOLE, train_freq=(4, "step"), gradient_steps=-1, n_envs=2, verbose=1,
                policy_kwargs=dict(net_arch=[32, 32], activation_fn="relu"))
    assert (agent.config.train_freq, agent.config.gradient_steps, agent.config.net_arch) == (4, 8, (32, 32))
    assert agent.verbose == 1
    assert DQN(CARTPOLE, device="auto").device == DQN(CARTPOLE).device


def test_sb3s_positional_policy_and_keyword_forms():
    for agent in (DQN("MlpPolicy", CARTPOLE, learning_starts=7), DQN(policy="MlpPolicy", env=CARTPOLE, learning_starts=7),
                  DQN("MlpPolicy", env=CARTPOLE, learning_starts=7), DQN(CARTPOLE, learning_starts=7)):
        assert agent.lanes.env_id == CARTPOLE and agent.config.learning_starts == 7
        assert agent.policy.name == "MlpPolicy"
    assert DQN("CnnPolicy", CARTPOLE).policy.name == "CnnPolicy"
    with pytest.raises(ValueError, match=r"unknown policy 'LstmPolicy': expected one of \('MlpPolicy'"):
        DQN("LstmPolicy", CARTPOLE)
    with pytest.raises(TypeError, match="DQN needs an environment"):
        DQN("MlpPolicy")
    with pytest.raises(TypeError, match="the environment is given twice"):
        DQN(CARTPOLE, env=CARTPOLE)


def test_unknown_keywords_and_unsupported_sb3_options_are_refused_clearly():
    with pytest.raises(TypeError, match=r"DQN: unknown keyword 'learning_rat'; valid: DQNConfig's fields "
                                        r"\[.*'learning_rate'.*\], and SB3's \[.*'policy_kwargs'.*\]"):
        DQN(CARTPOLE, learning_rat=1e-3)
    with pytest.raises(ValueError, match="optimize_memory_usage=True is an SB3 option rlkit does not have"):
        DQN(CARTPOLE, optimize_memory_usage=True)
    DQN(CARTPOLE, optimize_memory_usage=False, replay_buffer_class=None)  # SB3's defaults pass
    with pytest.raises(ValueError, match="train_freq in episodes is not supported"):
        DQN(CARTPOLE, train_freq=(1, "episode"))
    with pytest.raises(ValueError, match=r"policy_kwargs \['ortho_init'\] not supported; rlkit reads"):
        SAC(PENDULUM, policy_kwargs=dict(ortho_init=False))
    with pytest.raises(ValueError, match="activation_fn must be ReLU"):
        SAC(PENDULUM, policy_kwargs=dict(activation_fn="tanh"))
    with pytest.raises(ValueError, match="action_noise is not supported"):
        SAC(PENDULUM, action_noise=object())
    with pytest.raises(TypeError, match="give the log folder once"):
        DQN(CARTPOLE, logdir="a", tensorboard_log="b")


@pytest.mark.parametrize("cls, config_class", [(SAC, SACConfig), (TD3, TD3Config), (DDPG, DDPGConfig)])
def test_separate_actor_and_critic_architectures(cls, config_class, tmp_path):
    arch = dict(pi=[8, 8], qf=[16])
    for agent in (cls(PENDULUM, policy_kwargs=dict(net_arch=arch), learning_starts=20, batch_size=8),
                  cls(PENDULUM, config_class(net_arch=arch, learning_starts=20, batch_size=8))):
        assert agent.config.net_arch == {"pi": (8, 8), "qf": (16,)}
        actor = {k: v.shape for k, v in agent.actor.state_dict().items() if k.endswith("W")}
        critic = {k: v.shape for k, v in agent.critic.q0.state_dict().items() if k.endswith("W")}
        assert [shape[0] for shape in actor.values()][:2] == [8, 8] and len(actor) in (3, 4)
        assert [shape[0] for shape in critic.values()] == [16, 1]
    agent.learn(40)
    agent.save(str(tmp_path / "agent.safetensors"))
    assert cls.load(str(tmp_path / "agent.safetensors")).config == agent.config  # the dict survives the JSON


def test_net_arch_dict_is_refused_where_there_is_one_network():
    with pytest.raises(ValueError, match="DQNConfig: net_arch must be a list of widths .* actor-critic agents"):
        DQN(CARTPOLE, net_arch=dict(pi=[8], qf=[8]))
    with pytest.raises(ValueError, match="needs the keys 'pi' .* and 'qf'"):
        SACConfig(net_arch=dict(pi=[8]))
    assert DiscreteSAC(CARTPOLE, net_arch=dict(pi=[8], qf=[12])).critic.q0.state_dict()["0.W"].shape == (12, 4)


def test_sb3s_own_objects_as_keywords():
    """SB3's NormalActionNoise is rlkit's action_noise_std; torch's ReLU is the activation."""
    sb3()
    import torch
    from stable_baselines3.common.noise import NormalActionNoise

    agent = TD3(PENDULUM, action_noise=NormalActionNoise(mean=np.zeros(1), sigma=0.3 * np.ones(1)),
                policy_kwargs=dict(net_arch=dict(pi=[8], qf=[8]), activation_fn=torch.nn.ReLU))
    assert agent.config.action_noise_std == pytest.approx(0.3)
    with pytest.raises(ValueError, match="activation_fn must be ReLU"):
        TD3(PENDULUM, policy_kwargs=dict(activation_fn=torch.nn.Tanh))
    with pytest.raises(ValueError, match="NormalActionNoise with mean 0"):
        TD3(PENDULUM, action_noise=NormalActionNoise(mean=np.ones(1), sigma=np.ones(1)))
