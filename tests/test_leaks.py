"""Creating and freeing tensors, device buffers, captures and tapes keeps process memory and
device memory flat (the hardening issue's leak check, a first part), on both backends."""

import gc
import os

import numpy as np

import rlkit.core as rc
from rlkit.buffers import DeviceBuffer
from rlkit.core import runtime


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _device_mib(device: str) -> float:
    return next(d.get("memory_in_use", 0) for d in rc.devices() if d["device"] == device) / 2**20


def _cycle(n: int) -> None:
    """Each round: a tensor and an op on it, a device buffer written and freed, and a capture
    traced and replayed; every tenth round also a parameter through a tape and backward."""
    for i in range(n):
        t = rc.tensor(np.random.rand(64, 64).astype(np.float32))
        rc.relu(t * 2.0)
        buffer = DeviceBuffer(8, 256)
        buffer.write(np.ones((8, 4), np.float32))
        buffer.free()
        captured = rc.capture(lambda x: rc.relu(x) * 2.0)
        captured(x=np.ones((4, 4), np.float32))
        if i % 10 == 0:
            w = rc.param(np.random.rand(8, 8))
            with rc.grad_tape():
                loss = rc.mean(rc.square(w @ rc.tensor(np.ones((8, 4), np.float32))))
            rc.backward(loss)
    gc.collect()
    rc.synchronize()


def test_memory_stays_flat_over_thousands_of_objects(device):
    _cycle(300)  # warm: pools, pipelines and allocator arenas reach their working size
    rss, on_device = _rss_mib(), _device_mib(device)
    followers = len(runtime._device_followers)
    _cycle(10_000)  # 10,000 tensors, buffers and captures; 1,000 tapes
    assert _rss_mib() - rss < 8.0, (rss, _rss_mib())  # under 1 KiB per round: no per-object leak
    assert _device_mib(device) - on_device < 1.0
    assert len(runtime._device_followers) <= followers + 1  # freed buffers leave no reference behind
