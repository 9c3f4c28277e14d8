"""Shared fixtures, the GPU marker and session-wide checks.

One way to say a test needs the GPU: ``@pytest.mark.requires_gpu`` (or ``pytestmark`` for a
whole file). Where the Vulkan backend cannot be used, such a test is skipped with the reason
(RLKIT_REQUIRE_GPU=1 makes the backend's absence an error instead, as CI sets). ``DEVICES``
parametrizes a test over both backends, its GPU case carrying the marker, so a CPU-only machine
lists the GPU cases as skipped rather than leaving them out; ``AVAILABLE_DEVICES`` is for a test
that compares the backends it finds. The ``device`` fixture runs a test once per backend;
``on_gpu`` makes the GPU the default device with new GPU memory poisoned. With the Vulkan
validation layer on (RLKIT_VK_VALIDATION=1, as CI runs), any validation error reported during
the session fails it. New host tensor memory is poisoned for the whole session (0xff bytes, NaN
in every float dtype), so an output element a CPU kernel leaves unwritten shows, whether its
block is new or a freed one reused (native/host_cache.hpp).

``--gpu-tests-only`` runs only what can touch the GPU: the tests marked ``requires_gpu`` and
every test of a file that names the GPU otherwise (``AVAILABLE_DEVICES``, ``GPU_UNAVAILABLE`` or
the device name "gpu"). CI runs the Vulkan build so, since the whole suite runs on its CPU-only
build (.ci/run): the rest would run the same CPU code twice.
"""

import os

import pytest

import rlkit.core as rc
from rlkit import _native
from rlkit.core import runtime

GPU_UNAVAILABLE = _native.gpu_unavailable_reason()  # why the GPU cannot be used here; "" where it can
if GPU_UNAVAILABLE and os.environ.get("RLKIT_REQUIRE_GPU") == "1":
    raise RuntimeError(f"RLKIT_REQUIRE_GPU=1 but the GPU backend is unavailable: {GPU_UNAVAILABLE}")
_native.set_host_poison(True)
DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.requires_gpu)]
AVAILABLE_DEVICES = ["cpu"] + ([] if GPU_UNAVAILABLE else ["gpu"])


GPU_NAMES = ("AVAILABLE_DEVICES", "GPU_UNAVAILABLE", '"gpu"', "'gpu'")
"""What a test file that compares or uses the backends without the marker contains."""


def pytest_addoption(parser):
    parser.addoption("--gpu-tests-only", action="store_true",
                     help="run only the tests that can touch the GPU (conftest.py says which)")


def _names_the_gpu(path, seen: dict) -> bool:
    if path not in seen:
        with open(path) as f:
            source = f.read()
        seen[path] = any(name in source for name in GPU_NAMES)
    return seen[path]


def _keep_gpu_tests(config, items) -> None:
    seen: dict = {}
    kept, dropped = [], []
    for item in items:
        gpu = item.get_closest_marker("requires_gpu") is not None or _names_the_gpu(str(item.path), seen)
        (kept if gpu else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_runtest_setup(item):
    """Skips a test marked ``requires_gpu``, with the reason, where the GPU backend is unavailable."""
    if GPU_UNAVAILABLE and item.get_closest_marker("requires_gpu") is not None:
        pytest.skip(f"needs the GPU backend: {GPU_UNAVAILABLE}")


@pytest.fixture
def on_gpu():
    """Makes the GPU the default device and poisons new GPU memory for the test (NaN shows
    output elements a kernel left unwritten). A test using it is marked ``requires_gpu``
    (pytest_collection_modifyitems), so it skips, with the reason, where there is no GPU backend."""
    previous = rc.device("gpu")
    _native.set_gpu_poison(True)
    yield
    _native.set_gpu_poison(False)
    rc.device(previous)


@pytest.fixture
def submits_only_when_read():
    """An eager GPU recording goes to the GPU only when read, synchronized or 4096 commands long,
    not also once the host has spent 200 microseconds on it: for tests that count submits, which
    a slow host (the validation layer, a sanitizer) would otherwise split."""
    previous = _native.set_gpu_submit_after(0)
    yield
    _native.set_gpu_submit_after(previous)


@pytest.fixture(params=DEVICES)
def device(request):
    """The default device for the test, restored afterwards."""
    previous = rc.device(request.param)
    yield request.param
    rc.device(previous)


def pytest_collection_modifyitems(config, items):
    """A test that uses the ``on_gpu`` fixture needs the GPU, whether or not it says so. A slow
    test may not need the GPU: CI runs the slow tests once, on its CPU-only build (.ci/run)."""
    for item in items:
        if "on_gpu" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.requires_gpu)
    if config.getoption("--gpu-tests-only"):
        _keep_gpu_tests(config, items)
    slow_gpu = [item.nodeid for item in items if item.get_closest_marker("slow") and item.get_closest_marker("requires_gpu")]
    if slow_gpu:
        raise pytest.UsageError(f"tests marked both slow and requires_gpu (CI would never run them): {slow_gpu}")


def pytest_sessionfinish(session, exitstatus):
    if not runtime._state["gpu_used"]:
        return
    errors = rc.gpu_stats().get("validation_errors", 0)
    if errors:
        print(f"\nVulkan validation reported {errors} error(s) during the tests (see stderr)")
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    """Prints how many cases each property of test_properties.py and test_sizes.py ran."""
    import sys

    counts = {}
    for name in ("test_properties", "test_sizes"):
        module = sys.modules.get(name) or sys.modules.get(f"tests.{name}")
        counts.update(module.CASES_RUN if module is not None else {})
    if not counts:
        return
    terminalreporter.write_sep("-", "property-based cases run (hypothesis)")
    for name, count in sorted(counts.items()):
        terminalreporter.write_line(f"{count:6d}  {name}")
