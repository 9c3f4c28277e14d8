"""Image replay: uint8 observations kept as bytes and sampled in the image layout, and frame
stacks stored frame by frame and rebuilt on the device. The reference is always the
environment: a real Gymnasium FrameStackObservation over a synthetic image environment whose
frame bytes say which lane, episode and step made them, stepped as the agents step vector
environments (EnvLanes, autoreset in the same step), with random episode ends and a TimeLimit;
n-step returns are checked against a host computation from the same history."""

import json
import os

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import FrameStackObservation, TimeLimit

import rlkit.core as rc
from rlkit.agents.lanes import EnvLanes
from rlkit.buffers import DevicePrioritizedReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer
from rlkit.buffers.frames import minimum_start_frames

from test_replay import _reference  # the n-step reference of the float buffer's tests (tests/ is on sys.path)

FRAME = (4, 7)  # (H, W): 28 bytes, a multiple of 4 as GPU u8 gathers need; H != W, so swapped axes show
K = 4
TIME_LIMIT = 9  # steps: longer episodes are truncated


class SyntheticFrames(gym.Env):
    """Frames of random bytes (never all zero) seeded by (lane, episode, step), their first
    three bytes those numbers; an episode terminates at each step with ``end_probability``."""

    observation_space = gym.spaces.Box(0, 255, FRAME, np.uint8)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, lane: int, end_probability: float):
        self.lane, self.end_probability = lane, end_probability
        self.episode, self.t = -1, 0

    def _frame(self) -> np.ndarray:
        frame = np.random.default_rng((self.lane, self.episode, self.t)).integers(1, 256, FRAME, dtype=np.uint8)
        frame.reshape(-1)[:3] = (self.lane + 1, self.episode % 256, self.t % 256)
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        terminated = bool(self.np_random.random() < self.end_probability)
        return self._frame(), float(self.np_random.standard_normal()), terminated, False, {}


