#!/usr/bin/env bash
# test.sh: set-up (packages, MNIST, build), then the tests with ctest. GPU tests report
# SKIPPED (with the reason) on a machine without a GPU. Tests labelled "long" (the 5-epoch
# trainings, the emulated GPU trainings of 20 s or more and the emulated benchmark runs:
# ctest -N -L long lists them) run only with --full.
#   test.sh --full       every test, the long ones too (about 20 minutes more on 2 cores)
#   test.sh --sanitize   also builds the CPU path with ASan+UBSan in build-asan/ and with
#                        ThreadSanitizer in build-tsan/, and runs its tests there (GPU off);
#                        with --full, the long emulated trainings there too (an hour or more)
set -euo pipefail
root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
# The comment above, for --help.
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; }
# Read before the set-up, so that a mistyped argument costs nothing and is not ignored.
sanitize=0
tier=(-LE long)  # ctest's label filter: the long tier left out unless --full
for arg in "$@"; do
  case "$arg" in
    --sanitize) sanitize=1 ;;
    --full) tier=() ;;
    -h | --help) usage; exit 0 ;;
    *) printf "test.sh: error: unknown argument '%s' (usage: test.sh [--full] [--sanitize])\n" "$arg" >&2; exit 2 ;;
  esac
done
"$root/scripts/setup.sh"
build_dir="${MF_BUILD_DIR:-$root/build}"
export MF_MNIST_DIR="$root/.cache/mnist"
# ctest, then the skipped tests with their reasons (ctest shows only "Skipped"); a build
# with no tests at all is an error, not a pass.
run_ctest() {
  local dir="$1" rc=0
  shift
  ctest --test-dir "$dir" --output-on-failure --no-tests=error -j "$(nproc)" "$@" | tee "$dir/ctest.out" ||
    rc=$?
  "$root/scripts/skipped_tests.sh" "$dir" "$dir/ctest.out"
  return "$rc"
}
run_ctest "$build_dir" "${tier[@]}"
if [ "$sanitize" = 1 ]; then
  echo "==> AddressSanitizer + UndefinedBehaviorSanitizer build of the CPU path"
  MF_BUILD_DIR="$root/build-asan" MF_CMAKE_ARGS="-DMF_WITH_CUDA=OFF -DMF_SANITIZE=ON -DMF_BUILD_BENCH=OFF -DMF_CPU_ARCH=" \
    "$root/scripts/setup.sh"
  # Not the GPU suites (KernelsGpu.*, TrainGpu.*, ...: skipped anyway) nor the 5-epoch
  # trainings; the emulated GPU tests (Emulated.*) do run, so AddressSanitizer checks every
  # access of the CUDA kernels and of the layers' GPU code too. Without --full, not the
  # emulated trainings labelled "long" (test/emulator/CMakeLists.txt: 20 s or more in the
  # normal build, minutes under the sanitizers), which run the code the shorter ones run.
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_ctest "$root/build-asan" "${tier[@]}" -E '^[A-Za-z]+Gpu[.]|TrainMnistFull'
  echo "==> ThreadSanitizer build of the CPU path"
  MF_BUILD_DIR="$root/build-tsan" MF_CMAKE_ARGS="-DMF_WITH_CUDA=OFF -DMF_TSAN=ON -DMF_BUILD_BENCH=OFF" \
    "$root/scripts/setup.sh"
  # The thread pool and the layers that use it, and the emulated kernels' blocks of real
  # threads, with this machine's vector width (-march=native, where the ASan build above
  # takes the compiler's default). Not the GPU suites, nor the trainings that run those same
  # layers for minutes more under ThreadSanitizer: train_mnist's command-line tests, the
  # 5-epoch run, the comparison with PyTorch, the CPU rungs' fits (six minutes here under
  # ThreadSanitizer; Conv2d/DenseEveryRungMatchesTheReference still run every rung's threads)
  # and the emulated fits (in either stream order, and at the kernel ladder's rungs:
  # FusedGpu.* still runs the fused kernels here).
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    run_ctest "$root/build-tsan" "${tier[@]}" -E '^[A-Za-z]+Gpu[.]|TrainMnistFull|^TrainMnistCli[.]|SameLossesAsPyTorch|^LadderCpu[.]EveryRungTrains|^Emulated[.](OthersFirst[.])?TrainGpu[.]|^Emulated[.]LadderGpu[.][A-Za-z]*Train|^Emulated[.]LadderGpu[.]Fused(Follows|Learns)'
fi
