"""ReplayBuffer: ring wrap, terminated vs truncated, n-step returns at both kinds of episode end
(the host's against a reference written out here, the device's against the host's, the
buffer's definition), next-observation sharing that keeps the true final observation of
truncated episodes, sequences, priorities, sampling on the device, the host staging of new
steps and extend, and bad input, on both backends (saves: tests/test_replay_files.py)."""

import numpy as np
import pytest

import rlkit.core as rc
from conftest import AVAILABLE_DEVICES
from rlkit.buffers import ReplayBuffer
from rlkit.buffers.replay_sequences import SequenceSamples


def _rollout(buffers, steps, n_envs, seed=0):
    """Feeds the same synthetic episodes to every buffer; returns the per-lane history
    (obs, reward, next_obs, terminated, truncated) for reference computations."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n_envs, 3)).astype(np.float32)
    history = []
    for _ in range(steps):
        action = rng.standard_normal((n_envs, 2)).astype(np.float32)
        reward = rng.standard_normal(n_envs).astype(np.float32)
        next_obs = rng.standard_normal((n_envs, 3)).astype(np.float32)  # the true next observation
        terminated = rng.random(n_envs) < 0.15
        truncated = ~terminated & (rng.random(n_envs) < 0.15)
        for buf in buffers:
            buf.add(obs, action, reward, next_obs, terminated, truncated)
        history.append((obs, action, reward, next_obs, terminated, truncated))
        reset = rng.standard_normal((n_envs, 3)).astype(np.float32)
        obs = np.where((terminated | truncated)[:, None], reset, next_obs)
    return history


def _reference(history, t, e, n, gamma):
    """n-step return, done, discount and bootstrap observation for step t of lane e."""
    ret, discount = 0.0, 1.0
    for k in range(n):
        if t + k >= len(history):
            break
        _, _, reward, next_obs, terminated, truncated = history[t + k]
        ret += discount * float(reward[e])
        discount *= gamma
        last_next = next_obs[e]
        if terminated[e]:
            return ret, 1.0, discount, last_next
        if truncated[e]:
            break
    return ret, 0.0, discount, last_next


@pytest.mark.parametrize("n_step", [1, 3])
def test_samples_match_the_reference(device, n_step):
    steps, n_envs, gamma = 30, 3, 0.9
    buf = ReplayBuffer(200, 3, 2, n_envs=n_envs, seed=1, n_step=n_step, gamma=gamma)
    history = _rollout([buf], steps, n_envs)
    batch = buf.sample(64)
    assert batch.obs.device == device and batch.obs.shape == (3, 64)
    obs, action, reward = batch.obs.numpy(), batch.action.numpy(), batch.reward.numpy()
    next_obs, done, discount = batch.next_obs.numpy(), batch.done.numpy(), batch.discount.numpy()
    for j, column in enumerate(batch.index):
        t, e = divmod(int(column), n_envs)
        np.testing.assert_array_equal(obs[:, j], history[t][0][e])
        np.testing.assert_array_equal(action[:, j], history[t][1][e])
        ret, d, disc, boot = _reference(history, t, e, n_step, gamma)
        assert reward[0, j] == pytest.approx(ret, rel=1e-5, abs=1e-6)
        assert done[0, j] == d and discount[0, j] == pytest.approx(disc, rel=1e-6)
        np.testing.assert_array_equal(next_obs[:, j], boot)


def test_n_step_one_equals_the_plain_transition(device):
    plain = ReplayBuffer(100, 3, 2, n_envs=2, seed=7)
    one = ReplayBuffer(100, 3, 2, n_envs=2, seed=7, n_step=1, gamma=0.5)
    history = _rollout([plain, one], 20, 2)
    a, b = plain.sample(40), one.sample(40)
    np.testing.assert_array_equal(a.index, b.index)
    for field in ("obs", "action", "reward", "next_obs", "done"):
        np.testing.assert_array_equal(getattr(a, field).numpy(), getattr(b, field).numpy())
    for j, column in enumerate(a.index):
        t, e = divmod(int(column), 2)
        assert a.done.numpy()[0, j] == float(history[t][4][e])  # terminated only, never truncated


def test_the_ring_wraps(device):
    buf = ReplayBuffer(8, 3, 2, n_envs=2, seed=0)  # 4 steps per lane
    history = _rollout([buf], 6, 2)
    assert len(buf) == 8 and buf.full
    batch = buf.sample(100)
    kept = {tuple(history[t][0][e]) for t in range(2, 6) for e in range(2)}
    assert {tuple(c) for c in batch.obs.numpy().T} <= kept  # steps 0 and 1 were overwritten


@pytest.mark.parametrize("n_step", [1, 3])
def test_shared_next_observations_keep_truncated_final_observations(device, n_step):
    plain = ReplayBuffer(60, 3, 2, n_envs=2, seed=3, n_step=n_step)
    shared = ReplayBuffer(60, 3, 2, n_envs=2, seed=3, n_step=n_step, optimize_memory=True)
    history = _rollout([plain, shared], 45, 2, seed=4)  # wraps the 30-step lanes
    assert any(h[5].any() for h in history)  # there are truncations to get right
    newest = (shared.pos - 1) % shared.lane_length
    t, e = np.meshgrid(np.arange(shared.lane_length), np.arange(2), indexing="ij")
    # windows that stop short of the newest step (whose successor the shared buffer lacks)
    keep = (newest - t.ravel()) % shared.lane_length >= n_step
    t, e = t.ravel()[keep], e.ravel()[keep]
    a, b = plain._gather(t, e), shared._gather(t, e)
    for field in ("obs", "action", "reward", "done", "discount"):
        np.testing.assert_array_equal(getattr(b, field).numpy(), getattr(a, field).numpy(), err_msg=field)
    # the bootstrap observation matters where the episode did not terminate: there it must be
    # the true next observation, the final one of a truncated episode included
    live = a.done.numpy()[0] == 0
    np.testing.assert_array_equal(b.next_obs.numpy()[:, live], a.next_obs.numpy()[:, live])
    for _ in range(20):
        assert not np.any(shared.sample(16).index // 2 == newest)  # its successor is not stored yet


@pytest.mark.parametrize("optimize_memory", [False, True])
def test_truncate_episodes_ends_the_running_episodes_where_they_stand(device, optimize_memory):
    """After truncate_episodes the lanes' newest steps count as truncated: n-step sums stop
    there and bootstrap from their true next observations, not from the next episode's first."""
    n, gamma = 3, 0.9
    buf = ReplayBuffer(60, 3, 2, n_envs=2, seed=3, n_step=n, gamma=gamma, optimize_memory=optimize_memory,
                       device=device)
    history = _rollout([buf], 12, 2, seed=1)
    running = ~(history[-1][4] | history[-1][5])
    buf.truncate_episodes()
    history[-1] = (*history[-1][:5], history[-1][5] | running)
    history += _rollout([buf], 10, 2, seed=2)  # new episodes' first observations
    assert running.any() and len(history) < buf.lane_length  # no wrap: ring step t is history step t
    t, e = np.meshgrid(np.arange(len(history) - n), np.arange(2), indexing="ij")
    t, e = t.ravel(), e.ravel()
    got = buf._gather(t, e)
    reward, done, discount = (getattr(got, f).numpy()[0] for f in ("reward", "done", "discount"))
    next_obs = got.next_obs.numpy()
    for j in range(len(t)):
        ret, d, disc, boot = _reference(history, t[j], e[j], n, gamma)
        assert reward[j] == pytest.approx(ret, rel=1e-5, abs=1e-6) and done[j] == d
        assert discount[j] == pytest.approx(disc, rel=1e-6)
        if not d:  # the bootstrap observation matters (a shared table holds the next episode's there)
            np.testing.assert_array_equal(next_obs[:, j], boot)


