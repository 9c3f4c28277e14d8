"""ReplayBuffer.save under SIGKILL: a save killed at each step of its swap, and at random moments,
leaves the earlier or the new save loadable, and the next save removes what the kill left."""

import inspect
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import rlkit
from rlkit.buffers import ReplayBuffer

from test_replay_files import _fingerprint, _small


def _big_buffer(seed: int, n_envs: int, steps: int, rows: int) -> ReplayBuffer:
    """A CPU buffer of ``n_envs * steps`` transitions with ``rows`` observation rows, its values
    drawn from ``seed`` (cheaply: one random block, shifted at each step)."""
    buf = ReplayBuffer(n_envs * steps, rows, 2, n_envs=n_envs, seed=seed, device="cpu")
    base = np.random.default_rng(seed).standard_normal((n_envs, rows), dtype=np.float32)
    for step in range(steps):
        obs = base + np.float32(step)
        buf.add(obs, obs[:, :2], obs[:, 0], obs[:, ::-1], base[:, 1] > 1.5, base[:, 2] > 1.5)
    buf.flush()
    return buf


_SAVER = """
import json, os, signal, sys, time, traceback

import numpy as np

import rlkit.buffers.replay_files as replay_files
import rlkit.buffers.save_folders as save_folders
from rlkit.buffers import ReplayBuffer

{builder}

def kill_after(owner, name, calls):
    '''SIGKILL this process right after the calls-th call of owner.name returns.'''
    real, count = getattr(owner, name), [0]

    def wrapped(*args, **kwargs):
        result = real(*args, **kwargs)
        count[0] += 1
        if count[0] == calls:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(owner, name, wrapped)


print("ready", flush=True)
while line := sys.stdin.readline():
    seed, path, hook = json.loads(line)
    if len(os.listdir("/proc/self/task")) != 1:
        raise RuntimeError("the saver forks: it must have no thread but its main one")
    pid = os.fork()
    if pid == 0:
        try:
            buf = _big_buffer(seed, *{shape})
            exec(hook)
            print(f"saving {{os.getpid()}}", flush=True)
            start = time.perf_counter()
            buf.save(path)
            print(f"saved {{time.perf_counter() - start}}", flush=True)
        except BaseException:
            print("failed: " + traceback.format_exc().replace("\\n", " | "), flush=True)  # never a silent hang
        finally:
            os._exit(0)
    sys.stdin.readline()  # the parent's go-ahead: until it is reaped the pid names no other process
    print(f"exit {{os.waitpid(pid, 0)[1]}}", flush=True)
"""


