#!/usr/bin/env bash
# Installs what is missing (with the test extras and, where it can, the Vulkan packages the GPU tests
# run on), then runs the whole test suite against the installed package. Extra arguments go to
# pytest. RLKIT_VULKAN=OFF tests a CPU-only build (every GPU test skips, with the reason).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RLKIT_EXTRAS=test RLKIT_VULKAN_PACKAGES=1 bash "$root/scripts/install.sh"
cd "$root"
# PYTHONSAFEPATH keeps the source tree off sys.path: the tests import the installed rlkit.
PYTHONSAFEPATH=1 python3 -m pytest -ra tests "$@"
