"""Shared fixtures and session-wide checks.

``device`` runs a test once per backend (the GPU where Vulkan finds one; RLKIT_REQUIRE_GPU=1
makes its absence an error, as CI sets); ``on_gpu`` makes the GPU the default device with new GPU
memory poisoned. With the Vulkan validation layer on
(RLKIT_VK_VALIDATION=1, as CI runs), any validation error reported during the session fails it.
"""

import os

import pytest

import rlkit.core as rc
from rlkit import _native
from rlkit.core import _runtime

GPU_UNAVAILABLE = _native.gpu_unavailable_reason()  # why the GPU cannot be used here; "" where it can
DEVICES = ["cpu"] + ([] if GPU_UNAVAILABLE else ["gpu"])
if GPU_UNAVAILABLE and os.environ.get("RLKIT_REQUIRE_GPU") == "1":
    raise RuntimeError(f"RLKIT_REQUIRE_GPU=1 but the GPU backend is unavailable: {GPU_UNAVAILABLE}")


@pytest.fixture
def on_gpu():
    """Makes the GPU the default device and poisons new GPU memory for the test (NaN shows
    output elements a kernel left unwritten); skips the test, with the reason, where there is no
    GPU backend."""
    if GPU_UNAVAILABLE:
        pytest.skip(f"needs the GPU backend: {GPU_UNAVAILABLE}")
    previous = rc.device("gpu")
    _native.set_gpu_poison(True)
    yield
    _native.set_gpu_poison(False)
    rc.device(previous)


@pytest.fixture(params=DEVICES)
def device(request):
    """The default device for the test, restored afterwards."""
    previous = rc.device(request.param)
    yield request.param
    rc.device(previous)


def pytest_sessionfinish(session, exitstatus):
    if not _runtime._state["gpu_used"]:
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
