#!/usr/bin/env bash
# skipped_tests.sh BUILD_DIR CTEST_OUTPUT: the tests that ctest reported as Skipped in
# CTEST_OUTPUT (its printed output), grouped by the reason each gave, which ctest does not
# show. The reasons come from BUILD_DIR/Testing/Temporary/LastTest.log: the line after
# GoogleTest's "FILE:LINE: Skipped", else the test's last line of output (a program that
# exits with the skip code, or whose message matches the skip pattern, says why last).
set -euo pipefail
# The comment above, for --help.
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
if [ $# -ne 2 ] || [[ "$1" == -* ]] || [[ "$2" == -* ]]; then
  printf "skipped_tests.sh: error: expected BUILD_DIR CTEST_OUTPUT, got '%s'\n" "$*" >&2
  exit 2
fi
log="${1:?usage: skipped_tests.sh BUILD_DIR CTEST_OUTPUT}/Testing/Temporary/LastTest.log"
out="${2:?usage: skipped_tests.sh BUILD_DIR CTEST_OUTPUT}"
[ -f "$log" ] && [ -f "$out" ] || exit 0
awk '
  FNR == NR {  # LastTest.log
    if ($0 ~ /^[0-9]+\/[0-9]+ Test: /) { name = $3; inout = 0; want = 0; next }
    if ($0 == "Output:") { inout = 1; getline; next }  # skips the dashes that follow
    if ($0 == "<end of output>") { inout = 0; if (!(name in reason) && last != "") reason[name] = last; last = ""; next }
    if (!inout) next
    if (want) { if (!(name in reason)) reason[name] = $0; want = 0 }
    if ($0 ~ /: Skipped$/) want = 1
    if ($0 != "" && $0 !~ /^\[/) last = $0
    next
  }
  /^[ \t]*[0-9]+ - [^ ]+ \(Skipped\)[ \t]*$/ {  # ctest: "   26 - Name (Skipped)"
    n = $3; r = (n in reason) ? reason[n] : "(no reason given)"
    count[r]++; total++
    if (!(r in first)) first[r] = n
  }
  END {
    if (total == 0) exit
    printf "%d test(s) SKIPPED, by reason:\n", total
    for (r in count) printf "  %3d  %s  (e.g. %s)\n", count[r], r, first[r]
  }' "$log" "$out" | { IFS= read -r head && { printf '%s\n' "$head"; sort -k1,1nr; }; } || true
