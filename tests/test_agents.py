"""The agent set beside DQN (DDPG, TD3, SAC, discrete SAC) and what every agent shares: smoke
runs of every agent and option on both backends, the losses against numpy on fixed batches,
the squashed Gaussian's log-probability, SB3's TensorBoard tags, save/load, vector
environments, action rescaling, seeding and bad input. The learning gates are at the end."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import rlkit.core as rc
from rlkit.agents import (
    ALGOS, DDPG, DQN, SAC, TD3, CheckpointCallback, DDPGConfig, DiscreteSAC, DiscreteSACConfig, DQNConfig,
    OffPolicyConfig, SACConfig, TD3Config, evaluate,
)
from rlkit.agents.episodes import EpisodeStats
from rlkit.agents.lanes import EnvLanes
from rlkit.buffers import ReplaySamples

SMALL = dict(learning_starts=100, net_arch=(32, 32), batch_size=32, buffer_size=2000, log_interval=100)

SMOKE = [
    ("dqn", DQN, "CartPole-v1", DQNConfig(**SMALL, train_freq=4, gradient_steps=1)),
    ("dqn-double-dueling", DQN, "CartPole-v1", DQNConfig(**SMALL, train_freq=4, gradient_steps=1, double=True, dueling=True)),
    ("dqn-n-step", DQN, "CartPole-v1", DQNConfig(**SMALL, train_freq=4, gradient_steps=1, n_steps=3)),
    ("dqn-prioritized", DQN, "CartPole-v1", DQNConfig(**SMALL, train_freq=4, gradient_steps=1, prioritized=True, n_steps=2)),
    ("ddpg", DDPG, "Pendulum-v1", DDPGConfig(**SMALL)),
    ("td3", TD3, "Pendulum-v1", TD3Config(**SMALL)),
    ("sac", SAC, "Pendulum-v1", SACConfig(**SMALL)),
    ("sac-fixed-alpha", SAC, "Pendulum-v1", SACConfig(**SMALL, ent_coef=0.2)),
    ("discrete-sac", DiscreteSAC, "CartPole-v1", DiscreteSACConfig(**SMALL)),
    ("sac-overlap", SAC, "Pendulum-v1", SACConfig(**SMALL, overlap_updates=True)),
    ("td3-overlap-2-steps", TD3, "Pendulum-v1", TD3Config(**SMALL, overlap_updates=True, train_freq=2, gradient_steps=2)),
]


@pytest.mark.parametrize("name, cls, env, config", SMOKE, ids=[s[0] for s in SMOKE])
def test_smoke_every_agent_and_option(device, name, cls, env, config, tmp_path):
    """A few hundred steps: the captured updates record once and replay, the losses stay
    finite, the scalars reach TensorBoard, and the buffer holds every step."""
    agent = cls(env, config, seed=0, logdir=str(tmp_path), device=device)
    agent.learn(300)
    assert agent.num_timesteps == 300 and len(agent.buffer) == 300
    assert agent.buffer._obs.device == device
    losses = [v for k, v in agent._train_scalars.items() if k.endswith("loss")]
    assert losses and all(np.isfinite(losses)), agent._train_scalars
    acc = EventAccumulator(agent.log_path)
    acc.Reload()
    assert {"rollout/ep_rew_mean", "time/fps", "train/learning_rate"} <= set(acc.Tags()["scalars"])
    action, _ = agent.predict(agent.observation_space.sample())
    assert agent.action_space.contains(action if agent.discrete else np.asarray(action, np.float32))


@pytest.mark.requires_gpu
def test_an_agent_on_the_gpu_keeps_its_buffer_there_while_the_default_is_the_cpu():
    """Acting and learning switch to the agent's device and back; the buffer must not follow
    (a move per call would copy it and make every captured update record again)."""
    previous = rc.device("cpu")
    try:
        agent = SAC("Pendulum-v1", SACConfig(**SMALL), seed=0, device="gpu")
        agent.learn(200)
        agent.predict(np.zeros(3, np.float32))
        agent.learn(100)
        assert agent.buffer._obs.device == "gpu" and len(agent.buffer) == 300
        assert agent._acting_steps[True].traces == 1  # the loop's update (acting for the next step) traced once
    finally:
        rc.device(previous)


def test_sb3_tags_and_hyperparameters_of_sac_and_td3(tmp_path):
    for cls, config, tags in (
            (SAC, SACConfig(**SMALL), {"train/actor_loss", "train/critic_loss", "train/ent_coef",
                                        "train/ent_coef_loss"}),
            (TD3, TD3Config(**SMALL), {"train/actor_loss", "train/critic_loss"})):
        agent = cls("Pendulum-v1", config, seed=0, logdir=str(tmp_path))
        agent.learn(400)
        assert agent.log_path == str(tmp_path / f"{cls.algo}_1")
        acc = EventAccumulator(agent.log_path)
        acc.Reload()
        assert tags | {"rollout/ep_rew_mean", "rollout/ep_len_mean", "time/fps"} <= set(acc.Tags()["scalars"])
        assert [e.value for e in acc.Scalars("rollout/ep_len_mean")][-1] == 200  # Pendulum's 200-step episodes
    agent.learn(100)  # a second learn call opens the next run folder, as SB3 numbers them
    assert agent.log_path == str(tmp_path / "TD3_2")
    short = DQN("CartPole-v1", DQNConfig(**{**SMALL, "log_interval": 1000}, train_freq=4, gradient_steps=1),
                logdir=str(tmp_path))
    short.learn(250)
    acc = EventAccumulator(short.log_path)
    acc.Reload()  # a run shorter than log_interval still logs where it ended
    assert [e.step for e in acc.Scalars("time/fps")] == [250]


# ---- the losses against numpy ------------------------------------------------------------------

def _fixed_batch(n_obs, action, rng, batch, gamma):
    obs, next_obs = (np.asfortranarray(rng.standard_normal((n_obs, batch)), np.float32) for _ in range(2))
    reward = rng.standard_normal((1, batch)).astype(np.float32)
    done = (rng.random((1, batch)) < 0.3).astype(np.float32)
    samples = ReplaySamples(obs=rc.tensor(obs), action=rc.tensor(action), reward=rc.tensor(reward),
                            next_obs=rc.tensor(next_obs), done=rc.tensor(done),
                            discount=rc.tensor(np.full((1, batch), gamma, np.float32)), index=None)
    return samples, obs, next_obs, reward, done


def _run(net, x):
    with rc.no_grad():
        return net(rc.tensor(np.asfortranarray(x, np.float32))).numpy()


def test_td3_critic_loss_matches_numpy():
    """Without smoothing noise the TD3 target is deterministic: r + gamma (1 - d) min_i
    Q'_i(s', pi'(s')), and the loss sums each critic's mean squared error."""
    agent = TD3("Pendulum-v1", TD3Config(net_arch=(16,), target_policy_noise=0.0), seed=2)
    rng = np.random.default_rng(0)
    for net in (agent.actor_target, agent.critic_target):  # make the targets differ from the online nets
        net.load_state_dict({k: (v + 0.3 * rng.standard_normal(v.shape)).astype(np.float32)
                             for k, v in net.state_dict().items()})
    action = np.asfortranarray(rng.uniform(-1, 1, (1, 24)), np.float32)
    s, obs, next_obs, reward, done = _fixed_batch(3, action, rng, 24, agent.config.gamma)
    with rc.no_grad():
        loss = float(agent._critic_loss(s).numpy().ravel()[0])
    next_action = _run(agent.actor_target, next_obs)
    stacked = np.vstack([next_obs, next_action])
    next_q = np.minimum(_run(agent.critic_target.q0.net, stacked), _run(agent.critic_target.q1.net, stacked))
    target = reward + agent.config.gamma * (1 - done) * next_q
    current = [_run(q.net, np.vstack([obs, action])) for q in (agent.critic.q0, agent.critic.q1)]
    expected = sum(np.mean((q - target) ** 2) for q in current)
    assert loss == pytest.approx(expected, rel=1e-5)


