"""ReplayBuffer's saves (rlkit/buffers/replay_files.py): a round trip that samples as before
(host and device sampling, priorities), the steps staged since the last read, refused damaged
saves, and what a save replaces and leaves (the kill harness is tests/test_replay_kills.py)."""

import hashlib
import json
import os
import shutil
import stat

import numpy as np
import pytest

import rlkit.core as rc
from rlkit.buffers import ReplayBuffer
from test_replay import _expected_tables, _gathered_tables, _rollout  # tests/ is on sys.path


@pytest.mark.parametrize("optimize_memory", [False, True])
def test_save_and_load_round_trip(device, tmp_path, monkeypatch, optimize_memory):
    monkeypatch.setattr(ReplayBuffer, "CHUNK_BYTES", 64)  # many small chunks: the chunked path
    buf = ReplayBuffer(30, 3, 2, n_envs=2, seed=2, optimize_memory=optimize_memory, n_step=2)
    _rollout([buf], 19, 2, seed=8)  # wraps
    path = str(tmp_path / "replay")
    buf.save(path)
    buf.save(path)  # a second save replaces the first
    loaded = ReplayBuffer.load(path, device="cpu")
    assert (len(loaded), loaded.pos, loaded.full) == (len(buf), buf.pos, buf.full)
    a, b = buf.sample(24), loaded.sample(24)  # the generator state travels too
    np.testing.assert_array_equal(a.index, b.index)
    for field in ("obs", "action", "reward", "next_obs", "done", "discount"):
        np.testing.assert_array_equal(getattr(a, field).numpy(), getattr(b, field).numpy(), err_msg=field)
    with pytest.raises(ValueError, match="not a saved replay buffer"):
        ReplayBuffer.load(str(tmp_path / "missing"))


def test_loaded_buffers_sample_on_the_device_as_before(device, tmp_path):
    """Device sampling reads rewards, terminations, stop flags and priorities kept on the
    device: a loaded buffer (plain n-step, host-prioritized, device-prioritized) rebuilds them,
    so the same seed draws the same batch with the same values as the saved buffer."""
    from rlkit.buffers import DevicePrioritizedReplayBuffer, PrioritizedReplayBuffer

    plain = ReplayBuffer(30, 3, 2, n_envs=2, seed=2, n_step=3)
    host_prioritized = PrioritizedReplayBuffer(30, 3, 2, n_envs=2, seed=2, alpha=0.5, beta=0.3)
    device_prioritized = DevicePrioritizedReplayBuffer(30, 3, 2, n_envs=2, seed=2, alpha=0.5, n_step=2)
    _rollout([plain, host_prioritized, device_prioritized], 19, 2, seed=8)  # wraps
    host_prioritized.update_priorities(np.arange(12), np.linspace(0.1, 3.0, 12))
    device_prioritized.update_priorities_on_device(rc.tensor(np.arange(12, dtype=np.int32)[None, :]),
                                                   rc.tensor(np.linspace(0.1, 3.0, 12, dtype=np.float32)[None, :]))
    for buf in (plain, device_prioritized):
        path = str(tmp_path / type(buf).__name__)
        buf.save(path)
        loaded = type(buf).load(path)
        batches = []
        for b in (buf, loaded):
            rc.manual_seed(3)
            batches.append(b.sample_on_device(64))
        for field in ("index", "obs", "reward", "next_obs", "done", "discount", "weights"):
            if getattr(batches[0], field) is not None:
                np.testing.assert_array_equal(getattr(batches[0], field).numpy(), getattr(batches[1], field).numpy(),
                                              err_msg=f"{type(buf).__name__}.{field}")
    path = str(tmp_path / "host_prioritized")
    host_prioritized.save(path)
    loaded = PrioritizedReplayBuffer.load(path)
    assert (loaded.alpha, loaded.beta) == (0.5, 0.3)
    a, b = host_prioritized.sample(32), loaded.sample(32)
    np.testing.assert_array_equal(a.index, b.index)
    np.testing.assert_array_equal(a.weights.numpy(), b.weights.numpy())