def test_bad_input():
    buf = ReplayBuffer(10, (2, 2), 1, n_envs=2)
    good = dict(obs=np.zeros((2, 2, 2)), action=np.zeros((2, 1)), reward=np.zeros(2), next_obs=np.zeros((2, 2, 2)),
                terminated=np.zeros(2), truncated=np.zeros(2))
    with pytest.raises(ValueError, match="the buffer holds no transition"):
        buf.sample(4)
    with pytest.raises(ValueError, match=r"obs has shape \(2, 4\), expected \(2, 2, 2\)"):
        buf.add(**{**good, "obs": np.zeros((2, 4))})
    with pytest.raises(ValueError, match="reward has shape"):
        buf.add(**{**good, "reward": np.zeros(3)})
    with pytest.raises(ValueError, match="n_envs=2"):
        buf.add(**{**good, "action": np.zeros((1, 1))})
    buf.add(**good)
    with pytest.raises(ValueError, match="batch_size"):
        buf.sample(0)
    for kwargs, message in ((dict(capacity=0), "capacity"), (dict(n_envs=0), "n_envs"), (dict(n_step=0), "n_step"),
                            (dict(gamma=1.5), "gamma"), (dict(obs_shape=(0,)), "obs_shape"),
                            (dict(capacity=3, n_envs=2), "fewer than 2 steps")):
        args = {"capacity": 10, "obs_shape": 2, "action_shape": 1, **kwargs}
        with pytest.raises(ValueError, match=message):
            ReplayBuffer(**args)


# ---- sequences ---------------------------------------------------------------------------------

def _check_windows(seq, history, n_envs, burn_in, length, batch, first_stored, last_step):
    """Every window is consecutive steps of one lane between the oldest stored step and the
    newest, masked from the step after its episode's end, with each step's true next obs."""
    window = burn_in + length
    assert seq.obs.shape == (3, window, batch) and seq.mask.shape == (1, window, batch)
    assert seq.next_obs.shape == (3, window, batch) and seq.terminated.shape == (1, window, batch)
    obs, mask, reward = seq.obs.numpy(), seq.mask.numpy()[0], seq.reward.numpy()[0]
    next_obs, terminated = seq.next_obs.numpy(), seq.terminated.numpy()[0]
    stored = {tuple(history[t][0][e]): (t, e) for t in range(first_stored, last_step) for e in range(n_envs)}
    starts = set()
    for b in range(batch):
        t0, e = stored[tuple(obs[:, 0, b])]
        starts.add((t0, e))
        assert t0 + window <= last_step  # never past the newest step
        alive = True
        for k in range(window):
            np.testing.assert_array_equal(obs[:, k, b], history[t0 + k][0][e])  # one lane, consecutive steps
            np.testing.assert_array_equal(next_obs[:, k, b], history[t0 + k][3][e])
            assert reward[k, b] == history[t0 + k][2][e]
            assert terminated[k, b] == float(history[t0 + k][4][e])
            assert mask[k, b] == float(alive)
            alive = alive and not (history[t0 + k][4][e] or history[t0 + k][5][e])
    return starts


def test_sequences_are_consecutive_and_masked_after_episode_ends(device):
    n_envs = 2
    buf = ReplayBuffer(40, 3, 2, n_envs=n_envs, seed=5)
    history = _rollout([buf], 28, n_envs, seed=6)  # wraps the 20-step lanes
    seq = buf.sample_sequences(32, 4, burn_in=2)
    _check_windows(seq, history, n_envs, 2, 4, 32, first_stored=8, last_step=28)