def test_discrete_sac_losses_match_numpy():
    """The soft target takes the expectation over the policy: sum_a' pi(a'|s') (min Q'(s', a')
    - alpha log pi(a'|s')); the actor's loss is sum_a pi(a|s) (alpha log pi(a|s) - min Q(s, a))."""
    agent = DiscreteSAC("CartPole-v1", DiscreteSACConfig(net_arch=(16,), ent_coef=0.3), seed=3)
    rng = np.random.default_rng(1)
    agent.critic_target.load_state_dict({k: (v + 0.3 * rng.standard_normal(v.shape)).astype(np.float32)
                                         for k, v in agent.critic_target.state_dict().items()})
    action = rng.integers(0, 2, (1, 20)).astype(np.int32)
    s, obs, next_obs, reward, done = _fixed_batch(4, action, rng, 20, agent.config.gamma)
    alpha = 0.3
    with rc.no_grad():
        loss = float(agent._critic_loss(s, rc.full((1, 1), alpha)).numpy().ravel()[0])

    def policy(x):
        logits = _run(agent.actor, x)
        log_probs = logits - logits.max(0) - np.log(np.exp(logits - logits.max(0)).sum(0))
        return np.exp(log_probs), log_probs

    probs, log_probs = policy(next_obs)
    next_q = np.minimum(_run(agent.critic_target.q0, next_obs), _run(agent.critic_target.q1, next_obs))
    target = reward + agent.config.gamma * (1 - done) * np.sum(probs * (next_q - alpha * log_probs), axis=0)
    columns = np.arange(20)
    expected = sum(np.mean((_run(q, obs)[action[0], columns] - target[0]) ** 2)
                   for q in (agent.critic.q0, agent.critic.q1))
    assert loss == pytest.approx(expected, rel=1e-5)
    with rc.no_grad():  # the actor's loss, and the expected log pi the entropy coefficient's update reads
        actor_loss, expected_log_prob = agent._actor_loss(s, rc.full((1, 1), alpha))
    probs, log_probs = policy(obs)
    min_q = np.minimum(_run(agent.critic.q0, obs), _run(agent.critic.q1, obs))
    assert float(actor_loss.numpy().ravel()[0]) == pytest.approx(
        np.mean(np.sum(probs * (alpha * log_probs - min_q), axis=0)), rel=1e-5)
    np.testing.assert_allclose(expected_log_prob.numpy()[0], np.sum(probs * log_probs, axis=0), rtol=1e-5, atol=1e-6)


