"""The host block cache (native/host_cache.hpp): a large tensor's freed block serves the next
tensor of its size, kept memory stays within its budget (oldest given back first), a reused
block holds no stale values where a kernel writes, and RLKIT_HOST_CACHE_MIB sets the budget
(0 keeps nothing; a bad value is refused with what was expected)."""

import gc
import multiprocessing
import os
import subprocess
import sys

import numpy as np
import pytest

import rlkit
import rlkit.core as rc
from rlkit import _native

MIB = 1 << 20


def _stats() -> dict:
    return _native.host_cache_stats()


def _fresh_cache() -> None:
    """Nothing kept, and no garbage of earlier tests left for a later collection to free."""
    gc.collect()
    _native.host_cache_clear()


def test_a_freed_large_block_serves_the_next_tensor_of_its_size():
    previous = rc.device("cpu")
    try:
        _fresh_cache()
        first = rc.full((MIB, 1), 7.0)  # 4 MiB
        del first
        gc.collect()
        kept, reused = _stats()["kept_bytes"], _stats()["reused_blocks"]
        second = rc.full((MIB, 1), 3.0)
        if _stats()["budget_bytes"] == 0:  # AddressSanitizer's build, or RLKIT_HOST_CACHE_MIB=0: nothing kept
            assert kept == 0 and _stats()["reused_blocks"] == reused
        else:
            assert kept == 4 * MIB and _stats()["reused_blocks"] == reused + 1 and _stats()["kept_bytes"] == 0
        np.testing.assert_array_equal(second.numpy(), np.full((MIB, 1), 3.0, np.float32))
    finally:
        rc.device(previous)


def test_small_blocks_are_left_to_malloc():
    previous = rc.device("cpu")
    try:
        _fresh_cache()
        small = rc.full((1000, 10), 1.0)  # 40 kB
        del small
        gc.collect()
        assert _stats()["kept_blocks"] == 0
    finally:
        rc.device(previous)


def test_a_reused_block_holds_no_stale_values():
    """scatter_cols sums columns into its output: on a block that held other values (a freed
    tensor of the same size) the result is numpy's all the same."""
    previous = rc.device("cpu")
    try:
        rows, columns = 512, 1024  # a 2 MiB output
        rng = np.random.default_rng(0)
        stale = rc.full((rows, columns), 1e30)
        del stale
        gc.collect()
        g = rng.normal(size=(rows, 300)).astype(np.float32)
        index = rng.integers(0, columns, size=300).astype(np.int32)
        out = rc.scatter_cols(rc.tensor(g), index, columns).numpy()
        expected = np.zeros((rows, columns), np.float32)
        np.add.at(expected.T, index, g.T)
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    finally:
        rc.device(previous)


def _run(code: str, budget_mib: str) -> subprocess.CompletedProcess:
    home = os.path.dirname(os.path.dirname(rlkit.__file__))
    env = dict(os.environ, RLKIT_HOST_CACHE_MIB=budget_mib,
               PYTHONPATH=os.pathsep.join(filter(None, [home, os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


KEEP_MANY = """
import gc, rlkit.core as rc
from rlkit import _native
sizes = [(1 << 18) * k for k in (1, 2, 3, 4, 5, 6)]  # 1 to 6 MiB
for n in sizes:
    t = rc.full((n, 1), 1.0, device="cpu")
    del t
    gc.collect()
    s = _native.host_cache_stats()
    print(s["budget_bytes"], s["kept_bytes"], s["kept_blocks"])
"""


def test_kept_memory_stays_within_the_budget_oldest_given_back_first():
    run = _run(KEEP_MANY, "8")
    assert run.returncode == 0, run.stderr
    rows = [tuple(int(v) for v in line.split()) for line in run.stdout.splitlines()]
    if rows[0][0] == 0:  # AddressSanitizer's build keeps nothing whatever the budget
        assert all(kept == 0 for _, kept, _ in rows)
        return
    budget = 8 * MIB
    assert all(row[0] == budget for row in rows)
    # kept after each free: 1; 1+2; 1+2+3 = 6; 4 pushes out 1 and 2 (3+4 = 7); 5 pushes out 3 and 4;
    # 6 pushes out 5
    assert [kept // MIB for _, kept, _ in rows] == [1, 3, 6, 7, 5, 6]
    assert [blocks for _, _, blocks in rows] == [1, 2, 3, 2, 1, 1]


def test_a_budget_of_zero_keeps_nothing_and_a_bad_one_is_refused():
    run = _run(KEEP_MANY, "0")
    assert run.returncode == 0, run.stderr
    assert all(line.split()[1] == "0" for line in run.stdout.splitlines())
    bad = _run("import rlkit.core as rc; rc.full((1 << 20, 1), 1.0, device='cpu')", "lots")
    assert bad.returncode != 0
    assert "RLKIT_HOST_CACHE_MIB must be a whole number of MiB (0 keeps no freed host memory), got 'lots'" in bad.stderr


def _child_sum(n: int) -> float:
    return float(rc.sum(rc.full((n, 1), 1.0, device="cpu")).item())


def test_a_forked_child_allocates_large_tensors():
    """The cache's lock is taken around a fork and released on both sides, so a child process
    (gymnasium's vector environments, multiprocessing) allocates as its parent does."""
    kept = rc.full((MIB, 1), 1.0, device="cpu")
    del kept
    gc.collect()  # a kept block, inherited by the child
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_child_sum, (MIB,)) == MIB
