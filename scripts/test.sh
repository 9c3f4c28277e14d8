#!/usr/bin/env bash
# Installs what is missing (with the test extras), then runs the whole test suite against the
# installed package. Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RLKIT_EXTRAS=test bash "$root/scripts/install.sh"
cd "$root"
# PYTHONSAFEPATH keeps the source tree off sys.path: the tests import the installed rlkit.
PYTHONSAFEPATH=1 python3 -m pytest -ra tests "$@"