def _lanes(n_envs: int, padding: str = "reset", end_probability: float = 0.12) -> EnvLanes:
    def make(lane):
        return lambda: TimeLimit(FrameStackObservation(SyntheticFrames(lane, end_probability), K,
                                                       padding_type=padding), TIME_LIMIT)

    vector = gym.vector.SyncVectorEnv([make(lane) for lane in range(n_envs)],
                                      autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    return EnvLanes(vector, seed=0)


def _rollout(buffers, lanes: EnvLanes, steps: int, seed: int = 0, obs=None):
    """Steps the lanes ``steps`` times with random actions, adding every step to every buffer;
    returns the history, one (obs, action, reward, true next obs, terminated, truncated) per
    step, copies of what the environment returned, and the observation to act on next."""
    rng = np.random.default_rng(seed)
    obs = lanes.reset() if obs is None else obs
    history = []
    for _ in range(steps):
        action = rng.integers(0, 3, (lanes.n, 1))
        next_obs, reward, terminated, truncated, true_next = lanes.step(action[:, 0])
        for buf in buffers:
            buf.add(obs, action, reward, true_next, terminated, truncated)
        history.append(tuple(np.array(x, copy=True) for x in (obs, action, reward, true_next, terminated, truncated)))
        obs = next_obs
    return history, obs


def _step_of(column: int, buf: ReplayBuffer, history) -> tuple[int, int]:
    """(step in the history, lane) of a buffer column: the newest step stored at its ring step."""
    ring, lane = divmod(int(column), buf.n_envs)
    newest = len(history) - 1
    return newest - (newest - ring) % buf.lane_length, lane


def _images(tensor) -> np.ndarray:
    """A sampled u8 image batch [W, H, k, B] as the numpy batch (B, k, H, W) of the same bytes."""
    values = tensor.numpy()
    assert tensor.dtype == "u8" and values.dtype == np.uint8
    return values.T


def _check_against_history(samples, buf: ReplayBuffer, history) -> dict[str, int]:
    """Every sampled transition (n_step 1) equals the environment's: the obs stack, action,
    reward, done and the true next stack. Returns how many samples had each kind of step."""
    index = samples.index.numpy()[0] if hasattr(samples.index, "numpy") else samples.index
    assert samples.obs.shape == (FRAME[1], FRAME[0], K, len(index))  # [W, H, k, B]
    obs, next_obs = _images(samples.obs), _images(samples.next_obs)
    reward, done, action = samples.reward.numpy()[0], samples.done.numpy()[0], samples.action.numpy()[0]
    kinds = {"terminated": 0, "truncated": 0, "first": 0, "padded": 0}
    for j, column in enumerate(index):
        step, lane = _step_of(column, buf, history)
        first_obs, taken, rewards, true_next, terminated, truncated = history[step]
        np.testing.assert_array_equal(obs[j], first_obs[lane], err_msg=f"obs of step {step}, lane {lane}")
        np.testing.assert_array_equal(next_obs[j], true_next[lane], err_msg=f"next_obs of step {step}, lane {lane}")
        assert action[j] == taken[lane, 0] and reward[j] == rewards[lane] and done[j] == float(terminated[lane])
        kinds["terminated"] += bool(terminated[lane])
        kinds["truncated"] += bool(truncated[lane])
        kinds["first"] += first_obs[lane, -1, 0, 2] == 0  # the step counter in the newest frame
        kinds["padded"] += first_obs[lane, 0, 0, 2] == 0 and first_obs[lane, -1, 0, 2] > 0
    return kinds


def _image_buffer(cls=ReplayBuffer, capacity=60, n_envs=3, **kwargs) -> ReplayBuffer:
    return cls(capacity, (K, *FRAME), 1, n_envs=n_envs, obs_dtype="u8", action_dtype="i32", frame_stack=K, seed=1,
               **kwargs)


# ---- stacks rebuilt from frames --------------------------------------------------------------

@pytest.mark.parametrize("padding", ["reset", "zero"])
@pytest.mark.parametrize("n_envs", [1, 3])
def test_sampled_stacks_are_the_environments_across_episode_ends_and_ring_wraps(device, padding, n_envs):
    buf = _image_buffer(capacity=20 * n_envs, n_envs=n_envs)
    history, _ = _rollout([buf], _lanes(n_envs, padding), steps=53)  # the ring of 20 steps wraps twice
    assert len(buf) == buf.capacity and buf.obs_dtype == "u8"
    host = _check_against_history(buf.sample(8 * len(buf)), buf, history)
    rc.manual_seed(3)
    on_device = _check_against_history(buf.sample_on_device(8 * len(buf)), buf, history)
    for kinds in (host, on_device):  # every kind of step was among those checked
        assert min(kinds.values()) > 0, kinds
    if padding == "zero":  # the padding frames are zeros, as the environment gave them
        first = history[0][0][0]
        assert not first[:-1].any() and first[-1].any()


def test_sampled_stacks_keep_the_bytes_of_a_numpy_batch(device):
    buf = _image_buffer(n_envs=2, capacity=40)
    history, _ = _rollout([buf], _lanes(2), steps=12)
    samples = buf.sample(16)
    expected = np.stack([history[s][0][e] for s, e in (_step_of(c, buf, history) for c in samples.index)])
    assert expected.shape == (16, K, *FRAME)  # (B, k, H, W), C order
    assert samples.obs.numpy().tobytes(order="F") == expected.tobytes()


def test_a_captured_sampler_rebuilds_the_stacks_of_steps_added_after_it_was_traced(device):
    buf = _image_buffer()
    lanes = _lanes(3)
    history, obs = _rollout([buf], lanes, steps=6)
    draw = rc.capture(lambda stored: buf.sample_on_device(64, stored)[:5], params=[])
    for more in (5, 30):  # the second run wraps the ring
        moved, obs = _rollout([buf], lanes, steps=more, seed=more, obs=obs)
        history += moved
        # a replay gives numpy arrays and no index: stacks are unique, so each names its column
        column_of = {history[s][0][e].tobytes(): c for c in range(len(buf)) for s, e in [_step_of(c, buf, history)]}
        obs_batch, action, reward, next_batch, done = draw(stored=np.array([[len(buf)]], np.float32))
        for j in range(64):
            step, lane = _step_of(column_of[obs_batch.T[j].tobytes()], buf, history)
            np.testing.assert_array_equal(next_batch.T[j], history[step][3][lane])
            assert reward[0, j] == history[step][2][lane] and done[0, j] == float(history[step][4][lane])
            assert action[0, j] == history[step][1][lane, 0]
    assert draw.traces == 1


# ---- n-step returns ----------------------------------------------------------------------------

def test_n_step_returns_on_stacks_match_a_host_computation(device):
    gamma, n = 0.9, 3
    buf = _image_buffer(n_step=n, gamma=gamma)
    history, _ = _rollout([buf], _lanes(3), steps=47)
    rc.manual_seed(5)
    for samples in (buf.sample(200), buf.sample_on_device(200)):
        index = np.asarray(samples.index.numpy()[0] if hasattr(samples.index, "numpy") else samples.index)
        reward, done, discount = (getattr(samples, f).numpy()[0] for f in ("reward", "done", "discount"))
        next_obs, ends = _images(samples.next_obs), 0
        for j, column in enumerate(index):
            step, lane = _step_of(column, buf, history)
            ret, d, disc, boot = _reference(history, step, lane, n, gamma)
            assert reward[j] == pytest.approx(ret, rel=1e-5, abs=1e-6)
            assert done[j] == d and discount[j] == pytest.approx(disc, rel=1e-6)
            np.testing.assert_array_equal(next_obs[j], boot)
            ends += disc > gamma ** n + 1e-6  # a sum cut short by an episode's end (or the newest step)
        assert 0 < ends < len(index)


def test_truncate_episodes_lets_lanes_begin_new_episodes_and_ends_the_stored_ones_there(device):
    """Environments reset mid-episode (a resumed run): after truncate_episodes the lanes' next
    steps begin episodes, and the steps before keep their stacks, next stacks and n-step sums
    (stopped at the cut, as at a truncation)."""
    gamma, n = 0.9, 3
    buf, untold = _image_buffer(n_step=n, gamma=gamma), _image_buffer()
    history, _ = _rollout([buf, untold], _lanes(3, end_probability=0.02), steps=14)
    running = ~(history[-1][4] | history[-1][5])
    assert running.any()
    with pytest.raises(ValueError, match="is not the next_obs of that lane's previous step"):
        _rollout([untold], _lanes(3), steps=1, seed=5)  # new environments' first stacks
    buf.truncate_episodes()
    history[-1] = (*history[-1][:5], history[-1][5] | running)
    more, _ = _rollout([buf], _lanes(3), steps=17, seed=5)  # the ring of 20 steps wraps
    history += more
    rc.manual_seed(6)
    for samples in (buf.sample(300), buf.sample_on_device(300)):
        index = np.asarray(samples.index.numpy()[0] if hasattr(samples.index, "numpy") else samples.index)
        reward, discount = samples.reward.numpy()[0], samples.discount.numpy()[0]
        obs, next_obs = _images(samples.obs), _images(samples.next_obs)
        for j, column in enumerate(index):
            step, lane = _step_of(column, buf, history)
            np.testing.assert_array_equal(obs[j], history[step][0][lane])
            ret, _, disc, boot = _reference(history, step, lane, n, gamma)
            assert reward[j] == pytest.approx(ret, rel=1e-5, abs=1e-6) and discount[j] == pytest.approx(disc)
            np.testing.assert_array_equal(next_obs[j], boot)


# ---- prioritized replay ------------------------------------------------------------------------

def test_host_prioritized_sampling_on_stacks(device):
    buf = _image_buffer(PrioritizedReplayBuffer, alpha=1.0, beta=0.5)
    history, _ = _rollout([buf], _lanes(3), steps=45)
    _check_against_history(buf.sample(256), buf, history)
    favoured = np.array([4, 17, 33], np.int64)
    buf.update_priorities(np.arange(buf.capacity), np.full(buf.capacity, 1e-3))
    buf.update_priorities(favoured, np.full(3, 1e3))
    samples = buf.sample(300)
    assert np.isin(samples.index, favoured).mean() > 0.95 and samples.weights.shape == (1, 300)
    _check_against_history(samples, buf, history)


def test_device_prioritized_sampling_on_stacks(device):
    buf = _image_buffer(DevicePrioritizedReplayBuffer, alpha=1.0)
    history, _ = _rollout([buf], _lanes(3), steps=45)
    rc.manual_seed(11)
    _check_against_history(buf.sample_on_device(256, beta=0.5), buf, history)
    favoured = np.array([[4, 17, 33]], np.int32)
    low = rc.tensor(np.full((1, buf.capacity), 1e-3, np.float32))
    buf.update_priorities_on_device(rc.tensor(np.arange(buf.capacity, dtype=np.int32)[None, :]), low)
    buf.update_priorities_on_device(rc.tensor(favoured), rc.tensor(np.full((1, 3), 1e3, np.float32)))
    samples = buf.sample_on_device(300, beta=0.5)
    assert np.isin(samples.index.numpy(), favoured).mean() > 0.95
    _check_against_history(samples, buf, history)


# ---- short episodes: the start ring laps -------------------------------------------------------

@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer, DevicePrioritizedReplayBuffer])
def test_a_lapped_start_ring_stops_sampling_the_oldest_steps_never_shows_wrong_frames(device, cls):
    smallest = minimum_start_frames(K, 2)  # 33 slots; episodes of about 2 steps need one per step and lane
    buf = _image_buffer(cls, capacity=80, n_envs=2, start_frames=smallest)
    history, _ = _rollout([buf], _lanes(2, end_probability=0.5), steps=70)
    assert 0 < len(buf) < buf.capacity  # the oldest steps stopped being sampled early
    sampled = len(buf) // 2
    newest = {(len(history) - 1 - age) % buf.lane_length for age in range(sampled)}  # ring steps still sampled
    rc.manual_seed(2)
    if cls is DevicePrioritizedReplayBuffer:
        batches = [buf.sample_on_device(400)]
    else:
        batches = [buf.sample(400)] + ([buf.sample_on_device(400)] if cls is ReplayBuffer else [])
    for samples in batches:
        index = samples.index.numpy()[0] if hasattr(samples.index, "numpy") else samples.index
        assert {int(c) // 2 for c in index} <= newest and len({int(c) // 2 for c in index}) > sampled // 2
        _check_against_history(samples, buf, history)


# ---- save and load -----------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [ReplayBuffer, DevicePrioritizedReplayBuffer])
def test_save_and_load_keep_the_bytes_and_the_lanes_continue(device, tmp_path, cls):
    buf = _image_buffer(cls)
    lanes = _lanes(3)
    history, obs = _rollout([buf], lanes, steps=27)
    buf.save(str(tmp_path / "buf"))
    loaded = cls.load(str(tmp_path / "buf"))
    assert sorted(os.listdir(tmp_path / "buf")) == sorted(
        ["meta.json", "host.npz", "frames.npy", "stack_index.npy", "action.npy"]
        + (["priority.npy", "max_priority.npy"] if cls is DevicePrioritizedReplayBuffer else []))
    for name, table in buf._device_fields().items():
        assert loaded._device_fields()[name].read().tobytes() == table.read().tobytes(), name
    assert json.load(open(tmp_path / "buf" / "meta.json"))["frame_stack"] == K
    assert len(loaded) == len(buf) and loaded.nbytes == buf.nbytes
    # both continue from the same lanes: the loaded one accepts the next steps as continuations
    more, _ = _rollout([buf, loaded], lanes, steps=20, seed=9, obs=obs)
    history += more
    rc.manual_seed(4)
    first = buf.sample_on_device(128)
    rc.manual_seed(4)
    second = loaded.sample_on_device(128)
    assert _images(first.obs).tobytes() == _images(second.obs).tobytes()
    _check_against_history(second, loaded, history)


# ---- images without stacks -----------------------------------------------------------------------

@pytest.mark.parametrize("obs_shape, image", [((3, 4, 8), (8, 4, 3)), ((4, 8, 3), (3, 8, 4)), ((4, 8), (8, 4))])
def test_u8_images_are_sampled_in_the_image_layout_with_their_bytes(device, obs_shape, image):
    buf = ReplayBuffer(10, obs_shape, 1, obs_dtype="u8", seed=0)
    rng = np.random.default_rng(0)
    steps = [rng.integers(0, 256, (2, 1, *obs_shape), dtype=np.uint8) for _ in range(6)]
    for obs, next_obs in steps:
        buf.add(obs, [[0.0]], [0.0], next_obs, [False], [False])
    assert buf._obs.dtype == "u8"  # bytes on the device, never floats
    for samples in (buf.sample(12), buf.sample_on_device(12)):
        index = np.asarray(samples.index.numpy()[0] if hasattr(samples.index, "numpy") else samples.index)
        assert samples.obs.shape == (*image, 12) and samples.obs.dtype == "u8"
        assert samples.obs.numpy().tobytes(order="F") == np.stack([steps[c][0][0] for c in index]).tobytes()
        assert samples.next_obs.numpy().tobytes(order="F") == np.stack([steps[c][1][0] for c in index]).tobytes()


def test_vector_observations_keep_the_float_layout(device):
    buf = ReplayBuffer(10, 3, 1, seed=0)
    buf.add(np.ones((1, 3)), [[0.0]], [0.0], np.ones((1, 3)), [False], [False])
    assert buf.sample(4).obs.shape == (3, 4) and buf.sample(4).obs.dtype == "f32"


# ---- bad input -----------------------------------------------------------------------------------

def _one_step(n_envs=2, seed=0):
    frames = np.random.default_rng(seed).integers(1, 256, (n_envs, K + 1, *FRAME), dtype=np.uint8)
    return dict(obs=frames[:, :K], action=np.zeros((n_envs, 1)), reward=np.zeros(n_envs),
                next_obs=frames[:, 1:], terminated=np.zeros(n_envs, bool), truncated=np.zeros(n_envs, bool))


def _following(step: dict, seed: int, terminated=(False, False)) -> dict:
    """The step after ``step`` in both lanes: its next observation shifted by a new frame."""
    new = np.random.default_rng(seed).integers(1, 256, (2, 1, *FRAME), dtype=np.uint8)
    obs = step["next_obs"].copy()
    return {**step, "obs": obs, "next_obs": np.concatenate([obs[:, 1:], new], axis=1),
            "terminated": np.array(terminated)}


@pytest.mark.parametrize("change, message", [
    (lambda s: {**s, "next_obs": s["next_obs"][:, ::-1]}, "next_obs of lane 0 does not continue obs as a frame stack"),
    (lambda s: {**s, "obs": s["obs"].astype(np.float32)}, "obs must be a uint8 array .* got float32"),
    (lambda s: {**s, "next_obs": s["next_obs"] / 255.0}, "next_obs must be a uint8 array"),
    (lambda s: {**s, "obs": s["obs"][:, :, :3]}, r"obs has shape \(2, 4, 3, 7\), expected \(2, 4, 4, 7\)"),
    (lambda s: {**s, "obs": s["obs"][:1]}, r"expected \(2, 4, 4, 7\)"),
])
def test_steps_that_are_not_frame_stacks_are_refused_and_nothing_is_stored(change, message):
    buf = _image_buffer(n_envs=2, capacity=20)
    step = _one_step()
    with pytest.raises(ValueError, match=message):
        buf.add(**change(step))
    assert len(buf) == 0
    buf.add(**step)  # the buffer is as it was: the right step goes in
    assert len(buf) == 2


def test_a_step_that_does_not_continue_its_lane_is_refused_unless_the_lane_ended_its_episode():
    buf = _image_buffer(n_envs=2, capacity=20)
    first = _one_step()
    buf.add(**first)
    wrong = _following(first, seed=1)
    wrong["obs"][1, -1, 0, 0] ^= 1  # lane 1's observation is not its last next observation
    wrong["next_obs"][1, :-1] = wrong["obs"][1, 1:]
    with pytest.raises(ValueError, match="obs of lane 1 is not the next_obs of that lane's previous step"):
        buf.add(**wrong)
    assert len(buf) == 2
    ended = _following(first, seed=2, terminated=(False, True))
    buf.add(**ended)
    after = _following(ended, seed=3)
    other = _one_step(seed=4)  # lane 1 begins an episode: any frame stack may
    after["obs"][1], after["next_obs"][1] = other["obs"][1], other["next_obs"][1]
    buf.add(**after)
    assert len(buf) == 6
    stale = _following(ended, seed=5)  # lane 0 did not end its episode: it must go on from `after`
    with pytest.raises(ValueError, match="obs of lane 0 is not the next_obs"):
        buf.add(**stale)
    samples = buf.sample(40)
    expected = {0: first, 1: ended, 2: after}  # by ring step
    for j, column in enumerate(samples.index):
        step = expected[column // 2]
        assert _images(samples.obs)[j].tobytes() == step["obs"][column % 2].tobytes()
        assert _images(samples.next_obs)[j].tobytes() == step["next_obs"][column % 2].tobytes()


@pytest.mark.parametrize("kwargs, message", [
    (dict(obs_shape=(3, *FRAME)), r"frame_stack=4 needs observations of shape \(4, ...\)"),
    (dict(obs_shape=(K * 28,)), r"needs observations of shape \(4, ...\)"),
    (dict(obs_dtype="f32"), "frame_stack stores frames as bytes: pass obs_dtype='u8'"),
    (dict(optimize_memory=True), "already stores each frame once"),
    (dict(start_frames=10), r"start_frames must be at least 33 \(k \* k \* n_envs \+ 1\)"),
    (dict(frame_stack=None, start_frames=50), "start_frames is a setting of frame stacks"),
    (dict(frame_stack=0), "frame_stack must be a positive int"),
])
def test_bad_frame_stack_settings_are_refused(kwargs, message):
    settings = dict(capacity=40, obs_shape=(K, *FRAME), action_shape=1, n_envs=2, obs_dtype="u8", frame_stack=K)
    with pytest.raises(ValueError, match=message):
        ReplayBuffer(**{**settings, **kwargs})


def test_sequences_of_stacks_are_refused():
    buf = _image_buffer(n_envs=2, capacity=20)
    for sample in (buf.sample_sequences, buf.sample_sequences_on_device):
        with pytest.raises(ValueError, match="not with frame_stack"):
            sample(2, 3)


@pytest.mark.requires_gpu
def test_gpu_frames_must_be_whole_32_bit_words():
    with pytest.raises(ValueError, match=r"frames of shape \(5, 7\) have 35"):
        ReplayBuffer(20, (K, 5, 7), 1, obs_dtype="u8", frame_stack=K, device="gpu")


def test_frames_of_any_size_on_the_cpu():
    lanes_env = gym.vector.SyncVectorEnv([lambda: FrameStackObservation(_OddFrames(), 2)],
                                         autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    buf = ReplayBuffer(12, (2, 5, 7), 1, obs_dtype="u8", frame_stack=2, device="cpu", seed=0)
    history, _ = _rollout([buf], EnvLanes(lanes_env, seed=0), steps=20)
    samples = buf.sample(30)
    for j, column in enumerate(samples.index):
        step, lane = _step_of(column, buf, history)
        np.testing.assert_array_equal(_images(samples.obs)[j], history[step][0][lane])
        np.testing.assert_array_equal(_images(samples.next_obs)[j], history[step][3][lane])


class _OddFrames(SyntheticFrames):
    """7x5 frames (35 bytes: not whole 32-bit words)."""

    observation_space = gym.spaces.Box(0, 255, (5, 7), np.uint8)

    def __init__(self):
        super().__init__(0, 0.2)

    def _frame(self):
        return np.random.default_rng((self.episode, self.t)).integers(1, 256, (5, 7), dtype=np.uint8)


# ---- device memory ------------------------------------------------------------------------------

@pytest.mark.parametrize("cls, kwargs", [
    (ReplayBuffer, dict(capacity=60, obs_shape=(K, *FRAME), n_envs=3, obs_dtype="u8", frame_stack=K)),
    (ReplayBuffer, dict(capacity=61, obs_shape=(K, *FRAME), n_envs=2, obs_dtype="u8", frame_stack=K, n_step=3,
                        start_frames=40)),
    (DevicePrioritizedReplayBuffer, dict(capacity=50, obs_shape=(K, *FRAME), obs_dtype="u8", frame_stack=K)),
    (ReplayBuffer, dict(capacity=30, obs_shape=(3, 4, 8), obs_dtype="u8")),
    (ReplayBuffer, dict(capacity=30, obs_shape=5, optimize_memory=True, n_step=2)),
    (DevicePrioritizedReplayBuffer, dict(capacity=30, obs_shape=5, n_envs=4)),
])
def test_the_device_bytes_estimate_is_what_a_buffer_holds(cls, kwargs):
    assert cls.estimate_nbytes(action_shape=1, **kwargs) == cls(action_shape=1, **kwargs).nbytes


def test_a_million_atari_transitions_fit_in_7_5_gb():
    """84x84 frames stacked by 4, DQN's settings (i32 actions, 3-step returns, device priorities)."""
    settings = dict(capacity=1_000_000, obs_shape=(4, 84, 84), action_shape=1, obs_dtype="u8", action_dtype="i32",
                    frame_stack=4, n_step=3)
    plain = ReplayBuffer.estimate_nbytes(**settings)
    prioritized = DevicePrioritizedReplayBuffer.estimate_nbytes(**settings)
    frames = (1_000_000 + 4 + 31_250 + 1) * 84 * 84  # one per transition, k more per lane, the start ring, zeros
    assert plain == frames + 5 * 4_000_000 + 4_000_000 + 4 * 4_000_000 + 4  # + stack_index, action, 4 rows, 1
    assert prioritized == plain + 4_000_000 + 8
    assert prioritized <= 7.5e9
    assert ReplayBuffer.estimate_nbytes(**{**settings, "frame_stack": None}) > 56e9  # obs and next_obs tables of stacks
