"""Process-wide engine state: threads (results must not depend on the thread count), devices,
the default dtype, transfer counters and the random seed."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rlkit
import rlkit.core as rc
from rlkit import _native


@pytest.fixture(autouse=True)
def _restore_state():
    threads, dtype, device, rng = rc.get_num_threads(), rc.dtype(), rc.device(), rc.get_rng_state()
    yield
    rc.set_num_threads(threads)
    rc.dtype(dtype)
    rc.device(device)
    rc.set_rng_state(rng)


def rand(shape, seed, dtype=np.float32):
    return np.asfortranarray(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


# ---- threads -----------------------------------------------------------------------------

def at_thread_counts(fn, counts=(1, 2, 3)):
    """fn() computed with each thread count (a list of numpy results per count)."""
    results = {}
    for n in counts:
        rc.set_num_threads(n)
        assert rc.get_num_threads() == n
        results[n] = fn()
    return results


# Large enough that every kernel splits the work into several chunks.
X = rand((300, 700), 0)  # 210k elements
Y = rand((300, 700), 1)


@pytest.mark.parametrize(
    "name, fn, ref",
    [
        ("add", lambda x, y: x + y, lambda x, y: x + y),
        ("mul_exp", lambda x, y: rc.exp(x * 0.5) * y, lambda x, y: np.exp(x * 0.5) * y),
        ("tanh", lambda x, y: rc.tanh(x), lambda x, y: np.tanh(x)),
        ("broadcast_column", lambda x, y: x - rc.tensor(np.ascontiguousarray(Y[:, :1])), lambda x, y: x - y[:, :1]),
        ("broadcast_row", lambda x, y: x * rc.tensor(np.asfortranarray(Y[:1, :])), lambda x, y: x * y[:1, :]),
        ("sum_all", lambda x, y: rc.sum(x), lambda x, y: x.sum(keepdims=True)),
        ("sum_dim0", lambda x, y: rc.sum(x, 0), lambda x, y: x.sum(0, keepdims=True)),
        ("sum_dim1", lambda x, y: rc.sum(x, 1), lambda x, y: x.sum(1, keepdims=True)),
        ("softmax", lambda x, y: rc.softmax(x), lambda x, y: np.exp(x - x.max(0)) / np.exp(x - x.max(0)).sum(0)),
        ("transpose", lambda x, y: rc.transpose(x), lambda x, y: x.T),
    ],
)
def test_results_do_not_depend_on_the_thread_count(name, fn, ref):
    results = at_thread_counts(lambda: fn(rc.tensor(X), rc.tensor(Y)).numpy())
    np.testing.assert_array_equal(results[2], results[1])
    np.testing.assert_array_equal(results[3], results[1])
    expected = ref(X.astype(np.float64), Y.astype(np.float64))
    np.testing.assert_allclose(results[1], expected, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(expected).max()))


def test_matmul_512_agrees_across_thread_counts():
    a, b = rand((512, 512), 2), rand((512, 512), 3)
    results = at_thread_counts(lambda: (rc.tensor(a) @ rc.tensor(b)).numpy())
    expected = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(expected).max()
    for n in (1, 2, 3):
        np.testing.assert_allclose(results[n], expected, atol=1e-4 * scale)
        np.testing.assert_allclose(results[n], results[1], atol=1e-4 * scale)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("m, k, n", [(300, 700, 301), (2049, 513, 3), (5, 1024, 4097), (45, 1000, 9),
                                     (300, 400, 256)],
                         ids=["square", "tall: blocks of rows", "wide: blocks of columns",
                              "deep: chunks of the depth, a part tile", "tall, a batch of 256: blocks of columns"])
def test_products_split_into_blocks_are_identical_across_thread_counts(dtype, ta, tb, m, k, n):
    """The BLAS runs single-threaded on blocks of C (rows where C is tall and narrow, columns otherwise),
    shared out by rlkit's pool: any split equals numpy, and the bits do not depend on threads."""
    a = rand((k, m) if ta else (m, k), 5, dtype)
    b = rand((n, k) if tb else (k, n), 6, dtype)
    kind = "f32" if dtype == np.float32 else "f64"
    results = at_thread_counts(lambda: rc.matmul(rc.tensor(a, dtype=kind), rc.tensor(b, dtype=kind),
                                                 transpose_a=ta, transpose_b=tb).numpy())
    np.testing.assert_array_equal(results[2], results[1])
    np.testing.assert_array_equal(results[3], results[1])
    expected = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    tolerance = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(results[1], expected, atol=tolerance * np.abs(expected).max())