@pytest.mark.parametrize("wrapped", [False, True])
def test_sequences_sampled_on_the_device_in_a_captured_function(device, wrapped):
    """The device sampler inside a capture: each replay reads where the ring stands through
    its ``starts`` input, draws fresh windows, and covers every valid start and lane."""
    n_envs, burn_in, length, batch = 2, 2, 4, 256
    buf = ReplayBuffer(40, 3, 2, n_envs=n_envs, seed=5)
    rc.manual_seed(3)
    steps = 28 if wrapped else 14
    history = _rollout([buf], steps, n_envs, seed=6)

    def fields(starts):
        seq = buf.sample_sequences_on_device(batch, length, burn_in, starts)
        return seq.obs, seq.action, seq.reward, seq.terminated, seq.mask, seq.next_obs

    sample = rc.capture(fields, [buf._obs])
    seen = set()
    for _ in range(2):
        obs, action, reward, terminated, mask, next_obs = sample(starts=buf.sequence_starts())
        seq = SequenceSamples(*(rc.tensor(a) for a in (obs, action, reward, terminated, mask)), burn_in,
                              rc.tensor(next_obs))
        seen |= _check_windows(seq, history, n_envs, burn_in, length, batch,
                               first_stored=max(0, steps - 20), last_step=steps)
    valid_starts = min(steps, 20) - (burn_in + length) + 1
    assert len(seen) == valid_starts * n_envs  # every start of every lane drawn: uniform over all of them
    if not wrapped:  # the same program, replayed after more steps, reads the new ring position
        history += _rollout([buf], 14, n_envs, seed=7)
        obs = sample(starts=buf.sequence_starts())[0]
        stored = {tuple(history[t][0][e]) for t in range(8, 28) for e in range(n_envs)}
        assert all(tuple(obs[:, 0, b]) in stored for b in range(batch))
        assert sample.traces == 1


def test_sequence_errors():
    buf = ReplayBuffer(10, 1, 1, seed=0)
    buf.add(np.zeros((1, 1)), np.zeros((1, 1)), [0.0], np.zeros((1, 1)), [False], [False])
    with pytest.raises(ValueError, match="needs that many stored steps"):
        buf.sample_sequences(2, 3)
    with pytest.raises(ValueError, match="length must be an int >= 1"):
        buf.sample_sequences(2, 0)
    with pytest.raises(ValueError, match="burn_in must be an int >= 0"):
        buf.sample_sequences(2, 1, burn_in=-1)
    with pytest.raises(ValueError, match="needs that many stored steps"):
        buf.sample_sequences_on_device(2, 3)
    with pytest.raises(ValueError, match="longer than the 10 steps a lane holds"):
        buf.sample_sequences_on_device(2, 8, burn_in=3)
    with pytest.raises(ValueError, match="sample_sequences_on_device: batch_size must be an int >= 1, got 0"):
        buf.sample_sequences_on_device(0, 1)
    with pytest.raises(ValueError, match="sample_sequences_on_device: length must be an int >= 1, got 1.5"):
        buf.sample_sequences_on_device(2, 1.5)
    with pytest.raises(ValueError, match="sample_sequences_on_device: not with optimize_memory"):
        ReplayBuffer(10, 1, 1, optimize_memory=True).sample_sequences_on_device(2, 1)


# ---- prioritized -------------------------------------------------------------------------------

def test_prioritized_sampling_follows_priorities(device):
    from rlkit.buffers import PrioritizedReplayBuffer

    buf = PrioritizedReplayBuffer(8, 1, 1, alpha=0.7, beta=0.5, eps=0.0, seed=0)
    for t in range(8):
        buf.add(np.full((1, 1), t), np.zeros((1, 1)), [0.0], np.zeros((1, 1)), [False], [False])
    priorities = np.array([1.0, 2.0, 0.5, 4.0, 1.0, 3.0, 0.25, 2.0])
    buf.update_priorities(np.arange(8), priorities)
    expected = priorities**0.7 / np.sum(priorities**0.7)
    counts = np.zeros(8)
    for _ in range(300):
        s = buf.sample(64)
        counts += np.bincount(s.index, minlength=8)
    n = counts.sum()
    assert np.all(np.abs(counts / n - expected) < 4 * np.sqrt(expected * (1 - expected) / n))
    s = buf.sample(64)
    w = (8 * expected[s.index]) ** -0.5
    np.testing.assert_allclose(s.weights.numpy()[0], w / w.max(), rtol=1e-5)
    np.testing.assert_array_equal(s.obs.numpy()[0], s.index)  # the sampled columns' data


