#!/usr/bin/env bash
# Installs whatever rlkit needs that this machine lacks, then builds and installs rlkit itself.
# Sourced or run from anywhere; works as root on a fresh Debian/Ubuntu machine (as CI runs)
# and says what is missing where it cannot install it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
extras=${RLKIT_EXTRAS:-}   # e.g. "test"
# The Vulkan backend (CMakeLists.txt): AUTO builds it where the headers and glslc exist, ON requires
# them, OFF builds the CPU backend only (in a build folder of its own, so switching rebuilds nothing).
vulkan=$(echo "${RLKIT_VULKAN:-AUTO}" | tr '[:lower:]' '[:upper:]')
case "$vulkan" in AUTO|ON|OFF) ;; *) echo "[rlkit install] RLKIT_VULKAN is '$vulkan': expected AUTO, ON or OFF" >&2; exit 1;; esac

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
# With RLKIT_VULKAN_PACKAGES=1 (the test command sets it) the Vulkan system packages come too: the
# headers and glslc build the backend, Mesa's lavapipe runs it where there is no GPU driver. Where
# they cannot be installed, the build is the CPU backend's and the GPU tests skip with the reason.
if [ "${RLKIT_VULKAN_PACKAGES:-0}" = 1 ] && [ "$vulkan" != OFF ]; then
  need_vk=()
  [ -e /usr/include/vulkan/vulkan.h ] || need_vk+=(libvulkan-dev)
  command -v glslc >/dev/null || need_vk+=(glslc)
  ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1 || need_vk+=(mesa-vulkan-drivers)
  if [ ${#need_vk[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      say "installing the Vulkan packages: ${need_vk[*]}"
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_vk[@]}" >/dev/null; } \
        || say "could not install ${need_vk[*]}: building without what is missing; the GPU tests will skip"
    else
      say "not installing ${need_vk[*]} (that needs root and apt-get): the GPU tests will skip where they are missing"
    fi
  fi
fi
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' || missing "Python 3.10 or newer (found $(python3 --version))"

pip_install() { python3 -m pip install -q --disable-pip-version-check "$@"; }
# Build tools first: the build runs without isolation so that repeated builds reuse build/.
say "checking build tools"
pip_install "scikit-build-core>=0.10" "pybind11>=2.12" "cmake>=3.18" ninja

# The test extra holds Stable-Baselines3 (the compatibility tests' reference), which needs PyTorch:
# where none is installed, the CPU build of torch 2.13.0 first (a CUDA build would come by
# default from PyPI, a few GB, for tests that run on the CPU).
case ",$extras," in *,test,*)
  python3 -c 'import torch' 2>/dev/null || { say "installing PyTorch (CPU) for the test extra's SB3"; pip_install "torch==2.13.0"; } ;;
esac

# The shaders extra (and the test extra, which has it) brings slangpy, whose glslang the build
# uses for the cooperative-matrix shaders (CMakeLists.txt): it must be here before the build, which
# pip runs before it installs the extras.
case ",$extras," in *,test,*|*,shaders,*)
  python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("slangpy") is None)' 2>/dev/null \
    || { say "installing slangpy (its glslang builds the cooperative-matrix shaders)"; pip_install "slangpy>=0.43"; } ;;
esac

say "building and installing rlkit and its dependencies (native module in build/, RLKIT_VULKAN=$vulkan)"
target="$root"
if [ -n "$extras" ]; then target="$root[$extras]"; fi
build=(-Ccmake.define.RLKIT_VULKAN="$vulkan")
if [ "$vulkan" = OFF ]; then build+=(-Cbuild-dir="build/{wheel_tag}-cpu-only"); fi
pip_install --no-build-isolation "${build[@]}" "$target"
(cd / && python3 -c 'import rlkit.core') || missing "a working rlkit build (see the errors above)"
say "ready"
