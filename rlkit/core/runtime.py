"""Process-wide engine state: the native module, the BLAS it calls, the default device and
dtype, threads, the random seed, host<->device transfer counters, and the capture being
recorded (which host work inside it refuses, and what ops register for its replays)."""

from __future__ import annotations

import contextlib
import numbers
import os
import warnings
import weakref

import numpy as np

from rlkit import _native

DTYPES = ("f32", "f16", "bf16", "i32", "f64")
FLOAT_DTYPES = ("f32", "f16", "bf16", "f64")
HALF_DTYPES = ("f16", "bf16")  # 16-bit float storage formats
MAX_THREADS = 1024
DEVICES = ("cpu", "gpu")

# gpu_used: the Vulkan context exists (it is created on the first use of the GPU, not at import);
# capture: the capture being recorded (an rlkit.core.capturing.Capture), or None
_state = {"device": "cpu", "dtype": "f32", "gpu_used": False, "capture": None}


def _load_blas() -> str:
    """Points the native matmul at scipy-openblas32 where it is installed; returns its path."""
    try:
        import scipy_openblas32
    except ImportError:
        warnings.warn(
            "scipy-openblas32 is not installed: matmul uses rlkit's built-in kernel, which is "
            "slower (pip install scipy-openblas32)",
            RuntimeWarning,
            stacklevel=3,
        )
        return ""
    lib_dir = scipy_openblas32.get_lib_dir()
    path = os.path.join(lib_dir, f"lib{scipy_openblas32.get_library()}.so")
    if not _native.load_blas(path):
        warnings.warn(f"could not load BLAS from {path}; using the built-in matmul kernel", RuntimeWarning, stacklevel=3)
        return ""
    return path


BLAS_PATH = _load_blas()


def device(name: str | None = None) -> str:
    """Sets the device new tensors are made on ("cpu" or "gpu"); returns the previous one.

    Called without a name, returns the current device and changes nothing.
    """
    previous = _state["device"]
    if name is None:
        return previous
    check_device(name)
    _state["device"] = name
    if name != previous:
        for ref in list(_device_followers):  # device buffers move with the default device
            method = ref()
            if method is None:
                _device_followers.discard(ref)
            else:
                method(name)
    return previous


# Weak references to methods of objects that live "on the current device" (device buffers),
# called with the new device when it changes; a collected object's reference removes itself
# (without that, every buffer ever made would leave a dead reference behind).
_device_followers: set = set()


def follow_device(method) -> None:
    """Calls ``method(new_device)`` whenever the default device changes, while its object lives."""
    _device_followers.add(weakref.WeakMethod(method, _device_followers.discard))


def free_memory(device: str) -> int:
    """Bytes a new allocation on ``device`` can use: the host's available memory, or the GPU's
    device-local heap less what rlkit holds there."""
    if device == "gpu":
        info = _native.gpu_info()
        return int(info["memory"] - info["memory_in_use"])
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].strip().split()[0]) * 1024


def check_device(name: str) -> str:
    """Raises ValueError for an unknown device name and RuntimeError, saying what to install,
    for a GPU that cannot be used here."""
    if name not in DEVICES:
        raise ValueError(f"unknown device {name!r}; expected one of {DEVICES}")
    if name == "gpu":
        reason = _native.gpu_unavailable_reason()
        if reason:
            raise RuntimeError(f"no GPU: {reason}")
        _state["gpu_used"] = True
    return name


def dtype(name: str | None = None) -> str:
    """Sets the default float dtype of new tensors and parameters ("f32", "f16", "bf16" or
    "f64"); returns the previous one. f16 and bf16 are storage formats: ops compute in f32,
    except GPU matmul and linear on a device with cooperative matrices of that type, which
    multiply the 16-bit values with f32 sums."""
    previous = _state["dtype"]
    if name is None:
        return previous
    if name not in FLOAT_DTYPES:
        raise ValueError(f"unknown default dtype {name!r}; expected one of {FLOAT_DTYPES}")
    _state["dtype"] = name
    return previous