def test_prioritized_new_transitions_get_the_largest_priority_and_bad_updates_fail():
    from rlkit.buffers import PrioritizedReplayBuffer

    buf = PrioritizedReplayBuffer(4, 1, 1, alpha=1.0, seed=0)
    for t in range(3):
        buf.add(np.zeros((1, 1)), np.zeros((1, 1)), [0.0], np.zeros((1, 1)), [False], [False])
    buf.update_priorities([0, 1, 2], [5.0, 1.0, 1.0])
    buf.add(np.zeros((1, 1)), np.zeros((1, 1)), [0.0], np.zeros((1, 1)), [False], [False])
    assert buf._tree.leaves(np.array([3]))[0] == pytest.approx(5.0 + 1e-6)
    with pytest.raises(ValueError, match="2 indices but 1 priorities"):
        buf.update_priorities([0, 1], [1.0])
    with pytest.raises(IndexError, match=r"^update_priorities: index 9 at position 1 is out of range for 4 columns "
                                         r"\(valid: 0..3\)$"):
        buf.update_priorities([0, 9], [1.0, 1.0])
    with pytest.raises(TypeError, match="index must be an integer array, got float64"):
        buf.update_priorities([1.5], [100.0])  # was truncated to column 1
    assert buf._max_priority == pytest.approx(5.0 + 1e-6)  # unchanged by the refused updates
    with pytest.raises(ValueError, match="finite"):
        buf.update_priorities([0], [np.nan])
    with pytest.raises(ValueError, match="optimize_memory"):
        PrioritizedReplayBuffer(4, 1, 1, optimize_memory=True)
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedReplayBuffer(4, 1, 1, alpha=-1)


def test_integer_tables_refuse_observations_and_actions_they_cannot_hold():
    buf = ReplayBuffer(4, 2, 1, obs_dtype="u8", action_dtype="i32")
    step = dict(obs=np.array([[3, 2]], np.uint8), action=np.array([[1]]), reward=[0.0],
                next_obs=np.array([[4, 5]], np.uint8), terminated=[False], truncated=[False])
    for field, value, message in [
        ("obs", np.array([[300, 2]]), r"^ReplayBuffer.add: obs: value 300 at position 0 does not convert to u8 "
                                      r"\(whole numbers from 0 to 255\)$"),  # was stored as 44
        ("next_obs", np.array([[1.0, -1.0]]), "ReplayBuffer.add: next_obs: value -1.0 at position 1"),
        ("action", np.array([[2.7]]), "ReplayBuffer.add: action: value 2.7 does not convert to i32"),  # was 2
    ]:
        with pytest.raises(ValueError, match=message):
            buf.add(**{**step, field: value})
    assert len(buf) == 0  # nothing stored
    buf.add(**{**step, "obs": np.array([[255.0, 0.0]]), "action": np.array([[7.0]])})  # whole floats are exact
    np.testing.assert_array_equal(buf._obs.read(0, 1).ravel(), [255, 0])
    np.testing.assert_array_equal(buf._action.read(0, 1).ravel(), [7])


def test_sum_tree_refuses_indices_outside_its_leaves_and_bad_values():
    from rlkit.buffers import SumTree

    tree = SumTree(8)
    tree.update(np.arange(8), np.arange(8.0))
    before = tree.tree.copy()
    with pytest.raises(IndexError, match=r"^SumTree.update: index -1 at position 0 is out of range for 8 leaves "
                                         r"\(valid: 0..7\)$"):
        tree.update([-1], [100.0])  # was written into an internal node (the sum of leaves 6 and 7)
    with pytest.raises(IndexError, match="index 8 at position 1 is out of range for 8 leaves"):
        tree.update([0, 8], [1.0, 1.0])
    with pytest.raises(TypeError, match="SumTree.update: index must be an integer array, got float64"):
        tree.update([1.5], [1.0])
    for bad in (-3.0, np.nan, np.inf):
        with pytest.raises(ValueError, match=rf"^SumTree.update: values must be finite and >= 0, got {bad!r} "
                                             r"at position 1$"):
            tree.update([0, 1], [1.0, bad])
    np.testing.assert_array_equal(tree.tree, before)  # nothing changed
    tree.update([], [])
    tree.update([2, 5], [10.0, 0.0])
    assert tree.total() == sum(range(8)) - 2 - 5 + 10
    with pytest.raises(ValueError, match="SumTree: capacity must be a positive int, got 0"):
        SumTree(0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(alpha=float("nan")), r"^PrioritizedReplayBuffer: alpha must lie in \[0.0, 10.0\], got nan$"),
    (dict(alpha=-0.1), r"alpha must lie in \[0.0, 10.0\], got -0.1"),
    (dict(alpha=11.0), r"alpha must lie in \[0.0, 10.0\], got 11.0"),
    (dict(beta=float("nan")), r"beta must lie in \[0.0, 1.0\], got nan"),
    (dict(beta=1.5), r"beta must lie in \[0.0, 1.0\], got 1.5"),
    (dict(eps=float("inf")), r"eps must lie in \[0.0, inf\), got inf"),
    (dict(eps=-1e-6), r"eps must lie in \[0.0, inf\), got -1e-06"),
    (dict(alpha=True), r"alpha must lie in \[0.0, 10.0\], got True"),
])
def test_prioritized_hyperparameters_outside_their_ranges_are_refused(kwargs, message):
    from rlkit.buffers import DevicePrioritizedReplayBuffer, PrioritizedReplayBuffer

    with pytest.raises(ValueError, match=message):
        PrioritizedReplayBuffer(4, 1, 1, **kwargs)
    if "beta" not in kwargs:  # the device buffer takes beta per sample
        with pytest.raises(ValueError, match=message.replace("^Prior", "^DevicePrior")):
            DevicePrioritizedReplayBuffer(4, 1, 1, **kwargs)
    buf = PrioritizedReplayBuffer(4, 1, 1, alpha=10.0, beta=1.0, eps=0.0)  # the ends of the ranges
    assert (buf.alpha, buf.beta, buf.eps) == (10.0, 1.0, 0.0)


# ---- sampling on the device --------------------------------------------------------------------

def _filled(n_steps=13, seed=0):
    buf = ReplayBuffer(40, 3, 2, n_envs=2, seed=seed)
    history = _rollout([buf], n_steps, 2, seed=seed)
    return buf, history


