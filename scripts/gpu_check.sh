#!/usr/bin/env bash
# The GPU check, in one command that fits one device run (10 minutes on the H200): builds a wheel
# of this tree with the Vulkan backend required (RLKIT_VULKAN=ON), installs it into a folder of its
# own, runs the GPU test files with the GPU required, then the Mamba demo at its default sizes (CPU,
# then Vulkan), which exits non-zero unless both verdicts are OK and the backends AGREE. Logs go to
# $OUT (the device run's folder) or to gpu_check_logs/. On the GPU machine (shared/device/README.md):
#
#     source .gl/on-device.sh; bash scripts/gpu_check.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-$root/gpu_check_logs}
mkdir -p "$out"
cd "$root"
say() { echo "[gpu check] $*"; }
# /usr/bin/g++ where it exists, even over an inherited CXX: the H200 image exports
# CXX=/opt/gcc/bin/g++, whose module crashes (SIGSEGV) on the first C++ exception, since its
# libstdc++ is not the one loaded at run time (shared/device/README.md). RLKIT_GPU_CHECK_CXX
# picks another compiler.
if [ -n "${RLKIT_GPU_CHECK_CXX:-}" ]; then export CXX=$RLKIT_GPU_CHECK_CXX
elif [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++; fi
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

say "building a wheel (RLKIT_VULKAN=ON; log: $out/build.log)"
rm -f "$out"/rlkit-*.whl
python3 -m pip wheel -q --no-build-isolation --no-deps -Ccmake.define.RLKIT_VULKAN=ON -w "$out" . \
  >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
site="$out/site"
rm -rf "$site"
python3 -m pip install -q --no-deps --no-compile --target "$site" "$out"/rlkit-*.whl
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1
(cd / && python3 -m rlkit info) | tee "$out/info.txt"
say "a C++ exception reaches Python as a ValueError (a module built by a mismatched g++ crashes here)"
(cd / && python3 -c '
from rlkit import _native
try:
    _native.op_id("no_such_op")  # throws std::invalid_argument in C++
except ValueError as error:
    print("  ok:", error)
')

say "GPU tests (log: $out/tests.log)"
RLKIT_REQUIRE_GPU=1 python3 -m pytest -q -ra -p no:cacheprovider \
  tests/test_vulkan.py tests/test_vulkan_matmul.py tests/test_capture.py tests/test_elementwise_chain.py \
  tests/test_bf16.py tests/test_mixed_precision.py tests/test_random_ops.py tests/test_optim_fused.py \
  tests/test_ssm.py tests/test_rwkv.py tests/test_rwkv7.py tests/test_conv.py tests/test_nn_conv.py \
  tests/test_buffers.py tests/test_image_replay.py tests/test_image_agents.py tests/test_dict_spaces.py \
  tests/test_her.py 2>&1 | tee "$out/tests.log" | tail -25

say "the Mamba demo at its default sizes (log: $out/mamba_demo.txt)"
python3 scripts/mamba_train_demo.py 2>&1 | tee "$out/mamba_demo.txt" | tail -12
say "passed: the GPU tests, and the demo's verdicts OK with the backends in agreement"