def test_squashed_gaussian_log_probability_matches_numpy():
    """log pi(a) = sum over action dims of log N(u; mu, std) - log(1 - tanh(u)^2), a = tanh(u),
    with the noise drawn again from the same seed; the saturated case stays finite."""
    agent = SAC("Pendulum-v1", SACConfig(net_arch=(16,)), seed=4)
    actor = agent.actor
    obs = np.asfortranarray(np.random.default_rng(2).standard_normal((3, 40)), np.float32)
    rc.manual_seed(9)
    eps = rc.randn((1, 40)).numpy()
    rc.manual_seed(9)
    with rc.no_grad():
        action, log_prob = (t.numpy() for t in actor.sample(rc.tensor(obs)))
        features = actor.trunk(rc.tensor(obs))
        mu, log_std = actor.mu(features).numpy(), np.clip(actor.log_std(features).numpy(), -20, 2)
    u = mu + np.exp(log_std) * eps
    expected = np.sum(-0.5 * eps ** 2 - log_std - 0.5 * np.log(2 * np.pi) - np.log(1 - np.tanh(u) ** 2), axis=0)
    np.testing.assert_allclose(action, np.tanh(u), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(log_prob[0], expected, rtol=1e-4, atol=1e-4)
    with rc.no_grad():  # far into tanh's saturation 1 - tanh(u)^2 rounds to 0; the log-probability does not
        huge = rc.tensor(np.full((3, 4), 1e4, np.float32))
        assert np.all(np.isfinite(actor.sample(huge)[1].numpy()))


def test_sac_entropy_coefficient_moves_toward_the_target_entropy():
    """A policy with far more entropy than the target lowers alpha; the update is captured."""
    agent = SAC("Pendulum-v1", SACConfig(**SMALL, target_entropy=-20.0), seed=5)
    agent.learn(400)
    assert agent._train_scalars["train/ent_coef"] < 0.9  # alpha starts at 1 and falls
    high = SAC("Pendulum-v1", SACConfig(**SMALL, target_entropy=5.0), seed=5)
    high.learn(400)
    assert high._train_scalars["train/ent_coef"] > 1.1  # an unreachable entropy raises it
    assert agent._acting_steps[True].traces == 1


# ---- save and load, seeding -----------------------------------------------------------------------

@pytest.mark.parametrize("cls, env, config", [
    (DDPG, "Pendulum-v1", DDPGConfig(**SMALL)), (TD3, "Pendulum-v1", TD3Config(**SMALL)),
    (SAC, "Pendulum-v1", SACConfig(**SMALL)), (DiscreteSAC, "CartPole-v1", DiscreteSACConfig(**SMALL))])
def test_saved_agent_acts_identically(cls, env, config, tmp_path):
    agent = cls(env, config, seed=1)
    agent.learn(300)
    path = str(tmp_path / "agent.safetensors")
    agent.save(path)
    loaded = cls.load(path)
    obs = np.stack([agent.observation_space.sample() for _ in range(30)]).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], agent.predict(obs, deterministic=True)[0])
    assert loaded.num_timesteps == 300 and loaded.config == agent.config
    with pytest.raises(ValueError, match=f"holds a '{cls.algo}' agent, not DQN"):
        DQN.load(path)


def test_a_callback_gets_a_step_event_per_vector_step_and_stops_training_by_returning_false(tmp_path):
    """A plain function callback: one StepEvent per vector-environment step, its fields the
    step's (actions in the environment's space, a row per lane); None goes on, False stops."""
    agent = DQN("CartPole-v1", DQNConfig(**SMALL, n_envs=2), seed=1, logdir=str(tmp_path))
    events = []

    def callback(event):
        events.append(event)
        return False if event.num_timesteps >= 40 else None

    agent.learn(1000, callback=callback)
    assert agent.num_timesteps == 40 and [e.num_timesteps for e in events] == list(range(2, 42, 2))
    last = events[-1]
    assert last.agent is agent and last.writer is not None and isinstance(last.episodes, EpisodeStats)
    assert last.actions.shape == (2,) and all(agent.action_space.contains(int(a)) for a in last.actions)
    assert last.rewards.shape == (2,) and last.new_obs.shape == (2, 4)
    assert last.terminated.dtype == bool and last.truncated.shape == (2,)
    np.testing.assert_array_equal(last.dones, last.terminated | last.truncated)
    with pytest.raises(dataclasses.FrozenInstanceError):
        last.num_timesteps = 0