def test_device_sampling_draws_stored_transitions_identically_on_both_backends():
    results = []
    for device in AVAILABLE_DEVICES:
        previous = rc.device(device)
        try:
            buf, history = _filled()
            rc.manual_seed(42)
            s = buf.sample_on_device(64)
            index = s.index.numpy()[0]
            assert index.min() >= 0 and index.max() < len(buf)
            obs, reward, done = s.obs.numpy(), s.reward.numpy()[0], s.done.numpy()[0]
            for j, column in enumerate(index):
                t, e = divmod(int(column), 2)
                np.testing.assert_array_equal(obs[:, j], history[t][0][e])
                assert reward[j] == history[t][2][e] and done[j] == float(history[t][4][e])
            np.testing.assert_array_equal(s.next_obs.numpy()[:, 0], history[index[0] // 2][3][index[0] % 2])
            results.append(index)
        finally:
            rc.device(previous)
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])  # the same seed, the same samples


def test_device_sampling_inside_a_capture_needs_no_index_upload(device):
    buf, _ = _filled()
    draw = rc.capture(lambda stored: buf.sample_on_device(16, stored).index, params=[buf._obs])
    first = draw(stored=np.array([[len(buf)]], np.float32))
    second = draw(stored=np.array([[len(buf)]], np.float32))
    assert draw.traces == 1 and not np.array_equal(first, second)  # fresh draws every replay
    assert first.max() < len(buf)
    with pytest.raises(ValueError, match="not with optimize_memory"):
        ReplayBuffer(10, 1, 1, optimize_memory=True).sample_on_device(4)


def test_device_sampling_refuses_a_stored_count_the_buffer_does_not_hold(device):
    from rlkit.buffers import DevicePrioritizedReplayBuffer

    buf, _ = _filled(n_steps=5)  # 10 transitions in 40 columns
    where = "ReplayBuffer.sample_on_device"
    for bad in (90, 11, 0, -1, 2.5, float("nan")):
        with pytest.raises(ValueError, match=rf"^{where}: stored must be a whole number from 1 to the 10 transitions "
                                             rf"stored, got {bad!r}$"):
            buf.sample_on_device(8, stored=bad)
    with pytest.raises(TypeError, match="stored must be a number or a \\[1, 1\\] tensor, got str"):
        buf.sample_on_device(8, stored="10")
    assert buf.sample_on_device(64, stored=10).index.numpy().max() < 10
    assert buf.sample_on_device(64, stored=4).index.numpy().max() < 4
    # a captured function's input, checked at every replay against what is stored then
    draw = rc.capture(lambda stored: buf.sample_on_device(16, stored).index, params=[buf._obs])
    assert draw(stored=np.array([[10.0]], np.float32)).max() < 10
    with pytest.raises(ValueError, match=rf"^{where}: stored must be a whole number from 1 to the 10 transitions "
                                         r"stored, got 90.0$"):
        draw(stored=np.array([[90.0]], np.float32))
    with pytest.raises(ValueError, match="got 0.0"):
        draw(stored=np.array([[0.0]], np.float32))
    _rollout([buf], 1, 2, seed=5)  # two more
    assert draw(stored=np.array([[12.0]], np.float32)).max() < 12
    assert draw.traces == 1
    with pytest.raises(ValueError, match=r"^ReplayBuffer.sample_on_device: the buffer is empty$"):
        ReplayBuffer(10, 1, 1).sample_on_device(4, stored=1)
    prioritized = DevicePrioritizedReplayBuffer(8, 1, 1)
    prioritized.add(np.zeros((1, 1)), np.zeros((1, 1)), [0.0], np.zeros((1, 1)), [False], [False])
    with pytest.raises(ValueError, match="^sample_on_device: stored must be a whole number from 1 to the 1 "):
        prioritized.sample_on_device(4, stored=5)


@pytest.mark.parametrize("n_envs,capacity,n_step", [(1, 12, 3), (3, 60, 3), (2, 40, 5), (2, 30, 2)])
def test_device_n_step_sums_equal_the_host_definition(device, n_envs, capacity, n_step):
    """The device's n-step sums (_n_step_on_device) are the host's (_n_step, the definition) on
    every stored column, after runs of adds that move the newest step and wrap the ring: the
    same stops at terminations, truncations and the newest step, the same last column."""
    buf = ReplayBuffer(capacity, 3, 2, n_envs=n_envs, seed=1, n_step=n_step, gamma=0.9)
    for run, steps in enumerate((1, 2, 5, 13, 4, 9)):
        _rollout([buf], steps, n_envs, seed=run)
        columns = np.arange(len(buf), dtype=np.int32)
        t, e = divmod(columns, n_envs)
        ret, done, discount, last = buf._n_step(t, e)
        on_device = buf.n_step_returns_on_device(rc.tensor(columns[None, :], device=device))
        device_ret, device_done, device_discount, device_last = (v.numpy()[0] for v in on_device)
        np.testing.assert_array_equal(device_last, last * n_envs + e, err_msg=f"run {run}")
        np.testing.assert_array_equal(device_done, done, err_msg=f"run {run}")
        np.testing.assert_allclose(device_ret, ret, rtol=1e-6, atol=1e-7, err_msg=f"run {run}")
        np.testing.assert_allclose(device_discount, discount, rtol=1e-6, err_msg=f"run {run}")
    assert buf.full


