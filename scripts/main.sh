#!/usr/bin/env bash
# The main job: installs what is missing, then trains DQN on CartPole-v1 on the CPU and prints
# the evaluation return and where the TensorBoard logs are.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/install.sh"
cd "$root/scripts"   # run the installed package, not the source tree
PYTHONSAFEPATH=1 python3 train_dqn.py --logdir "$root/runs" "$@"
