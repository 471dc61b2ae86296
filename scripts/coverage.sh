#!/usr/bin/env bash
# coverage.sh: which lines of the library and the apps no test runs. Builds the tests with
# gcc's --coverage (at -O1, CPU only: the GPU path compiles for the CUDA emulation when its
# headers are there), runs them, and prints, per source file, how many of its lines ran no
# time in any test; every such line is listed in $BUILD/uncovered.txt.
#
#   scripts/coverage.sh               # every test but the long trainings (2 min, after the build)
#   scripts/coverage.sh --emulated    # also the emulated GPU trainings, Emulated.TrainGpu.* (10 min)
#
# Environment: MF_COVERAGE_BUILD, the build folder (default: build-coverage).
#
# The apps count too: the tests run them as programs, and each writes its counts when it
# exits (not when a signal kills it, so the signal paths show as not run). Left out: the
# 5-epoch training and the PyTorch comparison (they add nothing the short trainings do not
# run), and the test that runs predict under a file-size limit, where the counts cannot be
# written.
set -euo pipefail
# The comment above, for --help.
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; }
emulated=0
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  --emulated) emulated=1 ;;
  "") ;;
  *) printf "coverage.sh: error: unknown option '%s' (usage: coverage.sh [--emulated])\n" "$1" >&2; exit 2 ;;
esac
if [ $# -gt 1 ]; then
  printf "coverage.sh: error: unexpected argument '%s' (usage: coverage.sh [--emulated])\n" "$2" >&2
  exit 2
fi
root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
build=${MF_COVERAGE_BUILD:-$root/build-coverage}

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DCMAKE_CXX_FLAGS=--coverage -DCMAKE_EXE_LINKER_FLAGS=--coverage -DCMAKE_SHARED_LINKER_FLAGS=--coverage \
  -DMF_WITH_CUDA=OFF -DMF_BUILD_BENCH=OFF >/dev/null
# The build's output (at -O1 GCC warns inside Eigen's AVX-512 code) goes to a log.
if ! cmake --build "$build" >"$build/coverage-build.log" 2>&1; then
  tail -30 "$build/coverage-build.log" >&2
  echo "coverage.sh: error: the build failed (log: $build/coverage-build.log)" >&2
  exit 1
fi
find "$build" -name '*.gcda' -delete  # counts from this run only

exclude='TrainMnistFull|SameLossesAsPyTorch|FileSizeLimitIsAnErrorThatLeavesNoTemporaryFile'
if [ $emulated = 0 ]; then exclude+='|^Emulated[.]TrainGpu[.]'; fi
ctest --test-dir "$build" -j"$(nproc)" -E "$exclude" --output-on-failure >"$build/coverage-tests.log" 2>&1 ||
  echo "coverage.sh: some tests failed (see $build/coverage-tests.log); their lines count as they ran" >&2
grep -E 'tests passed|tests failed' "$build/coverage-tests.log" || true

# gcov's JSON for every object file, summed per source line over every object that compiled
# it (the emulated GPU code is compiled once per test binary).
python3 - "$build" "$root" <<'EOF'
import collections, glob, json, os, subprocess, sys
build, root = sys.argv[1], sys.argv[2] + "/"
counts = collections.defaultdict(lambda: collections.defaultdict(int))
for gcda in glob.glob(build + "/**/*.gcda", recursive=True):
    where = os.path.dirname(gcda)
    out = subprocess.run(["gcov", "--json-format", "--stdout", gcda], cwd=where, capture_output=True).stdout
    for line in out.splitlines():
        try:
            report = json.loads(line)
        except ValueError:
            continue
        for f in report.get("files", []):
            path = os.path.normpath(os.path.join(report.get("current_working_directory", where), f["file"]))
            rel = path[len(root):] if path.startswith(root) else None
            if rel is None or rel.startswith(("test/", "build", "fuzz/", "bench/")):
                continue
            for l in f["lines"]:
                counts[rel][l["line_number"]] += l["count"]
rows, listing = [], []
for rel in sorted(counts):
    lines = counts[rel]
    missed = sorted(n for n, c in lines.items() if c == 0)
    rows.append((rel, len(lines), len(missed)))
    text = open(root + rel, errors="replace").read().split("\n")
    listing += [f"{rel}:{n}: {text[n - 1].strip()}" for n in missed]
with open(build + "/uncovered.txt", "w") as f:
    f.write("\n".join(listing) + "\n")
by_folder = collections.defaultdict(lambda: [0, 0])
for rel, total, missed in rows:
    by_folder[rel.split("/")[0]][0] += total
    by_folder[rel.split("/")[0]][1] += missed
print(f"{'folder':<10} {'lines':>7} {'not run':>8} {'run':>7}")
for folder, (total, missed) in sorted(by_folder.items()):
    print(f"{folder:<10} {total:7d} {missed:8d} {100 * (total - missed) / total:6.1f}%")
total = sum(t for _, t, _ in rows); missed = sum(m for _, _, m in rows)
print(f"{'all':<10} {total:7d} {missed:8d} {100 * (total - missed) / total:6.1f}%")
print("\nfiles with lines no test ran (not run / lines):")
for rel, t, m in sorted(rows, key=lambda r: -r[2]):
    if m:
        print(f"  {m:5d} / {t:5d}  {rel}")
print(f"\nevery such line: {build}/uncovered.txt")
EOF