def test_prioritized_beta_anneals_linearly():
    from rlkit.buffers import PrioritizedReplayBuffer

    buf = PrioritizedReplayBuffer(4, 1, 1, beta=0.4)
    assert buf.anneal_beta(0.0) == pytest.approx(0.4)
    assert buf.anneal_beta(0.5) == pytest.approx(0.7)
    assert buf.anneal_beta(2.0) == pytest.approx(1.0)
    assert buf.anneal_beta(0.25) == pytest.approx(0.55)  # always from the starting beta


# ---- prioritized, on the device ----------------------------------------------------------------

def _device_prioritized(alpha=0.7, n=8):
    from rlkit.buffers import DevicePrioritizedReplayBuffer

    buf = DevicePrioritizedReplayBuffer(n, 1, 1, alpha=alpha, eps=0.0)
    for t in range(n):
        buf.add(np.full((1, 1), t), np.zeros((1, 1)), [float(t)], np.zeros((1, 1)), [False], [False])
    return buf


def test_device_prioritized_sampling_weights_and_updates(device):
    buf = _device_prioritized()
    priorities = np.array([1.0, 2.0, 0.5, 4.0, 1.0, 3.0, 0.25, 2.0], np.float32)
    index = rc.tensor(np.arange(8, dtype=np.int32)[None, :])
    buf.update_priorities_on_device(index, rc.tensor(priorities[None, :]))
    np.testing.assert_allclose(buf._priority.read()[0], priorities**0.7, rtol=1e-5)
    assert buf._max.read()[0, 0] == pytest.approx(4.0**0.7, rel=1e-5)
    expected = priorities**0.7 / np.sum(priorities**0.7)
    rc.manual_seed(1)
    counts = np.zeros(8)
    for _ in range(300):
        counts += np.bincount(buf.sample_on_device(64).index.numpy()[0], minlength=8)
    n = counts.sum()
    assert np.all(np.abs(counts / n - expected) < 4 * np.sqrt(expected * (1 - expected) / n))
    s = buf.sample_on_device(64, beta=0.5)
    chosen = s.index.numpy()[0]
    np.testing.assert_array_equal(s.obs.numpy()[0], chosen)  # the sampled columns' data
    w = (8 * expected[chosen]) ** -0.5
    np.testing.assert_allclose(s.weights.numpy()[0], w / w.max(), rtol=1e-4)
    buf.add(np.zeros((1, 1)), np.zeros((1, 1)), [0.0], np.zeros((1, 1)), [False], [False])  # overwrites column 0
    assert buf._priority.read()[0, 0] == pytest.approx(4.0**0.7, rel=1e-5)  # new: the largest so far


def test_device_prioritized_steps_added_between_reads_get_the_largest_priority(device):
    """Steps wait on the host and get their priority when they are sent: still the largest
    priority so far at the time they were added, across a wrap of the ring, for every lane."""
    from rlkit.buffers import DevicePrioritizedReplayBuffer

    buf = DevicePrioritizedReplayBuffer(12, 1, 1, n_envs=2, alpha=1.0, eps=0.0)  # 6 ring steps of 2 lanes

    def add_steps(k):
        for _ in range(k):
            buf.add(np.zeros((2, 1)), np.zeros((2, 1)), [0.0, 0.0], np.zeros((2, 1)), [False, False], [False, False])

    add_steps(4)  # columns 0 .. 7
    updated = np.array([1.0, 5.0, 2.0, 0.5, 3.0, 1.5, 2.5, 4.0], np.float32)
    buf.update_priorities_on_device(rc.tensor(np.arange(8, dtype=np.int32)[None, :]), rc.tensor(updated[None, :]))
    add_steps(4)  # ring steps 4, 5, 0, 1: columns 8 .. 11, then 0 .. 3 again, none read in between
    expected = np.concatenate([np.full(4, 5.0), updated[4:8], np.full(4, 5.0)])
    np.testing.assert_allclose(buf._priority.read()[0], expected, rtol=1e-6)


def test_device_prioritized_draws_match_across_backends_and_capture():
    draws = []
    for dev in AVAILABLE_DEVICES:
        previous = rc.device(dev)
        try:
            buf = _device_prioritized()
            rc.manual_seed(3)
            draws.append(buf.sample_on_device(32).index.numpy())

            def step(stored, beta):
                s = buf.sample_on_device(16, stored, beta)
                buf.update_priorities_on_device(s.index, rc.mul(s.reward, 2.0))  # "TD errors" on the device
                return s.index

            captured = rc.capture(step, params=[buf._priority, buf._max])
            inputs = dict(stored=np.array([[8.0]], np.float32), beta=np.array([[0.4]], np.float32))
            captured(**inputs)
            captured(**inputs)
            assert captured.traces == 1
            seen = np.unique(np.concatenate([captured(**inputs)[0] for _ in range(5)]))
            np.testing.assert_allclose(buf._priority.read()[0, seen], (2.0 * seen) ** 0.7, rtol=1e-5)
        finally:
            rc.device(previous)
    for other in draws[1:]:
        np.testing.assert_array_equal(other, draws[0])


