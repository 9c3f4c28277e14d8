"""Checkpoints: round trips, atomic saves, and refusal of truncated, corrupt or foreign files."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from safetensors.numpy import save_file

import rlkit.core as rc
from rlkit.checkpoint import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from rlkit.core import nn, optim, sched


def _setup(seed=0):
    rc.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 5, activation="relu"), nn.BatchNorm(5), nn.Linear(5, 2))
    opt = optim.Adam(model.parameters(), lr=0.01)
    scheduler = sched.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, scheduler


def _train(model, opt, scheduler, steps, seed=1):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        x = rc.tensor(rng.standard_normal((3, 8)))
        with rc.grad_tape():
            loss = rc.mse_loss(model(x), rng.standard_normal((2, 8)).astype(np.float32))
        opt.step(rc.backward(loss))
        opt.zero_grad()
        scheduler.step()


def test_round_trip_restores_model_optimizer_scheduler_and_step(tmp_path):
    model, opt, scheduler = _setup()
    _train(model, opt, scheduler, 3)
    path = str(tmp_path / "ckpt.safetensors")
    save_checkpoint(path, {"model": model, "optimizer": opt, "scheduler": scheduler}, step=3,
                    metadata={"note": "three steps"})
    model2, opt2, scheduler2 = _setup(seed=99)
    info = load_checkpoint(path, {"model": model2, "optimizer": opt2, "scheduler": scheduler2})
    assert info == {"step": 3, "metadata": {"note": "three steps"}}
    for (name, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert opt2.lr == opt.lr and scheduler2.last_step == scheduler.last_step
    _train(model, opt, scheduler, 2, seed=5)
    _train(model2, opt2, scheduler2, 2, seed=5)
    for (name, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_truncated_and_corrupt_files_are_refused(tmp_path):
    model, opt, scheduler = _setup()
    path = str(tmp_path / "ckpt.safetensors")
    save_checkpoint(path, {"model": model, "optimizer": opt})
    payload = open(path, "rb").read()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(payload[: len(payload) - 17])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        read_checkpoint(str(truncated))
    flipped = bytearray(payload)
    flipped[-5] ^= 0x40  # one bit of one weight
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="checksum"):
        read_checkpoint(str(corrupt))
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00" * 3)
    with pytest.raises(CheckpointError):
        read_checkpoint(str(garbage))
    with pytest.raises(CheckpointError, match="no checkpoint"):
        read_checkpoint(str(tmp_path / "absent.safetensors"))
    foreign = str(tmp_path / "foreign.safetensors")
    save_file({"w": np.zeros(3, np.float32)}, foreign)
    with pytest.raises(CheckpointError, match="not an rlkit checkpoint"):
        read_checkpoint(foreign)


def test_a_failing_load_leaves_every_object_as_it_was(tmp_path):
    model, opt, _ = _setup()
    path = str(tmp_path / "ckpt.safetensors")
    save_checkpoint(path, {"model": model, "optimizer": opt})
    other_model, _, _ = _setup(seed=5)
    wrong_opt = optim.SGD(other_model.parameters())  # its type does not match the saved Adam state
    before = other_model.state_dict()
    with pytest.raises(ValueError, match="Adam state cannot load into SGD"):
        load_checkpoint(path, {"model": other_model, "optimizer": wrong_opt})
    for name, value in other_model.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)  # the model was rolled back
    with pytest.raises(KeyError, match="no state for \\['scheduler'\\]"):
        load_checkpoint(path, {"scheduler": sched.StepLR(opt, 1)})


def test_a_crash_mid_save_keeps_the_previous_checkpoint_and_the_next_save_cleans_up(tmp_path):
    path = str(tmp_path / "ckpt.safetensors")
    model, opt, _ = _setup()
    save_checkpoint(path, {"model": model}, step=1)
    # A child process starts a save and is killed while writing (its write blocks forever).
    script = textwrap.dedent(f"""
        import os, signal, threading, time
        import rlkit.checkpoint as ck
        import rlkit.core as rc
        from rlkit.core import nn
        real_fdopen = os.fdopen
        class Stalled:
            def __init__(self, f): self.f = f
            def __enter__(self): return self
            def __exit__(self, *a): return False
            def write(self, data):
                self.f.write(data[: len(data) // 2]); self.f.flush()
                print("writing", flush=True); time.sleep(60)
        ck.os.fdopen = lambda fd, mode: Stalled(real_fdopen(fd, mode))
        ck.save_checkpoint({path!r}, {{"model": nn.Linear(50, 50)}}, step=2)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    proc.kill()
    proc.wait()
    contents = read_checkpoint(path)
    assert contents["step"] == 1
    assert {k: v.shape for k, v in contents["states"]["model"].items()} == {
        k: v.shape for k, v in model.state_dict().items()}
    assert _temp_files(tmp_path) == 1  # the killed save's temporary file; the checkpoint itself is intact
    save_checkpoint(path, {"model": model}, step=3)
    assert read_checkpoint(path)["step"] == 3
    assert _temp_files(tmp_path) == 0  # the next save of the same file removed it


def _temp_files(folder) -> int:
    return sum(name.startswith(".ckpt.safetensors.ckpt-") for name in os.listdir(folder))


def test_bad_save_arguments(tmp_path):
    with pytest.raises(ValueError, match="non-empty"):
        save_checkpoint(str(tmp_path / "x"), {})
    with pytest.raises(TypeError, match="no state_dict"):
        save_checkpoint(str(tmp_path / "x"), {"model": object()})

    class Odd:
        def state_dict(self):
            return {"f": lambda: 0}

    with pytest.raises(TypeError, match="cannot store a function"):
        save_checkpoint(str(tmp_path / "x"), {"odd": Odd()})
    assert not os.path.exists(tmp_path / "x")


# ---- what a save replaces, and what a load reads ---------------------------------------------

def test_a_save_keeps_the_replaced_files_mode_and_a_new_file_gets_the_umasks(tmp_path):
    model, _, _ = _setup()
    path = str(tmp_path / "ckpt.safetensors")
    previous = os.umask(0o027)
    try:
        save_checkpoint(path, {"model": model})
        assert os.stat(path).st_mode & 0o777 == 0o640  # 0o666 less the umask, not mkstemp's 0o600
        os.chmod(path, 0o604)
        save_checkpoint(path, {"model": model}, step=2)
    finally:
        os.umask(previous)
    assert os.stat(path).st_mode & 0o777 == 0o604 and read_checkpoint(path)["step"] == 2


def test_a_save_through_a_symlink_replaces_its_target_and_keeps_the_link(tmp_path):
    model, _, _ = _setup()
    (tmp_path / "store").mkdir()
    (tmp_path / "links").mkdir()
    target, link = tmp_path / "store" / "ckpt.safetensors", tmp_path / "links" / "latest.safetensors"
    save_checkpoint(str(target), {"model": model}, step=1)
    link.symlink_to(target)
    save_checkpoint(str(link), {"model": model}, step=2)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert read_checkpoint(str(target))["step"] == 2
    assert os.listdir(tmp_path / "links") == ["latest.safetensors"]  # the temporary file was beside the target
    dangling = tmp_path / "links" / "next.safetensors"
    dangling.symlink_to(tmp_path / "store" / "next.safetensors")
    save_checkpoint(str(dangling), {"model": model}, step=3)  # a link to a file not written yet: written there
    assert dangling.is_symlink() and read_checkpoint(str(tmp_path / "store" / "next.safetensors"))["step"] == 3


def test_a_save_refuses_directories_devices_and_fifos(tmp_path):
    model, _, _ = _setup()
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"someone's model")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in ((folder, "a directory"), ("/dev/null", "a character device"), (fifo, "a FIFO")):
        with pytest.raises(FileExistsError, match=f"is {kind}, not a regular file"):
            save_checkpoint(str(path), {"model": model})
    assert os.listdir(folder) == ["model.safetensors"]
    assert (folder / "model.safetensors").read_bytes() == b"someone's model"
    assert sorted(os.listdir(tmp_path)) == ["checkpoints", "fifo"]  # no temporary file left by the refusals


def test_a_save_removes_only_its_own_files_leftover_temporary_files(tmp_path):
    model, _, _ = _setup()
    kept = [".other.safetensors.ckpt-0123abcd",  # another checkpoint's
            ".ckpt-k2j4_x9q",  # the old naming, which names no target
            ".ckpt.safetensors.ckpt-notes.txt"]  # not a name a save writes
    for name in [".ckpt.safetensors.ckpt-0123abcd", *kept]:
        (tmp_path / name).write_bytes(b"left")
    (tmp_path / ".ckpt.safetensors.ckpt-89abcdef").mkdir()  # a directory is never removed
    save_checkpoint(str(tmp_path / "ckpt.safetensors"), {"model": model})
    assert sorted(os.listdir(tmp_path)) == sorted(["ckpt.safetensors", ".ckpt.safetensors.ckpt-89abcdef", *kept])


def _bytes_read() -> int:
    """Bytes this process has read through read(2) and the like so far (Linux /proc)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def test_a_load_reads_a_bounded_header_before_anything_else(tmp_path):
    from rlkit.agents import DQN

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer: refused without waiting
    for path, kind in (("/dev/zero", "a character device"), (str(fifo), "a FIFO"), (str(tmp_path), "a directory")):
        with pytest.raises(CheckpointError, match=f"is {kind}, not a checkpoint file"):
            read_checkpoint(path)
    before = _bytes_read()
    with pytest.raises(CheckpointError, match="is a character device"):
        DQN.load("/dev/zero")
    claims_too_much = tmp_path / "huge_header.safetensors"
    claims_too_much.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(CheckpointError, match="header of 1099511627776 bytes, the file has 10 bytes"):
        read_checkpoint(str(claims_too_much))
    sparse = tmp_path / "sparse.safetensors"  # 4 GiB that take no disk: a short header that is no JSON
    with open(sparse, "wb") as f:
        f.write((16).to_bytes(8, "little") + b"not a json head!")
        f.truncate(4 << 30)
    with pytest.raises(CheckpointError, match="its header is not JSON"):
        read_checkpoint(str(sparse))
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": np.zeros(1 << 20, np.float32)}, str(foreign))  # 4 MiB of data under a foreign header
    with pytest.raises(CheckpointError, match="not an rlkit checkpoint"):
        read_checkpoint(str(foreign))
    assert _bytes_read() - before < 1 << 20  # none of those files' data was read