@pytest.mark.parametrize("ta", [False, True])
def test_deep_products_propagate_nan_and_infinity(ta):
    """A product deeper than one chunk of the CPU's AVX-512 path (DQN's 3136-input Linear): a NaN
    of A reaches every output of its row, an infinity of B every output of its column, and
    nothing else."""
    a, b = rand((3136, 70) if ta else (70, 3136), 8), rand((3136, 9), 9)
    a_nan = a.copy()
    a_nan[(2000, 33) if ta else (33, 2000)] = np.nan
    b[3000, 4] = np.inf
    out = rc.matmul(rc.tensor(a_nan), rc.tensor(b), transpose_a=ta).numpy()
    expected = (a_nan.T if ta else a_nan).astype(np.float64) @ b.astype(np.float64)
    assert np.isnan(out[33]).all()
    assert np.isinf(out[np.arange(70) != 33, 4]).all()
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isfinite(out), finite)
    np.testing.assert_allclose(out[finite], expected[finite], atol=1e-4 * np.abs(expected[finite]).max())


@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("m, k, n", [(257, 300, 1), (1, 300, 257), (6, 256, 1), (1, 1, 1), (1, 2049, 1)],
                         ids=["one column", "one row", "a small head on one column", "one element", "a deep dot"])
def test_products_with_one_row_or_column_equal_numpy(ta, tb, m, k, n):
    """A policy acting on one observation, a value head's row: C of one column or one row (the
    BLAS's gemv where one is loaded) equals numpy in every orientation, in a batch of slices
    too, the same bits on any number of threads; NaN and infinities propagate."""
    a = rand((k, m, 3) if ta else (m, k, 3), 10)
    b = rand((n, k, 3) if tb else (k, n, 3), 11)
    a[(k - 1, 0, 1) if ta else (0, k - 1, 1)] = np.nan  # C's row 0 of slice 1
    b[(n - 1, 0, 2) if tb else (0, n - 1, 2)] = np.inf  # C's column n - 1 of slice 2
    results = at_thread_counts(lambda: rc.matmul(rc.tensor(a), rc.tensor(b), transpose_a=ta, transpose_b=tb).numpy())
    np.testing.assert_array_equal(results[2], results[1])
    np.testing.assert_array_equal(results[3], results[1])
    for s in range(3):
        op_a = (a[:, :, s].T if ta else a[:, :, s]).astype(np.float64)
        op_b = (b[:, :, s].T if tb else b[:, :, s]).astype(np.float64)
        expected = op_a @ op_b
        out = results[1][:, :, s]
        np.testing.assert_array_equal(np.isnan(out), np.isnan(expected), err_msg=f"slice {s}")
        np.testing.assert_array_equal(np.isinf(out), np.isinf(expected), err_msg=f"slice {s}")
        finite = np.isfinite(expected)
        if finite.any():
            scale = max(1.0, np.abs(expected[finite]).max())
            np.testing.assert_allclose(out[finite], expected[finite], rtol=1e-5, atol=1e-5 * scale)
    assert np.isnan(results[1][0, :, 1]).all() and np.isinf(results[1][:, n - 1, 2]).any()