def test_device_prioritized_non_finite_td_errors_take_the_largest_priority(device):
    """The issue's case: a NaN TD error made every later draw the last, never written column
    (5000 columns, 10 written) with NaN weights. A non-finite priority becomes the largest
    finite one so far and is counted; in a captured update as well."""
    from rlkit.buffers import DevicePrioritizedReplayBuffer

    buf = DevicePrioritizedReplayBuffer(5000, 1, 1, alpha=0.6, eps=0.0, seed=0)
    for t in range(10):
        buf.add(np.full((1, 1), t), np.zeros((1, 1)), [0.0], np.zeros((1, 1)), [False], [False])
    td = np.array([[2.0, 3.0]], np.float32)
    buf.update_priorities_on_device(rc.tensor(np.array([[0, 1]], np.int32)), rc.tensor(td))
    buf.update_priorities_on_device(rc.tensor(np.array([[3]], np.int32)), rc.tensor(np.array([[np.nan]], np.float32)))
    expected = np.ones(10, np.float32)
    expected[:2] = td[0] ** 0.6
    expected[3] = 3.0**0.6  # the largest so far
    np.testing.assert_allclose(buf._priority.read()[0, :10], expected, rtol=1e-6)
    assert buf.nonfinite_priorities == 1
    rc.manual_seed(0)
    drawn = np.concatenate([buf.sample_on_device(1, stored=10).index.numpy()[0] for _ in range(200)])
    assert drawn.max() < 10  # stored columns only
    s = buf.sample_on_device(2000, stored=10, beta=0.4)
    assert s.index.numpy().max() < 10 and np.all(np.isfinite(s.weights.numpy()))

    def step(index, td):
        buf.update_priorities_on_device(index, td)
        return buf.sample_on_device(64, 10.0).weights

    captured = rc.capture(step, params=[buf._priority, buf._max])
    bad = np.array([[np.inf, -np.inf, np.nan, 1.0]], np.float32)
    for _ in range(3):
        weights = captured(index=np.array([[4, 5, 6, 7]], np.int32), td=bad)[0]
        assert np.all(np.isfinite(weights))
    assert buf.nonfinite_priorities == 1 + 3 * 3
    np.testing.assert_allclose(buf._priority.read()[0, 4:8], [3.0**0.6] * 3 + [1.0], rtol=1e-6)
    assert buf._max.read()[0, 0] == pytest.approx(3.0**0.6, rel=1e-6)


def test_device_prioritized_bad_settings():
    from rlkit.buffers import DevicePrioritizedReplayBuffer

    with pytest.raises(ValueError, match="not with optimize_memory"):
        DevicePrioritizedReplayBuffer(8, 1, 1, optimize_memory=True)
    with pytest.raises(ValueError, match="alpha"):
        DevicePrioritizedReplayBuffer(8, 1, 1, alpha=-0.5)
    with pytest.raises(ValueError, match="batch_size"):
        _device_prioritized().sample_on_device(0)


# ---- staging: new steps wait on the host until something reads the device tables -------------

def _expected_tables(history, buf) -> dict[str, np.ndarray]:
    """Every device table of ``buf`` as the steps of ``history`` leave it, computed in numpy:
    step h of lane e in column (h mod lane_length) * n_envs + e; unwritten columns 0."""
    n_envs, lane_length = buf.n_envs, buf.lane_length
    expected = {name: np.zeros((rows, buf.capacity), np.float32) for name, rows in (
        ("obs", 3), ("next_obs", 3), ("action", 2), ("reward", 1), ("terminated", 1), ("ended", 1), ("stop", 1))}
    for h, (obs, action, reward, next_obs, terminated, truncated) in enumerate(history):
        columns = (h % lane_length) * n_envs + np.arange(n_envs)
        for name, value in (("obs", obs.T), ("next_obs", next_obs.T), ("action", action.T), ("reward", reward),
                            ("terminated", terminated), ("ended", terminated | truncated),
                            ("stop", (terminated | truncated) | (h == len(history) - 1))):
            expected[name][:, columns] = value
    return expected


def _gathered_tables(buf) -> dict[str, np.ndarray]:
    """Every column of every device table, gathered on the device (the path samplers take)."""
    every = np.arange(buf.capacity, dtype=np.int32)[None, :]
    tables = {"obs": buf._obs, "next_obs": buf._next_obs, "action": buf._action, "reward": buf._reward_row,
              "terminated": buf._terminated_row, "ended": buf._ended_row, "stop": buf._stop_row}
    return {name: rc.get_rows(table, every).numpy() for name, table in tables.items() if table is not None}


@pytest.mark.parametrize("n_envs,optimize_memory,n_step", [(1, False, 1), (3, False, 3), (2, True, 2)])
@pytest.mark.parametrize("staging_bytes", [64, 4 << 20])  # 64: a step or two per upload
def test_the_device_tables_hold_every_step_added_between_reads(device, monkeypatch, n_envs, optimize_memory,
                                                               n_step, staging_bytes):
    """Reads between runs of adds of every length, the ring wrapping inside a run: each read
    sees every step added before it, in every table, and samples match the reference."""
    monkeypatch.setattr(ReplayBuffer, "STAGING_BYTES", staging_bytes)
    buf = ReplayBuffer(10 * n_envs, 3, 2, n_envs=n_envs, seed=4, optimize_memory=optimize_memory, n_step=n_step,
                       gamma=0.9)
    history = []
    for run, steps in enumerate((1, 3, 9, 2, 14, 1)):  # the 10-step lanes wrap inside runs
        history += _rollout([buf], steps, n_envs, seed=run)
        gathered, expected = _gathered_tables(buf), _expected_tables(history, buf)
        for name, values in gathered.items():
            np.testing.assert_array_equal(values, expected[name], err_msg=f"{name} after run {run}")
        if optimize_memory and len(history) == 1:
            continue  # the only step's next observation is not stored yet: nothing to sample
        batch = buf.sample(32)
        lane_length = buf.lane_length
        for j, column in enumerate(batch.index):
            t, e = divmod(int(column), n_envs)
            h = t + (len(history) - 1 - t) // lane_length * lane_length  # the newest history step in ring step t
            np.testing.assert_array_equal(batch.obs.numpy()[:, j], history[h][0][e])
            if optimize_memory:
                continue  # the reference's n-step window may run into overwritten steps there
            ret, done, discount, boot = _reference(history, h, e, n_step, 0.9)
            assert batch.reward.numpy()[0, j] == pytest.approx(ret, rel=1e-5, abs=1e-6)
            np.testing.assert_array_equal(batch.next_obs.numpy()[:, j], boot)


