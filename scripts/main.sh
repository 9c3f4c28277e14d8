#!/usr/bin/env bash
# The main job: installs what is missing, then trains a small network on a synthetic task on
# the CPU and prints the loss as it falls.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/install.sh"
cd "$root/scripts"   # run the installed package, not the source tree
PYTHONSAFEPATH=1 python3 train_supervised.py "$@"