def test_truncated_or_corrupt_buffer_saves_are_refused(tmp_path):
    """Each file of a save is checked: a truncated field, one flipped bit in a field's data, a
    damaged host archive, a missing file or broken metadata each raise ValueError naming it."""
    buf = ReplayBuffer(40, 3, 2, n_envs=2, seed=2)
    _rollout([buf], 15, 2, seed=3)
    path = str(tmp_path / "saved")
    buf.save(path)

    def damaged(name, damage):
        copy = str(tmp_path / f"damaged-{name}-{damage.__name__}")
        shutil.copytree(path, copy)
        target = os.path.join(copy, name)
        with open(target, "rb") as f:
            data = bytearray(f.read())
        with open(target, "wb") as f:
            f.write(damage(data))
        return copy

    def truncate(data):
        return data[:len(data) // 2]

    def flip_last_bit(data):  # inside the data, past the .npy header
        data[-3] ^= 1
        return data

    for name, damage, message in (("obs.npy", truncate, "obs.npy cannot be read|obs.npy holds"),
                                  ("obs.npy", flip_last_bit, "obs.npy is corrupt"),
                                  ("action.npy", flip_last_bit, "action.npy is corrupt"),
                                  ("host.npz", flip_last_bit, "host.npz is truncated or corrupt"),
                                  ("meta.json", truncate, "not a saved replay buffer")):
        with pytest.raises(ValueError, match=message):
            ReplayBuffer.load(damaged(name, damage))
    os.remove(os.path.join(path, "next_obs.npy"))
    with pytest.raises(ValueError, match="next_obs.npy cannot be read"):
        ReplayBuffer.load(path)


# ---- what a save replaces, and what a killed save leaves -------------------------------------

def _small(seed=0) -> ReplayBuffer:
    buf = ReplayBuffer(20, 3, 2, n_envs=2, seed=seed)
    _rollout([buf], 7, 2, seed=seed)
    return buf


def _snapshot(folder) -> dict:
    """Every entry under ``folder``: its kind, mode and bytes (the link for a symlink)."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            entry = os.path.join(root, name)
            st = os.lstat(entry)
            body = (os.readlink(entry) if stat.S_ISLNK(st.st_mode) else
                    open(entry, "rb").read() if stat.S_ISREG(st.st_mode) else None)
            found[os.path.relpath(entry, folder)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), body)
    return found


def test_a_save_refuses_what_is_not_an_earlier_save_and_leaves_it_intact(tmp_path, monkeypatch):
    work = tmp_path / "work"
    (work / "checkpoints").mkdir(parents=True)
    (work / "checkpoints" / "model.safetensors").write_bytes(b"the model")
    (work / "notes.txt").write_text("notes")
    (work / "empty").mkdir()
    _small().save(str(work / "saved"))
    (work / "saved" / "model.safetensors").write_bytes(b"put beside a buffer")  # a save with a foreign file
    os.mkfifo(work / "fifo")
    before = _snapshot(tmp_path)
    buf = _small(seed=1)
    monkeypatch.chdir(work)
    for path, message in (("checkpoints", r"'checkpoints' exists and is not a replay-buffer save \(it holds "
                                          r"'model.safetensors'\); a save replaces only an earlier save"),
                          (".", r"'\.' exists and is not a replay-buffer save \(it holds 'checkpoints', 'empty', "
                                r"'fifo', \.\.\.\)"),
                          ("saved", "'saved' exists and is not a replay-buffer save"),
                          ("empty", r"'empty' exists and is not a replay-buffer save \(it holds nothing\)"),
                          ("notes.txt", "'notes.txt' is a regular file, not the folder of a replay buffer save"),
                          ("fifo", "'fifo' is a FIFO, not the folder"),
                          ("/dev/null", "'/dev/null' is a character device, not the folder")):
        with pytest.raises(FileExistsError, match=message):
            buf.save(path)
    assert _snapshot(tmp_path) == before  # byte for byte, and no temporary folder was made


def test_a_save_replaces_an_earlier_one_through_a_symlink_keeping_its_mode(tmp_path):
    _small().save(str(tmp_path / "real"))
    os.chmod(tmp_path / "real", 0o750)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    buf = _small(seed=4)
    buf.save(str(tmp_path / "link"))
    assert os.readlink(tmp_path / "link") == str(tmp_path / "real")
    assert stat.S_IMODE(os.stat(tmp_path / "real").st_mode) == 0o750
    assert sorted(os.listdir(tmp_path)) == ["link", "real"]
    assert _fingerprint(ReplayBuffer.load(str(tmp_path / "link"))) == _fingerprint(buf)


def test_a_save_of_the_format_before_the_marker_is_loaded_and_replaced(tmp_path):
    path = str(tmp_path / "replay")
    first = _small()
    first.save(path)
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    assert (meta.pop("format"), meta.pop("version")) == ("rlkit.replay_buffer", 1)
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump(meta, f)  # as saves wrote it before the marker
    assert _fingerprint(ReplayBuffer.load(path)) == _fingerprint(first)
    second = _small(seed=5)
    second.save(path)
    assert _fingerprint(ReplayBuffer.load(path)) == _fingerprint(second)
    meta["version"] = 2
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump({"format": "rlkit.replay_buffer", **meta}, f)
    with pytest.raises(ValueError, match="gives format rlkit.replay_buffer v2, expected rlkit.replay_buffer v1"):
        ReplayBuffer.load(path)


def test_a_save_removes_only_what_killed_saves_of_its_path_left(tmp_path):
    path = str(tmp_path / "replay")
    _small().save(path)
    ours = {".replay.replay-tmp-0123abcd": ["obs.npy"], ".replay.replay-old-89abcdef": ["obs.npy", "meta.json"]}
    kept = {".replay.replay-tmp-00000000": ["obs.npy", "notes.txt"],  # holds a file no save writes
            ".other.replay-tmp-0123abcd": ["obs.npy"],  # another path's
            ".replay.replay-tmp-scratch": ["obs.npy"]}  # not a name a save gives
    for folder, names in {**ours, **kept}.items():
        os.mkdir(tmp_path / folder)
        for name in names:
            (tmp_path / folder / name).write_bytes(b"left")
    before = _snapshot(tmp_path)
    _small(seed=1).save(path)
    after = _snapshot(tmp_path)
    assert sorted(name for name in os.listdir(tmp_path) if name != "replay") == sorted(kept)
    assert {k: v for k, v in after.items() if not k.startswith("replay")} == {
        k: v for k, v in before.items() if not k.startswith(("replay", *ours))}


def _fingerprint(buf: ReplayBuffer) -> str:
    """A SHA-256 of everything a buffer holds: its fields' data, host arrays and write position."""
    digest = hashlib.sha256(repr((buf.pos, buf.full, buf.capacity)).encode())
    for field in buf._device_fields().values():
        for col, k in buf._chunks(field, 4):
            digest.update(np.asfortranarray(field.read(col, k)).tobytes(order="F"))
    for host in (buf._reward, buf._terminated, buf._truncated):
        digest.update(host.tobytes())
    return digest.hexdigest()

@pytest.mark.parametrize("optimize_memory", [False, True])
def test_a_save_holds_the_steps_added_after_the_last_read(device, tmp_path, optimize_memory):
    buf = ReplayBuffer(30, 3, 2, n_envs=3, seed=2, optimize_memory=optimize_memory, n_step=2)
    history = _rollout([buf], 5, 3, seed=1)
    buf.sample(8)
    history += _rollout([buf], 9, 3, seed=2)  # wraps the 10-step lanes, none of it read yet
    buf.save(str(tmp_path / "replay"))
    loaded = ReplayBuffer.load(str(tmp_path / "replay"), device="cpu")
    expected = _expected_tables(history, buf)
    for name, values in _gathered_tables(loaded).items():
        np.testing.assert_array_equal(values, expected[name], err_msg=name)