def test_mlp_forward_and_backward_agree_across_thread_counts():
    rng = np.random.default_rng(4)
    x = np.asfortranarray(rng.standard_normal((32, 1024)).astype(np.float32))
    target = np.asfortranarray(rng.standard_normal((8, 1024)).astype(np.float32))
    init = {
        "W1": rng.standard_normal((64, 32)) * 0.2, "b1": rng.standard_normal((64, 1)) * 0.1,
        "W2": rng.standard_normal((8, 64)) * 0.2, "b2": rng.standard_normal((8, 1)) * 0.1,
    }

    def step():
        p = {k: rc.param(v, name=k) for k, v in init.items()}
        with rc.grad_tape():
            h = rc.relu(p["W1"] @ rc.tensor(x) + p["b1"])
            out = rc.softmax(p["W2"] @ h + p["b2"])
            loss = rc.mse_loss(out, target)
        grads = rc.backward(loss)
        return loss.item(), {k: grads[k] for k in init}

    results = at_thread_counts(step)
    loss1, grads1 = results[1]
    for n in (2, 3):
        loss_n, grads_n = results[n]
        assert loss_n == pytest.approx(loss1, rel=1e-5)
        for k in init:
            scale = np.abs(grads1[k]).max()
            np.testing.assert_allclose(grads_n[k], grads1[k], atol=1e-4 * scale, err_msg=k)
    # and the values are right: a float64 numpy forward pass
    W1, b1, W2, b2 = (init[k] for k in ("W1", "b1", "W2", "b2"))
    h = np.maximum(W1 @ x + b1, 0)
    z = W2 @ h + b2
    out = np.exp(z - z.max(0)) / np.exp(z - z.max(0)).sum(0)
    assert loss1 == pytest.approx(np.mean((out - target) ** 2), rel=1e-4)


def _run_prints_ok(script: str, hang: str) -> None:
    """Runs ``script`` in a fresh interpreter importing the rlkit under test: it must print ok
    within 30 s (a hang fails the test with ``hang``)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(rlkit.__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        result = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True,
                                timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(hang)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_random_numbers_do_not_depend_on_the_thread_count():
    def draw():
        rc.manual_seed(11)
        return rc.randn((400, 300)).numpy()

    results = at_thread_counts(draw)
    np.testing.assert_array_equal(results[2], results[1])
    np.testing.assert_array_equal(results[3], results[1])


def test_changing_the_thread_count_between_ops_never_hangs():
    # Workers started by set_num_threads once ran a phantom job that corrupted the pool's
    # bookkeeping: now and then the next op waited forever (a race, so the loop runs for a few
    # seconds). A subprocess with a timeout turns a hang into a failure.
    script = textwrap.dedent(
        """
        import time
        import numpy as np, rlkit.core as rc
        data = np.asfortranarray(np.arange(256 * 256, dtype=np.float32).reshape(256, 256))
        x = rc.tensor(data)
        i, start = 0, time.perf_counter()
        while i < 1000 or time.perf_counter() - start < 3.0:
            rc.set_num_threads(2 + i % 7)
            y = x * 2.0
            i += 1
        assert np.array_equal(y.numpy(), data * 2)
        print("ok")
        """
    )
    _run_prints_ok(script, "an op hung after set_num_threads")


def test_a_parallel_for_inside_a_parallel_for_runs_inline():
    # A worker that started a job of its own waited for the job lock its caller held: a hang
    # (in a subprocess with a timeout, so a hang is a failure).
    script = textwrap.dedent(
        """
        from rlkit import _native
        for threads in (2, 3, 5):
            _native.set_num_threads(threads)
            for _ in range(20):
                assert _native.nested_parallel_count(5000, 9) == [9] * 5000
        print("ok")
        """
    )
    _run_prints_ok(script, "a nested parallel_for hung")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="per-thread counts are read from Linux's /proc")
def test_workers_a_job_does_not_want_stay_asleep():
    # Every job woke every worker (or restarted its spin), so the 14 workers of a 16-thread pool
    # that SAC's 2-block ops never want kept cores busy for nothing (SAC trained at 99-122 steps/s
    # on 16 threads against 131-152 on 2). Now a job wakes only its helpers, and a worker spins
    # only after a job it helped with. 256 x 256 products have 2 blocks: on 8 threads the caller
    # and worker 0 do the work, and the other 6 workers neither wake (a wake-up and the sleep
    # after it is a voluntary context switch) nor use CPU time.
    script = textwrap.dedent(
        """
        import os, time
        import numpy as np, rlkit.core as rc
        rc.set_num_threads(8)
        x = rc.tensor(np.asfortranarray(np.ones((256, 256), np.float32)))
        y = x @ x  # starts the workers
        tick = os.sysconf("SC_CLK_TCK")
        def per_thread():
            counts = {}
            for tid in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/self/task/{tid}/status") as f:
                    switches = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt"))
                counts[tid] = ((int(fields[11]) + int(fields[12])) / tick, switches)  # utime + stime
            return counts
        time.sleep(0.01)  # past the first job's spin
        before, start, jobs = per_thread(), time.perf_counter(), 0
        while jobs < 1000 or time.perf_counter() - start < 1.0:
            y = x @ x
            jobs += 1
        after, wall = per_thread(), time.perf_counter() - start
        assert float(y.numpy()[0, 0]) == 256.0
        others = [t for t in before if int(t) != os.getpid()]  # all but the caller, the main thread
        used = sorted(((after[t][1] - before[t][1], after[t][0] - before[t][0]) for t in others), reverse=True)
        idle = used[1:]  # all but worker 0, the thread that woke most
        assert len(idle) >= 6, used  # the 6 other workers, and threads of Python's or numpy's
        wakes, cpu = max(w for w, _ in idle), sum(c for _, c in idle)
        assert cpu < 0.1 * wall, f"idle workers used {cpu:.2f} s of CPU in {wall:.2f} s: {used}"
        assert wakes < 50, f"an idle worker woke {wakes} times in {jobs} jobs: {used}"
        print("ok")
        """
    )
    _run_prints_ok(script, "workers that no job wanted were woken")


def test_set_num_threads_rejects_bad_values():
    before = rc.get_num_threads()
    with pytest.raises(ValueError, match="must lie in"):
        rc.set_num_threads(0)
    with pytest.raises(ValueError):
        rc.set_num_threads(-2)
    with pytest.raises(ValueError, match="1024"):
        rc.set_num_threads(10**6)
    with pytest.raises(TypeError):
        rc.set_num_threads(2.0)
    with pytest.raises(TypeError):
        rc.set_num_threads(True)
    assert rc.get_num_threads() == before


def test_set_num_threads_accepts_numpy_ints():
    rc.set_num_threads(np.int64(1))
    assert rc.get_num_threads() == 1


# ---- devices ---------------------------------------------------------------------------

def test_device_defaults_to_cpu():
    assert rc.device() == "cpu"
    assert rc.device("cpu") == "cpu"  # returns the previous device
    assert rc.device() == "cpu"


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_without_a_vulkan_driver_the_gpu_is_a_clear_runtime_error():
    # The loader finds no driver: the module still imports, the CPU works, and asking for the
    # GPU says what to install.
    code = """