@pytest.mark.parametrize("n_step", [1, 3])
def test_a_captured_sampler_sees_steps_added_after_it_was_traced(device, n_step):
    """A replay runs no Python: the program itself sends the steps staged since the last
    replay before it gathers (the capture lists no buffer, so nothing else would)."""
    n_envs, gamma = 2, 0.9
    buf = ReplayBuffer(20 * n_envs, 3, 2, n_envs=n_envs, seed=1, n_step=n_step, gamma=gamma)
    rc.manual_seed(7)

    def fields(stored):
        s = buf.sample_on_device(512, stored)
        return s.index, s.obs, s.next_obs, s.reward, s.discount

    sample = rc.capture(fields)
    history = _rollout([buf], 6, n_envs, seed=1)
    for run in range(3):
        index, obs, next_obs, reward, discount = sample(stored=np.array([[len(buf)]], np.float32))
        newest_columns = {(len(history) - 1) % 20 * n_envs + e for e in range(n_envs)}
        assert newest_columns <= set(index.reshape(-1).astype(int).tolist())  # the steps added last are drawn
        for j, column in enumerate(index.reshape(-1).astype(int)):
            t, e = divmod(column, n_envs)
            h = t + (len(history) - 1 - t) // 20 * 20
            np.testing.assert_array_equal(obs[:, j], history[h][0][e])
            ret, _, disc, boot = _reference(history, h, e, n_step, gamma)
            assert reward[0, j] == pytest.approx(ret, rel=1e-5, abs=1e-6)
            assert discount[0, j] == pytest.approx(disc, rel=1e-6)
            np.testing.assert_array_equal(next_obs[:, j], boot)
        history += _rollout([buf], 9, n_envs, seed=10 + run)  # wraps the ring in the last run
    assert sample.traces == 1


@pytest.mark.parametrize("n_envs,optimize_memory,n_step", [(1, False, 1), (3, False, 3), (2, True, 2)])
@pytest.mark.parametrize("staging_bytes", [64, 4 << 20])
def test_extend_stores_what_adds_of_its_steps_store(device, monkeypatch, n_envs, optimize_memory, n_step,
                                                    staging_bytes):
    """extend of runs of k steps (the ring wrapping and the staging area filling inside a run,
    one pass per run of ring steps) leaves every device table, the write position and the
    sampled transitions as k adds leave them; optimize_memory takes the add-by-add path."""
    monkeypatch.setattr(ReplayBuffer, "STAGING_BYTES", staging_bytes)
    made = [ReplayBuffer(10 * n_envs, 3, 2, n_envs=n_envs, seed=4, optimize_memory=optimize_memory, n_step=n_step,
                         gamma=0.9) for _ in range(2)]
    added, extended = made
    for run, steps in enumerate((1, 3, 9, 2, 14, 1)):
        history = _rollout([added], steps, n_envs, seed=run)
        columns = [np.stack([step[i] for step in history]) for i in range(6)]  # [k, n_envs, ...] each
        extended.extend(*columns)
        extended.extend(*[column[:0] for column in columns])  # no steps: nothing changes
        for name, values in _gathered_tables(extended).items():
            np.testing.assert_array_equal(values, _gathered_tables(added)[name], err_msg=f"{name} after run {run}")
        assert (extended.pos, extended.full, len(extended)) == (added.pos, added.full, len(added))
    np.testing.assert_array_equal(extended.sample(16).index, added.sample(16).index)


def test_extend_stores_the_steps_before_one_it_refuses_and_refuses_arguments_of_other_lengths():
    """As adds one by one: the third step's fractional byte is refused with add's message; the
    two steps before it are stored; a scalar reward is no stack of steps."""
    buf = ReplayBuffer(8, 2, 1, obs_dtype="u8")
    obs = np.arange(10, dtype=np.float64).reshape(5, 1, 2)  # [k, n_envs, 2], whole numbers but floats: checked
    obs[2, 0, 1] = 0.5
    with pytest.raises(ValueError, match="obs"):
        buf.extend(obs, np.zeros((5, 1, 1)), np.ones((5, 1)), obs, np.zeros((5, 1), bool), np.zeros((5, 1), bool))
    assert len(buf) == 2
    np.testing.assert_array_equal(rc.get_rows(buf._obs, np.array([[0, 1]], np.int32)).numpy(), [[0, 2], [1, 3]])
    with pytest.raises(ValueError, match="reward must be an array"):
        buf.extend(obs[:1], np.zeros((1, 1, 1)), 1.0, obs[:1], np.zeros((1, 1), bool), np.zeros((1, 1), bool))
    flags = np.zeros((2, 1), bool)
    with pytest.raises(ValueError, match=r"extend: next_obs holds 5 steps, reward 2: every argument stacks the same k"):
        buf.extend(obs[:2], np.zeros((2, 1, 1)), np.ones((2, 1)), obs, flags, flags)
    with pytest.raises(ValueError, match=r"obs has shape \(1, 3\), expected \(1, 2\)"):  # add's own message
        buf.extend(np.zeros((2, 1, 3)), np.zeros((2, 1, 1)), np.ones((2, 1)), np.zeros((2, 1, 3)), flags, flags)
    assert len(buf) == 2  # nothing more stored
