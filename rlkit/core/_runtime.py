"""Process-wide engine state: the native module, the BLAS it calls, the default device and
dtype, threads, the random seed and host<->device transfer counters."""

from __future__ import annotations

import os
import warnings

from rlkit import _native

DTYPES = ("f32", "f16", "i32", "f64")
DEVICES = ("cpu", "gpu")

_state = {"device": "cpu", "dtype": "f32"}
_transfers = {"uploads": 0, "downloads": 0, "upload_bytes": 0, "download_bytes": 0}


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
    if name not in DEVICES:
        raise ValueError(f"unknown device {name!r}; expected one of {DEVICES}")
    if name == "gpu":
        raise RuntimeError(
            "the GPU (Vulkan) backend is not part of this build of rlkit yet; only 'cpu' is available"
        )
    _state["device"] = name
    return previous


def dtype(name: str | None = None) -> str:
    """Sets the default float dtype of new tensors and parameters ("f32", "f16" or "f64");
    returns the previous one. On the CPU, f16 is a storage format: ops compute in f32."""
    previous = _state["dtype"]
    if name is None:
        return previous
    if name not in ("f32", "f16", "f64"):
        raise ValueError(f"unknown default dtype {name!r}; expected 'f32', 'f16' or 'f64'")
    _state["dtype"] = name
    return previous


def devices() -> list[dict]:
    """What exists: one row per device with its name, backend and memory in bytes."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return [{"name": "cpu", "backend": "cpu", "memory": memory, "threads": _native.num_threads()}]


def set_num_threads(n: int) -> None:
    """Sets the number of threads of the CPU kernels and of the BLAS."""
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"set_num_threads: n must be an int, got {type(n).__name__}")
    _native.set_num_threads(n)


def get_num_threads() -> int:
    """The number of threads the CPU kernels use."""
    return _native.num_threads()


def manual_seed(seed: int) -> None:
    """Seeds the engine's random generator (rand, randn, sampling ops)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"manual_seed: seed must be a non-negative int, got {seed!r}")
    _native.manual_seed(seed & (2**64 - 1))


def transfer_stats(reset: bool = False) -> dict:
    """Counts and bytes of host<->device crossings since the last reset.

    The CPU backend computes where the data lives, so it never crosses: every count stays 0
    there. The Vulkan backend adds its uploads and downloads here.
    """
    stats = dict(_transfers)
    if reset:
        for key in _transfers:
            _transfers[key] = 0
    return stats
