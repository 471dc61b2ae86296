#!/usr/bin/env bash
# bench.sh: runs every benchmark suite (bench/) with JSON output, then writes the report
# (results.md and PNG charts) with scripts/bench_report.py.
#
#   scripts/bench.sh [--no-build] [OUT_DIR]        (OUT_DIR default: results/bench)
#
# Environment:
#   MF_BUILD_DIR       build folder (default: build); its bin/ holds the bench_* binaries
#   MF_BENCH_BIN_DIR   take the binaries from here instead (e.g. a bin/ carried to a GPU machine)
#   MF_BENCH_MIN_TIME  --benchmark_min_time in seconds for the short benchmarks (default 0.2)
#   MF_BENCH_FILTER    --benchmark_filter regex applied to every suite (default: all)
#   MF_BENCH_SUITES    which suites (default: "bench_gemm bench_layers bench_training bench_memory bench_ladder bench_fused")
#   MF_BENCH_MERGE     more result folders for the report to take the rows OUT_DIR lacks from
#
# Without a GPU every GPU benchmark reports "no GPU: <reason>" and the CPU ones run (about
# 2 minutes on the 2-core development machine). With a GPU, add roughly 3-4 minutes.
# Every GPU benchmark has "gpu" in its name, so the two halves can run on two machines and
# be reported together:
#   here:         scripts/bench.sh results/bench-cpu
#   GPU machine:  MF_BENCH_FILTER=gpu MF_BENCH_BIN_DIR=<carried bin/> scripts/bench.sh --no-build results/bench-gpu
#   then:         python3 scripts/bench_report.py results/bench-gpu results/bench-cpu
set -euo pipefail
root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
# The comment above, for --help.
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
build=1
if [ "${1:-}" = "--no-build" ]; then
  build=0
  shift
fi
if [ $# -gt 1 ] || [[ "${1:-}" == -* ]]; then
  printf "bench.sh: error: unexpected argument '%s' (usage: bench.sh [--no-build] [OUT_DIR])\n" "${*: -1}" >&2
  exit 2
fi
out="${1:-$root/results/bench}"
build_dir="${MF_BUILD_DIR:-$root/build}"
bin="${MF_BENCH_BIN_DIR:-$build_dir/bin}"
min_time="${MF_BENCH_MIN_TIME:-0.2}"
suites="${MF_BENCH_SUITES:-bench_gemm bench_layers bench_training bench_memory bench_ladder bench_fused}"

if [ "$build" = 1 ] && [ -z "${MF_BENCH_BIN_DIR:-}" ] && [ -f "$build_dir/CMakeCache.txt" ]; then
  echo "==> building the benchmarks in $build_dir"
  cmake --build "$build_dir" --target mf_benchmarks
fi
for s in $suites; do
  if [ ! -x "$bin/$s" ]; then
    echo "bench.sh: $bin/$s not found. Build it first (cmake --build <build> --target mf_benchmarks; needs" \
         "libbenchmark-dev) or point MF_BENCH_BIN_DIR at the binaries." >&2
    exit 2
  fi
done

mkdir -p "$out"
commands="$out/commands.txt"
: >"$commands"
{
  echo "# $(date -Iseconds) on $(hostname)"
  echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) threads"
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "# GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
  fi
} >>"$commands"

start=$(date +%s)
failed=()
for s in $suites; do
  args=(--benchmark_out="$out/$s.json" --benchmark_out_format=json --benchmark_min_time="$min_time")
  if [ -n "${MF_BENCH_FILTER:-}" ]; then args+=(--benchmark_filter="$MF_BENCH_FILTER"); fi
  echo "$bin/$s ${args[*]}" >>"$commands"
  echo "==> $s"
  t0=$(date +%s)
  # The console table goes to a log too; the JSON is the result. A suite that crashes is
  # reported at the end; the others still run and the report uses what there is.
  if ! "$bin/$s" "${args[@]}" 2>&1 | tee "$out/$s.log"; then
    failed+=("$s")
  fi
  echo "==> $s: $(( $(date +%s) - t0 )) s"
done
# The report draws its charts with matplotlib (Debian's python3-matplotlib): installed here
# when missing; without it (no network, no root) the report has its tables and no charts.
# Debian's python (a python3 earlier on PATH, say pyenv's, does not see Debian's packages).
py=/usr/bin/python3
[ -x "$py" ] || py=python3
if ! "$py" -c 'import matplotlib' 2>/dev/null; then
  sudo_cmd=()
  [ "$(id -u)" = 0 ] || sudo_cmd=(sudo -n)
  echo "==> installing python3-matplotlib for the report's charts"
  { "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-matplotlib ||
    { "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-matplotlib; }; } ||
    echo "bench.sh: note: could not install python3-matplotlib: the report gets its tables, not its charts" >&2
fi
echo "$py scripts/bench_report.py $out ${MF_BENCH_MERGE:-}" >>"$commands"
echo "# total benchmark time: $(( $(date +%s) - start )) s" >>"$commands"
# shellcheck disable=SC2086  # MF_BENCH_MERGE: a space-separated list of folders
"$py" "$root/scripts/bench_report.py" "$out" ${MF_BENCH_MERGE:-}
if [ ${#failed[@]} -gt 0 ]; then
  echo "bench.sh: these suites exited with an error: ${failed[*]} (see $out/<suite>.log)" >&2
  exit 1
fi