def devices() -> list[dict]:
    """What exists: one row per device ("cpu", and "gpu" where Vulkan finds one) with its
    name, backend and memory in bytes."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    rows = [{"device": "cpu", "name": "cpu", "backend": "cpu", "memory": memory, "threads": _native.num_threads()}]
    if not _native.gpu_unavailable_reason():
        _state["gpu_used"] = True
        info = _native.gpu_info()
        rows.append({"device": "gpu", "name": info["name"], "backend": "vulkan", "memory": info["memory"],
                     "subgroup_size": info["subgroup_size"], "memory_in_use": info["memory_in_use"]})
    return rows


def synchronize() -> None:
    """Waits until the GPU has run everything recorded so far (a no-op on the CPU)."""
    if _state["gpu_used"]:
        _native.synchronize("gpu")


def set_num_threads(n: int) -> None:
    """Sets the number of threads of the CPU kernels and of the BLAS."""
    if not isinstance(n, numbers.Integral) or isinstance(n, (bool, np.bool_)):
        raise TypeError(f"set_num_threads: n must be an int, got {type(n).__name__}")
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"set_num_threads: n must lie in [1, {MAX_THREADS}], got {n}")
    _native.set_num_threads(int(n))


def get_num_threads() -> int:
    """The number of threads the CPU kernels use."""
    return _native.num_threads()


_host_rng = np.random.default_rng(0x5EED)


def manual_seed(seed: int) -> None:
    """Seeds the engine's random generators: the native one (rand, randn, sampling ops,
    dropout) and the host one that initialises module weights."""
    global _host_rng
    if not isinstance(seed, numbers.Integral) or isinstance(seed, (bool, np.bool_)) or not 0 <= seed < 2**64:
        raise ValueError(f"manual_seed: seed must be an int in [0, 2**64), got {seed!r}")
    _native.manual_seed(int(seed))
    _host_rng = np.random.default_rng(int(seed))


def get_rng_state() -> dict:
    """The state of both generators, JSON-serialisable (checkpoints save it)."""
    seed, counter = _native.rng_state()
    return {"native": [int(seed), int(counter)], "host": _host_rng.bit_generator.state}


def set_rng_state(state: dict) -> None:
    """Restores what get_rng_state returned."""
    try:
        seed, counter = state["native"]
        host = state["host"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"set_rng_state: expected the dict get_rng_state returns, got {state!r}") from exc
    _native.set_rng_state(int(seed), int(counter))
    _host_rng.bit_generator.state = host


def host_rng() -> np.random.Generator:
    """The generator module initialisers draw from (reseeded by manual_seed)."""
    return _host_rng


_TRANSFER_KEYS = ("uploads", "downloads", "upload_bytes", "download_bytes")


def transfer_stats(reset: bool = False) -> dict:
    """Counts and bytes of host<->device crossings since the last reset: uploads, downloads,
    upload_bytes and download_bytes. The CPU backend computes where the data lives, so it
    never crosses: its counts stay 0. ``reset`` also resets the counters of gpu_stats()."""
    counters = _native.gpu_counters(reset) if _state["gpu_used"] else {}
    return {key: int(counters.get(key, 0)) for key in _TRANSFER_KEYS}


def gpu_stats(reset: bool = False) -> dict:
    """The GPU's counters since the last reset: transfers as in transfer_stats, and submits,
    dispatches, barriers, recordings (captured programs' command buffers recorded: once per
    program, again only where a tensor it reads moved) and validation_errors (an empty dict
    where the GPU is unused)."""
    return {k: int(v) for k, v in _native.gpu_counters(reset).items()} if _state["gpu_used"] else {}


# ---- the capture being recorded -------------------------------------------------------------
# Here rather than in capturing.py because tensors, ops, optimizers and buffers ask for it, and
# capturing.py builds on all of them.

class CaptureError(RuntimeError):
    """The captured function did something a replay would not repeat."""


def active_capture():
    """The capture being recorded (an ``rlkit.core.capturing.Capture``), or None."""
    return _state["capture"]


@contextlib.contextmanager
def capture_scope(capture):
    """Makes ``capture`` the capture being recorded inside the block (captures do not nest)."""
    if _state["capture"] is not None:
        raise CaptureError("capture: captures do not nest")
    _state["capture"] = capture
    try:
        yield capture
    finally:
        _state["capture"] = None


def refuse_host_work(what: str) -> None:
    """Raises CaptureError while a capture is recorded: called by host reads and uploads."""
    if _state["capture"] is not None:
        raise CaptureError(
            f"capture: the traced function {what}; a replay runs only the recorded ops and would not repeat it "
            "(pass host data as a named input, and read values from the captured function's outputs)"
        )


def check_replay_input(t, check) -> None:
    """While a capture is recorded, its ``check_input``: the eager check an op runs on host
    data, run on the values of the tensor ``t`` at every replay when ``t`` is an input of the
    captured function; nothing otherwise."""
    if _state["capture"] is not None:
        _state["capture"].check_input(t, check)


def _default_from_environment() -> None:
    """RLKIT_DEVICE=gpu (or cpu) sets the default device at import."""
    requested = os.environ.get("RLKIT_DEVICE")
    if requested:
        _state["device"] = check_device(requested.strip().lower())


_default_from_environment()
