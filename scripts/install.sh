#!/usr/bin/env bash
# Installs whatever rlkit needs that this machine lacks, then builds and installs rlkit itself.
# Sourced or run from anywhere; works as root on a fresh Debian/Ubuntu machine (as CI runs)
# and says what is missing where it cannot install it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
extras=${RLKIT_EXTRAS:-}   # e.g. "test"

say() { echo "[rlkit install] $*"; }
missing() { echo "[rlkit install] MISSING: $*" >&2; exit 1; }

# A C++17 compiler and Python's headers build the native module.
need_apt=()
command -v python3 >/dev/null || need_apt+=(python3 python3-dev python3-pip)
command -v g++ >/dev/null || command -v c++ >/dev/null || need_apt+=(g++)
python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing Debian packages: ${need_apt[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    missing "${need_apt[*]} (install them with your package manager, or run this as root on Debian/Ubuntu)"
  fi
fi
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' || missing "Python 3.10 or newer (found $(python3 --version))"

pip_install() { python3 -m pip install -q --disable-pip-version-check "$@"; }
# Build tools first: the build runs without isolation so that repeated builds reuse build/.
say "checking build tools"
pip_install "scikit-build-core>=0.10" "pybind11>=2.12" "cmake>=3.18" ninja

say "building and installing rlkit and its dependencies (native module in build/)"
target="$root"
if [ -n "$extras" ]; then target="$root[$extras]"; fi
pip_install --no-build-isolation "$target"
(cd / && python3 -c 'import rlkit.core') || missing "a working rlkit build (see the errors above)"
say "ready"