def test_checkpoints_and_replay_buffer_resume_training(tmp_path):
    """CheckpointCallback saves the agent (and its buffer) every save_freq steps under SB3's
    names; an agent loaded from the last one, with its buffer, trains on from the saved
    transitions: its re-traced update samples the loaded buffer, not the empty one it was built with."""
    agent = SAC("Pendulum-v1", SACConfig(**SMALL), seed=6)
    callback = CheckpointCallback(200, str(tmp_path), name_prefix="sac", save_replay_buffer=True)
    agent.learn(450, callback=callback)
    assert callback.saved == [str(tmp_path / f"sac_{n}_steps.safetensors") for n in (200, 400)]
    loaded = SAC.load(callback.saved[-1])
    assert loaded.num_timesteps == 400 and len(loaded.buffer) == 0
    with pytest.raises(ValueError, match="sample_on_device: the buffer is empty"):
        loaded._train(1)  # traced against the empty buffer it was built with; the replay is refused
    loaded.load_replay_buffer(str(tmp_path / "sac_replay_buffer_400_steps"))
    assert len(loaded.buffer) == 400
    rc.manual_seed(0)
    stored = rc.full((1, 1), 400.0)
    drawn = loaded.buffer.sample_on_device(8, stored).obs.numpy()
    rc.manual_seed(0)
    saved = SAC("Pendulum-v1", SACConfig(**SMALL))
    saved.load_replay_buffer(str(tmp_path / "sac_replay_buffer_400_steps"))
    np.testing.assert_array_equal(saved.buffer.sample_on_device(8, stored).obs.numpy(), drawn)
    loaded.learn(100, reset_num_timesteps=False)  # SB3's way to resume: learning_starts is behind it
    assert len(loaded.buffer) == 500 and loaded._acting_steps[True].traces == 1
    loaded._train(1)
    assert loaded._steps[True].traces == 2  # traced anew for the loaded buffer
    with pytest.raises(ValueError, match="laid out as"):
        SAC("Pendulum-v1", SACConfig(**{**SMALL, "buffer_size": 1000})).load_replay_buffer(
            str(tmp_path / "sac_replay_buffer_400_steps"))


@pytest.mark.parametrize("cls, env, config", [
    (SAC, "Pendulum-v1", SACConfig(**SMALL)), (TD3, "Pendulum-v1", TD3Config(**SMALL)),
    (DiscreteSAC, "CartPole-v1", DiscreteSACConfig(**SMALL)),
    (SAC, "Pendulum-v1", SACConfig(**SMALL, overlap_updates=True))])
def test_the_same_seed_gives_the_same_run_twice(cls, env, config):
    weights = []
    for _ in range(2):
        agent = cls(env, config, seed=3)
        agent.learn(500)
        weights.append(agent.actor.state_dict())
    for name, value in weights[0].items():
        np.testing.assert_array_equal(weights[1][name], value, err_msg=name)


class CountingCalls:
    """A captured function that counts its calls."""

    def __init__(self, captured):
        self.captured, self.calls = captured, 0

    def __call__(self, **inputs):
        self.calls += 1
        return self.captured(**inputs)


@pytest.mark.parametrize("cls, config", [(TD3, TD3Config(**SMALL)), (DDPG, DDPGConfig(**SMALL))], ids=["td3", "ddpg"])
def test_the_actions_an_update_computes_are_the_updated_actors(device, cls, config):
    """A train round given the next observations computes the actor's actions for them after
    its last gradient step; the next _policy call on that very batch returns them, and they
    are what the updated actor computes on its own (the deterministic actor: equal bits)."""
    agent = cls("Pendulum-v1", config, seed=0, device=device)
    agent.learn(150)  # past learning_starts: the buffer has transitions to sample
    batch = np.random.default_rng(1).uniform(-1, 1, (1, 3)).astype(np.float32)
    with agent.on_device():
        for steps in (1, 2, 3):  # TD3's second step updates the actor (policy_delay 2)
            agent._train(steps, act_on=batch)
            kept = agent._policy(batch, deterministic=True)
            separate = agent._policy(batch.copy(), deterministic=True)  # another object: computed anew
            np.testing.assert_array_equal(kept, separate)
            assert kept.shape == (1, 1) and np.all(np.abs(kept) <= 1.0)
            assert agent._actions_ready is None  # taken once


@pytest.mark.parametrize("cls, config", [(SAC, SACConfig(**SMALL)), (TD3, TD3Config(**SMALL))], ids=["sac", "td3"])
def test_learning_acts_in_the_update_program_after_the_first_step(cls, config):
    """With a gradient step after every environment step, the policy's own program runs only
    for the first step past learning_starts of each learn call; every later action comes from
    the update program that ran just before it."""
    agent = cls("Pendulum-v1", config, seed=0)
    agent._policy(np.zeros((1, 3), np.float32), deterministic=cls is TD3)  # captures the policy
    counting = agent._acting[cls is TD3] = CountingCalls(agent._acting[cls is TD3])
    agent.learn(300)
    assert counting.calls == 1 and agent._acting_steps[True].traces == 1
    agent.learn(50, reset_num_timesteps=False)
    assert counting.calls == 2