import numpy as np, rlkit.core as rc
print((rc.tensor(np.ones((2, 2))) * 2.0).numpy().sum())
try:
    rc.device("gpu")
except RuntimeError as e:
    print("ERROR", e)
print(rc.device(), len(rc.devices()))
"""
    result = _python(code, VK_DRIVER_FILES="/nonexistent.json", VK_ICD_FILENAMES="/nonexistent.json")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "8.0"
    assert lines[1].startswith("ERROR no GPU:")
    if _native.build_info()["vulkan"]:
        assert "mesa-vulkan-drivers" in lines[1]
    else:  # a CPU-only build says so, and how to get a build with the backend
        assert "no Vulkan backend" in lines[1] and "libvulkan-dev glslc" in lines[1]
    assert lines[2] == "cpu 1"


def test_rlkit_device_sets_the_default_device():
    result = _python("import rlkit.core as rc; print(rc.device())", RLKIT_DEVICE="cpu")
    assert result.stdout.strip() == "cpu", result.stderr
    result = _python("import rlkit.core as rc", RLKIT_DEVICE="tpu")
    assert result.returncode != 0 and "unknown device 'tpu'" in result.stderr


@pytest.mark.parametrize("name", ["tpu", "GPU", "cuda", "", 1])
def test_unknown_device_is_a_value_error(name):
    with pytest.raises(ValueError, match="unknown device"):
        rc.device(name)
    assert rc.device() == "cpu"


def test_devices_lists_the_cpu():
    rows = rc.devices()
    cpu = [r for r in rows if r["backend"] == "cpu"]
    assert len(cpu) == 1
    assert cpu[0]["name"] == "cpu"
    assert isinstance(cpu[0]["memory"], int) and cpu[0]["memory"] > 0
    assert {"name", "backend", "memory"} <= set(cpu[0])


# ---- dtype -----------------------------------------------------------------------------

def test_dtype_switch_returns_the_previous_one_and_applies_to_new_tensors():
    assert rc.dtype() == "f32"
    assert rc.dtype("f16") == "f32"
    assert rc.dtype() == "f16"
    data = np.array([[0.1, 1.0 / 3.0], [2.5, -7.25]])
    t, p = rc.tensor(data), rc.param(data)
    assert t.dtype == "f16" and p.dtype == "f16"
    np.testing.assert_array_equal(t.numpy(), data.astype(np.float16))
    assert rc.zeros((2, 2)).dtype == "f16" and rc.randn((2, 2)).dtype == "f16"
    assert (t * 2.0).dtype == "f16"
    assert rc.tensor(np.arange(3)).dtype == "i32"  # integer data stays i32
    assert rc.dtype("f64") == "f16"
    assert rc.tensor(data).dtype == "f64"
    np.testing.assert_array_equal(rc.tensor(data).numpy(), data)
    assert rc.dtype("f32") == "f64"
    assert rc.tensor(data).dtype == "f32"


def test_f16_default_trains_end_to_end():
    rc.dtype("f16")
    W = rc.param(np.full((2, 3), 0.5), name="W")
    x = np.ones((3, 4))
    with rc.grad_tape():
        loss = rc.mse_loss(W @ x, np.zeros((2, 4)))
    grads = rc.backward(loss)
    assert loss.dtype == "f16" and grads[W].dtype == np.float16
    # y = 1.5 everywhere: loss = 2.25, dL/dW = 2 * 1.5 * sum over 4 columns of x / 8 = 1.5
    assert loss.item() == 2.25
    np.testing.assert_array_equal(grads[W], np.full((2, 3), 1.5, np.float16))


@pytest.mark.parametrize("name", ["i32", "float32", "f8", "F16"])
def test_unknown_default_dtype_is_a_value_error(name):
    with pytest.raises(ValueError):
        rc.dtype(name)
    assert rc.dtype() == "f32"


# ---- transfer counters ------------------------------------------------------------------

def test_transfer_stats_has_the_four_counters_and_the_cpu_never_crosses():
    rc.transfer_stats(reset=True)
    x = rc.tensor(rand((64, 64), 5))
    (x @ x).numpy()
    stats = rc.transfer_stats()
    assert set(stats) == {"uploads", "downloads", "upload_bytes", "download_bytes"}
    assert stats == {"uploads": 0, "downloads": 0, "upload_bytes": 0, "download_bytes": 0}




# ---- random seed -------------------------------------------------------------------------

def test_manual_seed_makes_randn_reproducible():
    rc.manual_seed(1234)
    a1, b1 = rc.randn((50, 40)).numpy(), rc.randn((50, 40)).numpy()
    u1 = rc.rand((10, 10)).numpy()
    rc.manual_seed(1234)
    a2, b2 = rc.randn((50, 40)).numpy(), rc.randn((50, 40)).numpy()
    u2 = rc.rand((10, 10)).numpy()
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(b1, b2)
    np.testing.assert_array_equal(u1, u2)
    assert not np.array_equal(a1, b1)  # successive draws differ
    rc.manual_seed(1235)
    assert not np.array_equal(rc.randn((50, 40)).numpy(), a1)  # another seed differs


def test_randn_and_rand_distributions():
    rc.manual_seed(99)
    z = rc.randn((500, 400), dtype="f64").numpy()
    u = rc.rand((500, 400), dtype="f64").numpy()
    n = z.size
    assert abs(z.mean()) < 5 / np.sqrt(n)
    assert abs(z.std() - 1.0) < 5 / np.sqrt(2 * n)
    assert abs(np.mean(np.abs(z) < 1.0) - 0.6826894921) < 0.005
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / n)
    assert abs(np.mean(u < 0.25) - 0.25) < 0.005


@pytest.mark.parametrize("seed", [-1, 1.5, "1", True, None, 2**64, 2**70])
def test_manual_seed_rejects_bad_seeds(seed):
    with pytest.raises(ValueError):
        rc.manual_seed(seed)


def test_manual_seed_accepts_numpy_ints():
    rc.manual_seed(np.int64(21))
    a = rc.randn((5, 5)).numpy()
    rc.manual_seed(21)
    np.testing.assert_array_equal(rc.randn((5, 5)).numpy(), a)
