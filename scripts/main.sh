#!/usr/bin/env bash
# The main job: installs what is missing, then trains DQN on CartPole-v1 on the CPU and prints
# the final evaluation of the full 50k-step run and where the TensorBoard logs are (--early-stop:
# stop at the first evaluation of 475 instead, which the output says).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/install.sh"
cd "$root/scripts"   # run the installed package, not the source tree
PYTHONSAFEPATH=1 python3 train_dqn.py --logdir "$root/runs" "$@"
