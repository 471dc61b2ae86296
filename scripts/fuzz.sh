#!/usr/bin/env bash
# fuzz.sh: builds the libFuzzer targets (clang, AddressSanitizer + UndefinedBehaviorSanitizer,
# CPU-only) and runs each for SECONDS (default 60) from a seed corpus of small valid files.
# Exits 1 if any fuzzer finds a crash; the input that triggers it is left in
# $BUILD/fuzz-work/<target>/artifacts/. Reproduce with: $BUILD/bin/fuzz_<target> ARTIFACT
#
#   scripts/fuzz.sh            # a minute each
#   scripts/fuzz.sh 600        # ten minutes each
#   MF_FUZZ_BUILD=/tmp/fz scripts/fuzz.sh 30
set -euo pipefail
# The comment above, for --help.
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac

seconds=${1:-60}
if [ $# -gt 1 ] || ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  printf "fuzz.sh: error: expected SECONDS, a whole number above 0, got '%s' (usage: fuzz.sh [SECONDS])\n" "$*" >&2
  exit 2
fi
root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
build=${MF_FUZZ_BUILD:-$root/build-fuzz}

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DMF_FUZZ=ON -DMF_WITH_CUDA=OFF -DMF_BUILD_TESTS=OFF -DMF_BUILD_BENCH=OFF >/dev/null
targets=(idx checkpoint)
# The image fuzzer needs the stb headers (libstb-dev).
if ! grep -q '^MF_STB_INCLUDE_DIR:PATH=.*NOTFOUND' "$build/CMakeCache.txt"; then targets+=(image); fi
cmake --build "$build" --target fuzz_seeds "${targets[@]/#/fuzz_}"

work=$build/fuzz-work
rm -rf "$work"/*/seeds
"$build/bin/fuzz_seeds" "$work" "${MF_DATA_DIR:-$root/.cache/mnist}"

status=0
summary=()
for t in "${targets[@]}"; do
  dir=$work/$t
  mkdir -p "$dir/corpus" "$dir/artifacts"
  echo "== fuzz_$t: ${seconds} s"
  # corpus/ collects new interesting inputs across runs; seeds/ and fuzz/regressions/<target>
  # (inputs that once found a bug) are read only.
  extra=()
  if [ -d "$root/fuzz/regressions/$t" ]; then extra+=("$root/fuzz/regressions/$t"); fi
  if "$build/bin/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$dir/artifacts/" "$dir/corpus" "$dir/seeds" "${extra[@]}" >"$dir/log.txt" 2>&1; then
    result=ok
  else
    result="CRASH (see $dir/log.txt and $dir/artifacts/)"
    status=1
    grep -m1 -E "ERROR: (AddressSanitizer|libFuzzer)|runtime error|deadly signal|out-of-memory" "$dir/log.txt" || true
  fi
  execs=$(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$dir/log.txt" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -E '^#[0-9]+.*cov:' "$dir/log.txt" | tail -1 | grep -o 'cov: [0-9]*' || echo "cov: ?")
  summary+=("fuzz_$t: $result, $execs runs, $cov, corpus $(ls "$dir/corpus" | wc -l) files")
done
echo
printf '%s\n' "${summary[@]}"
exit $status
