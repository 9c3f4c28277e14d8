#!/usr/bin/env bash
# Builds the native module with AddressSanitizer and UndefinedBehaviorSanitizer (build/sanitize)
# and runs the op, buffer, capture, graph and Vulkan tests against it: any report fails the run
# (UBSan aborts on its first finding; ASan always does). Run after scripts/test.sh (which
# installs the build tools). The leak test is left out: ASan's quarantine holds freed memory
# on purpose, so process memory grows under it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
# Its shaders all come from glslc (RLKIT_SHADER_COMPILER=GLSLC), the build without slangpy's glslang:
# where the test build used that for the cooperative-matrix shaders, CI builds and runs both paths.
cmake -S . -B build/sanitize -G Ninja -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" \
  -DRLKIT_SHADER_COMPILER=GLSLC -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build build/sanitize
# A copy of the package with the sanitized module, so the installed rlkit stays as it is.
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
cp -r rlkit tests scripts pyproject.toml "$tree"/
rm -f "$tree"/rlkit/_native*.so
cp build/sanitize/_native*.so "$tree"/rlkit/
cd "$tree"
# Python is not instrumented: the runtimes are preloaded. Leak checking is off (CPython keeps
# interned objects to the end), everything else is on.
export LD_PRELOAD="$(g++ -print-file-name=libasan.so):$(g++ -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The slow tests (a learning run, the kill harness's 12 saves) repeat what the quick ones already
# take through the sanitizers, at several times the cost under them; both plain suites run them.
python3 -m pytest -q -p no:cacheprovider -m "not slow" \
  tests/test_ops.py tests/test_ops_bad_input.py tests/test_op_table.py tests/test_tensor.py tests/test_autograd.py tests/test_optim.py \
  tests/test_random_ops.py tests/test_buffers.py tests/test_replay.py tests/test_replay_kills.py tests/test_capture.py tests/test_graph.py \
  tests/test_graph_api.py tests/test_ssm.py tests/test_rwkv.py tests/test_rwkv7.py tests/test_recurrent_blocks.py \
  tests/test_vulkan.py tests/test_runtime.py tests/test_checkpoint.py tests/test_conv.py tests/test_image_replay.py \
  tests/test_properties.py
echo "[rlkit sanitizers] no AddressSanitizer or UndefinedBehaviorSanitizer report"