@pytest.mark.parametrize("cls, config", [(TD3, TD3Config), (DDPG, DDPGConfig)], ids=["td3", "ddpg"])
def test_overlapped_updates_act_with_the_policy_before_each_round(device, cls, config):
    """overlap_updates: the action of each step after a round is the deterministic actor's as it
    was before that round (what predict gave in the callback before it), where SB3's order
    gives the updated actor's; both take the same gradient steps, and learn returns with the
    last round read (no launch left running, its steps counted)."""
    differences, steps = {}, {}
    for overlap in (False, True):
        agent = cls("Pendulum-v1", config(**SMALL, action_noise_std=0.0, overlap_updates=overlap), seed=0,
                    device=device)
        seen = []

        def record(event, seen=seen):
            seen.append((np.array(event.actions), event.agent.predict(event.new_obs, deterministic=True)[0]))

        agent.learn(200, callback=record)
        # step k + 1's action against the actor of the callback after step k (before round k)
        differences[overlap] = [np.abs(seen[k + 1][0] - seen[k][1]).max() for k in range(SMALL["learning_starts"], 199)]
        assert agent._pending_round is None
        steps[overlap] = agent.critic_optimizer.state[id(next(iter(agent.critic.parameters().values())))]["step"]
    assert max(differences[True]) == 0.0
    assert max(differences[False]) > 1e-4  # the test can tell the two orders apart
    assert steps[True] == steps[False] == 200 - SMALL["learning_starts"]


class ActionLog(gym.Wrapper):
    """Keeps every action the environment was given."""

    def __init__(self, env):
        super().__init__(env)
        self.actions = []

    def step(self, action):
        self.actions.append(np.array(action))
        return self.env.step(action)


@pytest.mark.parametrize("cls, config", [(TD3, TD3Config(**SMALL, action_noise_std=0.0, overlap_updates=True)),
                                         (SAC, SACConfig(**SMALL, overlap_updates=True))], ids=["td3", "sac"])
def test_overlapped_rounds_left_running_give_the_actions_of_rounds_read_at_each_step(device, cls, config):
    """overlap_updates without a callback: each step's actions are launched while the round
    before runs, and the next round is queued before they are read (SAC's, before the round
    before is read: on its update's twin). The environment gets the
    actions of a run whose callback reads every round before the next step's actions (whose
    actions are the actor's before each round: the test above): a round queued ahead of the
    actions it follows, or running into them, would change them."""
    actions = {}
    for callback in (None, lambda event: None):
        env = ActionLog(gym.make("Pendulum-v1"))
        agent = cls(env, config, seed=0, device=device)
        agent.learn(200, callback=callback)
        actions[callback is None] = np.array(env.actions)
        if callback is None and cls is SAC:  # one variant: each round launched while the one before ran, alternately
            assert agent._overlap_twins[True].traces == 1 and agent._overlap_steps[True].traces == 1
    assert actions[True].shape == (200, 1)
    np.testing.assert_array_equal(actions[True], actions[False])


def test_a_round_that_fails_under_overlap_updates_leaves_the_policy_usable(device):
    """overlap_updates launches a step's actions before its round: where launching the round
    raises, the error reaches the caller and the actions launched are still read, so that the
    policy runs again (predict) instead of refusing to while a launch is unread."""
    agent = SAC("Pendulum-v1", SACConfig(**SMALL, overlap_updates=True), seed=0, device=device)
    agent.learn(150)

    def failing_round():
        raise RuntimeError("the round failed")

    agent._next_variant = failing_round
    with pytest.raises(RuntimeError, match="^the round failed$"):
        agent.learn(10, reset_num_timesteps=False)
    del agent._next_variant
    actions, _ = agent.predict(np.zeros((1, 3), np.float32), deterministic=False)
    assert actions.shape == (1, 1) and np.all(np.abs(actions) <= 2.0)


def test_overlap_updates_is_refused_where_an_agent_acts_apart_from_its_updates():
    with pytest.raises(ValueError, match="^DQN: overlap_updates is for the agents that act in their updates"):
        DQN("CartPole-v1", DQNConfig(**SMALL, overlap_updates=True))
    with pytest.raises(ValueError, match="^SACConfig: overlap_updates must be True or False, got 1$"):
        SACConfig(overlap_updates=1)


# ---- environments -----------------------------------------------------------------------------------

