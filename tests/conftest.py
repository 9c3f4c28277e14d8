"""Session-wide checks: with the Vulkan validation layer on (RLKIT_VK_VALIDATION=1, as CI runs),
any validation error reported during the session fails it."""

import rlkit.core as rc
from rlkit.core import _runtime


def pytest_sessionfinish(session, exitstatus):
    if not _runtime._state["gpu_used"]:
        return
    errors = rc.gpu_stats().get("validation_errors", 0)
    if errors:
        print(f"\nVulkan validation reported {errors} error(s) during the tests (see stderr)")
        session.exitstatus = 1