class _Saver:
    """A child process that imports rlkit once and forks a process for each save (a fresh
    interpreter would spend seconds importing per kill): ``start`` has one build
    ``_big_buffer(seed, *shape)`` and save it to a path, after a Python statement (a hook that kills it
    at a chosen step); the caller may SIGKILL it by its pid, then ``reap`` gives its wait status."""

    def __init__(self, shape):
        rlkit_home = os.path.dirname(os.path.dirname(rlkit.__file__))  # the child imports the rlkit under test
        source = _SAVER.format(builder=inspect.getsource(_big_buffer), shape=tuple(shape))
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1",  # no BLAS threads: safe to fork
               "PYTHONPATH": os.pathsep.join(filter(None, [rlkit_home, os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen([sys.executable, "-c", source], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env)
        assert self.process.stdout.readline() == "ready\n"

    def start(self, seed: int, path: str, hook: str = "pass") -> int:
        self.process.stdin.write(json.dumps([seed, path, hook]) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line.startswith("saving "), line or "the saver ended"
        return int(line.split()[1])

    def reap(self) -> tuple[int, float | None]:
        """The wait status of the latest save's process, and its save's seconds if it finished."""
        self.process.stdin.write("reap\n")
        self.process.stdin.flush()
        seconds = None
        while not (line := self.process.stdout.readline()).startswith("exit "):
            assert line.startswith("saved "), line or "the saver ended"
            seconds = float(line.split()[1])
        return int(line.split()[1]), seconds

    def close(self) -> None:
        self.process.stdin.close()
        assert self.process.wait() == 0


def _leftovers(folder) -> list[str]:
    """The kinds (tmp, old) of the folders that saves left in ``folder``, sorted."""
    return sorted(name.split(".replay-")[1].split("-")[0] for name in os.listdir(folder) if ".replay-" in name)


# (where the save is killed, the save that must load, what it leaves beside the path)
_SWAP_STEPS = [
    ("kill_after(replay_files, 'fsync_path', 1)", "earlier", ["tmp"]),  # one field written
    ("kill_after(save_folders.os, 'rename', 1)", "new", ["old", "tmp"]),  # the earlier save moved aside
    ("kill_after(save_folders.os, 'rename', 2)", "new", ["old"]),  # the new one in place
    ("kill_after(save_folders.shutil.os, 'unlink', 1)", "new", ["old"]),  # the earlier one part removed
]


def test_a_save_killed_at_each_step_of_the_swap_leaves_a_loadable_save(tmp_path):
    """A save is killed at each moment of the swap; the path (or, with the path missing, the
    whole save left beside it) loads as the earlier or the new save, and the next save removes
    every folder the killed one left."""
    shape = (2, 12, 3)
    earlier, new, next_one = (_fingerprint(_big_buffer(seed, *shape)) for seed in (1, 2, 3))
    saver = _Saver(shape)
    for step, (hook, expected, left) in enumerate(_SWAP_STEPS):
        folder = tmp_path / str(step)
        folder.mkdir()
        path = str(folder / "replay")
        _big_buffer(1, *shape).save(path)
        saver.start(2, path, hook)
        status, _ = saver.reap()
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, hook
        assert _leftovers(folder) == left, hook
        assert os.path.exists(path) == (step != 1), hook
        assert _fingerprint(ReplayBuffer.load(path)) == (earlier if expected == "earlier" else new), hook
        _big_buffer(3, *shape).save(path)
        assert os.listdir(folder) == ["replay"], hook
        assert _fingerprint(ReplayBuffer.load(path)) == next_one, hook
    saver.close()


@pytest.mark.slow
def test_a_save_killed_at_random_moments_leaves_the_earlier_or_the_new_save(tmp_path):
    """12 saves of 200 MB, each killed with SIGKILL at a random moment (uniform over the time a
    whole save took, and a fifth more); every time the path loads as the save before or the one
    killed, and the next save removes what the kills left."""
    shape = (1000, 100, 250)  # 100,000 transitions of 250 observation rows: 200 MB of observations
    path, rng = str(tmp_path / "replay"), np.random.default_rng(0)
    seed_of = {_fingerprint(_big_buffer(seed, *shape)): seed for seed in (1, 2)}
    _big_buffer(1, *shape).save(path)
    saver = _Saver(shape)
    saver.start(2, path)
    status, duration = saver.reap()  # a whole save: what the kill times spread over
    assert status == 0 and duration is not None
    saved, outcomes = 2, {"earlier": 0, "new": 0}
    for trial in range(12):
        other = 3 - saved
        pid = saver.start(other, path)
        time.sleep(rng.uniform(0, 1.2 * duration))
        os.kill(pid, signal.SIGKILL)  # a zombie if it has finished: it is reaped only below
        saver.reap()
        seed = seed_of.get(_fingerprint(ReplayBuffer.load(path, device="cpu")))
        assert seed in (saved, other), f"trial {trial}: the path loads as neither save"
        outcomes["new" if seed == other else "earlier"] += 1
        saved = seed
    saver.close()
    print(f"12 kills, a whole save taking {duration:.2f} s: the path loaded as {outcomes}")
    _small().save(path)
    assert os.listdir(tmp_path) == ["replay"]