def test_vector_environment_lanes_keep_final_observations():
    """Four CartPoles cut at 7 steps: every truncated lane's stored next observation is the
    episode's last one (not the next episode's first), as the same envs stepped alone show."""
    def make():
        return gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, 7)

    vector = gym.vector.SyncVectorEnv([make] * 4, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    lanes = EnvLanes(vector, seed=11)
    singles = [make() for _ in range(4)]
    obs = lanes.reset()
    for i, env in enumerate(singles):
        np.testing.assert_array_equal(env.reset(seed=11 + i)[0], obs[i])
    for step in range(20):
        actions = np.array([(step + i) % 2 for i in range(4)])
        next_obs, _, terminated, truncated, true_next = lanes.step(actions)
        for i, env in enumerate(singles):
            expected, _, term, trunc, _ = env.step(actions[i])
            np.testing.assert_array_equal(true_next[i], expected)
            assert (term, trunc) == (terminated[i], truncated[i])
            if term or trunc:
                np.testing.assert_array_equal(next_obs[i], env.reset()[0])
                assert not np.array_equal(next_obs[i], true_next[i])


def test_agent_on_a_vector_environment(tmp_path):
    config = DQNConfig(**SMALL, train_freq=2, gradient_steps=1, n_envs=4)
    agent = DQN("CartPole-v1", config, seed=0, logdir=str(tmp_path))
    agent.learn(400)
    assert agent.lanes.n == 4 and agent.num_timesteps == 400 and len(agent.buffer) == 400
    with pytest.raises(ValueError, match="needs an environment id"):
        DQN(gym.make("CartPole-v1"), config)


def test_box_actions_are_rescaled_to_the_space():
    env = gym.wrappers.RescaleAction(gym.make("Pendulum-v1"), np.float32(0.0), np.float32(4.0))
    agent = SAC(env, SACConfig(net_arch=(8,)), seed=0)
    np.testing.assert_allclose(agent._to_env_action(np.array([[-1.0], [0.0], [1.0], [3.0]])).ravel(),
                               [0.0, 2.0, 4.0, 4.0])
    for _ in range(20):
        assert 0.0 <= agent.predict(env.observation_space.sample(), deterministic=False)[0] <= 4.0


def test_bad_input():
    with pytest.raises(ValueError, match="bounded Box action space"):
        SAC("CartPole-v1")
    with pytest.raises(ValueError, match="bounded Box action space"):
        TD3("CartPole-v1")
    with pytest.raises(ValueError, match="Discrete action space"):
        DiscreteSAC("Pendulum-v1")
    with pytest.raises(TypeError, match="config must be a SACConfig"):
        SAC("Pendulum-v1", TD3Config())
    with pytest.raises(ValueError, match="ent_coef must be"):
        SACConfig(ent_coef="autox")
    with pytest.raises(ValueError, match="ent_coef must be"):
        SACConfig(ent_coef=-1.0)
    with pytest.raises(ValueError, match="target_entropy must be"):
        SACConfig(target_entropy=float("nan"))
    with pytest.raises(ValueError, match="policy_delay must be a positive int"):
        TD3Config(policy_delay=0)
    with pytest.raises(ValueError, match="learning_rate must be a positive number"):
        DDPGConfig(learning_rate=0.0)
    with pytest.raises(ValueError, match="target_entropy_scale must lie"):
        DiscreteSACConfig(target_entropy_scale=1.5)
    with pytest.raises(ValueError, match="n_steps must be a positive int"):
        DQNConfig(n_steps=0)
    with pytest.raises(ValueError, match="DQNConfig: features_extractor_kwargs must be a dict of keyword arguments"):
        DQNConfig(features_extractor_kwargs=[("features_dim", 8)])
    with pytest.raises(ValueError, match="SACConfig: replay_buffer_kwargs must be a dict of keyword arguments"):
        SACConfig(replay_buffer_class="HerReplayBuffer", replay_buffer_kwargs={1: 2})
    with pytest.raises(ValueError, match="do not match the observation space"):
        SAC("Pendulum-v1", SACConfig(net_arch=(8,))).predict(np.zeros(5))
    assert sorted(ALGOS) == ["ddpg", "discrete_sac", "dqn", "recurrent_dqn", "recurrent_sac", "sac", "td3"]


@pytest.mark.parametrize("cls", list(ALGOS.values()), ids=list(ALGOS))
def test_every_config_is_an_off_policy_config_checked_by_the_base(cls):
    """Each agent's config subclasses OffPolicyConfig: the shared fields first, in its order,
    and checked by its __post_init__ under the subclass's name."""
    shared = [f.name for f in dataclasses.fields(OffPolicyConfig)]
    assert issubclass(cls.config_class, OffPolicyConfig)
    assert [f.name for f in dataclasses.fields(cls.config_class)][:len(shared)] == shared
    with pytest.raises(ValueError, match=f"^{cls.config_class.__name__}: batch_size must be a positive int, got 0$"):
        cls.config_class(batch_size=0)


# ---- NaN from the environment ---------------------------------------------------------------------

class NanAfter(gym.Wrapper):
    """Returns a NaN in its observation (or as its reward) from its ``after``-th step on."""

    def __init__(self, env, after: int, what: str = "observation"):
        super().__init__(env)
        self.after, self.what, self.steps = after, what, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.steps >= self.after:
            if self.what == "observation":
                obs = obs.copy()
                obs[2] = np.nan
            else:
                reward = float("nan")
        return obs, reward, terminated, truncated, info


def test_episode_statistics_of_steps_counted_in_runs_equal_those_counted_step_by_step():
    """extend of runs of steps (1 to 40 long, episodes ending inside, at the ends of and across
    runs, several in one lane) keeps the same returns, to the bit, and lengths as step."""
    rng = np.random.default_rng(3)
    rewards = rng.standard_normal((120, 3)).astype(np.float32) * 10  # [steps, lanes]
    dones = rng.random((120, 3)) < 0.08
    dones[39, :] = True  # every lane ends at the end of a run
    one_by_one, in_runs = EpisodeStats(3), EpisodeStats(3)
    for reward, done in zip(rewards, dones):
        one_by_one.step(reward, done)
    start = 0
    for length in (1, 38, 1, 40, 7, 1, 32):
        in_runs.extend(rewards[start:start + length], dones[start:start + length])
        start += length
    assert list(in_runs.returns) == list(one_by_one.returns) and list(in_runs.lengths) == list(one_by_one.lengths)
    np.testing.assert_array_equal(in_runs.current_return, one_by_one.current_return)
    np.testing.assert_array_equal(in_runs.current_length, one_by_one.current_length)
    assert len(one_by_one.returns) > 20
    in_runs.extend(rewards[:0], dones[:0])  # no steps: nothing changes
    assert len(in_runs.returns) == len(one_by_one.returns)
    np.testing.assert_array_equal(in_runs.current_return, one_by_one.current_return)


def test_a_callback_that_resets_the_environment_while_learn_runs_leaves_it_running():
    """set_env from a callback begins the episode statistics anew; the steps after it are
    counted in the new ones (as the loop's kept steps are stored before any callback runs)."""
    agent = DQN("CartPole-v1", DQNConfig(**SMALL, train_freq=8, gradient_steps=1), seed=0)

    def callback(event):
        if event.num_timesteps == 150:
            agent.set_env(gym.make("CartPole-v1"))

    agent.learn(300, callback=callback)
    assert agent.num_timesteps == 300 and len(agent.buffer) == 300
    assert sum(agent._episode_stats.lengths) + agent._episode_stats.current_length[0] == 150


class Transcript(gym.Wrapper):
    """Keeps every transition the environment gives: (obs, action, reward, next obs, terminated)."""

    def reset(self, **kwargs):
        self.last, info = self.env.reset(**kwargs)
        return self.last, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps.append((self.last, int(action), reward, obs, terminated))
        self.last = obs
        return obs, reward, terminated, truncated, info


def test_the_steps_a_learn_call_takes_are_stored_and_counted_in_order():
    """The loop keeps its steps until a round of gradient steps (every 64th step here) or the
    end of learn reads them: the buffer then holds every transition the environment gave, in
    order, and the episode statistics every finished episode's return."""
    env = Transcript(gym.make("CartPole-v1"))
    env.steps = []
    agent = DQN(env, DQNConfig(**SMALL, train_freq=64, gradient_steps=1), seed=0)
    agent.learn(300)
    assert len(agent.buffer) == 300
    every = np.arange(300, dtype=np.int32)[None, :]
    stored = [rc.get_rows(table, every).numpy() for table in
              (agent.buffer._obs, agent.buffer._action, agent.buffer._reward_row, agent.buffer._next_obs,
               agent.buffer._terminated_row)]
    for i, given in enumerate(zip(*env.steps)):
        np.testing.assert_array_equal(stored[i], np.array(given, np.float32).reshape(300, -1).T)
    returns, episode = [], 0.0
    for _, _, reward, _, terminated in env.steps:
        episode += reward
        if terminated:
            returns.append(episode)
            episode = 0.0
    assert list(agent._episode_stats.returns) == returns and len(returns) > 5


def test_learn_raises_at_the_first_non_finite_observation_naming_the_timestep_and_lane():
    agent = DQN(NanAfter(gym.make("CartPole-v1"), 50), DQNConfig(**SMALL), seed=0)
    with pytest.raises(ValueError, match=r"non-finite observation at timestep 50, lane 0 \(element 2 is nan\)"):
        agent.learn(200)
    assert agent.num_timesteps == 49 and len(agent.buffer) == 49  # the step never reached the buffer
    with pytest.raises(ValueError, match="check_finite must be one of"):
        agent.learn(10, check_finite="ignore")


@pytest.mark.parametrize("shape", [(1, 4), (3,), (2, 40)], ids=["one-lane", "rewards", "over-64"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_finite_check_finds_each_kind_of_non_finite_value(shape, dtype, bad):
    """learn's check of what the environment returns, on small arrays (checked as Python floats)
    and larger ones (numpy's isfinite): NaN and either infinity are found, at their lane and
    element; finite arrays, integer ones included, pass."""
    from rlkit.agents.base import FiniteCheck

    check = FiniteCheck("dqn", "raise")
    values = np.arange(np.prod(shape), dtype=dtype).reshape(shape)
    check(7, "observation", values)
    check(7, "observation", np.full(shape, 3, np.int64))
    values.flat[values.size - 2] = bad
    lane = (values.size - 2) // (values.size // shape[0])
    with pytest.raises(ValueError, match=rf"non-finite observation at timestep 7, lane {lane} "):
        check(7, "observation", values)


def test_learn_raises_at_a_non_finite_reward_of_one_lane_of_a_vector_environment():
    def make(after):
        return lambda: NanAfter(gym.make("CartPole-v1"), after, what="reward")

    vector = gym.vector.SyncVectorEnv([make(10**9), make(30)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    agent = DQN(vector, DQNConfig(**SMALL, n_envs=2), seed=0)
    with pytest.raises(ValueError, match=r"non-finite reward at timestep 60, lane 1 \(it is nan\)"):
        agent.learn(200)


def _scalars(logdir, tag):
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    return [event.value for event in acc.Scalars(tag)]


def test_learn_only_warns_when_asked_and_logs_nan_losses_and_skipped_updates(device, tmp_path):
    """With check_finite="warn", one warning; the updates that sample the NaN steps skip
    themselves, are counted, and train/loss reaches TensorBoard as NaN."""
    config = DQNConfig(**SMALL, train_freq=4, gradient_steps=1)
    agent = DQN(NanAfter(gym.make("CartPole-v1"), 250), config, seed=0, logdir=str(tmp_path), device=device)
    with pytest.warns(RuntimeWarning, match="non-finite observation at timestep 250, lane 0") as caught:
        agent.learn(500, check_finite="warn")
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    assert 0 < agent.skipped_updates <= (500 - 250) // 4 + 1
    losses = _scalars(agent.log_path, "train/loss")
    assert np.isfinite(losses[0]) and np.isnan(losses[-1])
    skipped = _scalars(agent.log_path, "train/skipped_updates")
    assert skipped[0] == 0 and skipped[-1] == agent.skipped_updates


@pytest.mark.parametrize("cls, config", [(SAC, SACConfig(**SMALL)), (TD3, TD3Config(**SMALL))], ids=["sac", "td3"])
def test_captured_updates_count_the_updates_they_skip(cls, config):
    """A NaN reward makes the critic's target NaN: each critic update that samples it skips
    itself (its gradient norm is not finite); none does before."""
    agent = cls(NanAfter(gym.make("Pendulum-v1"), 200, what="reward"), config, seed=0)
    agent.learn(199)
    assert agent.skipped_updates == 0
    with pytest.warns(RuntimeWarning, match="non-finite reward at timestep 200"):
        agent.learn(101, check_finite="warn", reset_num_timesteps=False)
    assert 0 < agent.skipped_updates <= 101  # the critic's updates: the actor's read no reward


def test_predict_refuses_a_non_finite_observation_whose_q_values_are_nan(device):
    agent = DQN("CartPole-v1", DQNConfig(net_arch=(16, 16)), seed=0, device=device)
    nan = np.full(4, np.nan, np.float32)
    with agent.on_device():
        q = agent.q(rc.tensor(nan[:, None])).numpy()
    assert np.all(np.isnan(q))  # were finite: the fused relu layers turned NaN into 0
    with pytest.raises(ValueError, match="DQN.predict: observation 0 holds NaN or an infinity"):
        agent.predict(nan)
    with pytest.raises(ValueError, match="observation 1 holds NaN"):
        agent.predict(np.stack([np.zeros(4, np.float32), np.array([0, np.inf, 0, 0], np.float32)]))


# ---- learning gates (fixed seeds, CPU) ----------------------------------------------------------------

RANDOM_PENDULUM = -1200.0  # about what uniform random actions score over 200 steps
RANDOM_CARTPOLE = 22.0


@pytest.mark.slow
@pytest.mark.parametrize("cls", [SAC, TD3])
def test_learning_gate_pendulum(cls):
    """At least -200 within 20k steps, RL Zoo's settings (the config defaults), seed 0."""
    agent = cls("Pendulum-v1", seed=0)
    agent.learn(20_000)
    mean, _ = evaluate(agent, "Pendulum-v1", 10, seed=100)
    assert mean >= -200, mean


@pytest.mark.slow
def test_learning_gate_pendulum_sac_overlapping_its_updates():
    """overlap_updates (acting one round behind) learns as SB3's order does: at least -200
    within 20k steps, RL Zoo's settings otherwise, seed 0."""
    agent = SAC("Pendulum-v1", SACConfig(overlap_updates=True), seed=0)
    agent.learn(20_000)
    mean, _ = evaluate(agent, "Pendulum-v1", 10, seed=100)
    assert mean >= -200, mean


@pytest.mark.slow
def test_learning_gate_ddpg_pendulum():
    """Far above random within 6k steps (random actions score about -1200)."""
    agent = DDPG("Pendulum-v1", DDPGConfig(learning_starts=1000, net_arch=(64, 64)), seed=0)
    agent.learn(6000)
    mean, _ = evaluate(agent, "Pendulum-v1", 10, seed=100)
    assert mean >= RANDOM_PENDULUM + 700, mean


@pytest.mark.slow
def test_learning_gate_discrete_sac_cartpole():
    """Far above random within 10k steps (random actions last about 22 steps)."""
    agent = DiscreteSAC("CartPole-v1", seed=0)
    agent.learn(10_000)
    mean, _ = evaluate(agent, "CartPole-v1", 10, seed=100)
    assert mean >= 10 * RANDOM_CARTPOLE, mean
