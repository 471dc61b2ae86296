#!/usr/bin/env bash
# test_check_layers.sh: scripts/check_layers.sh passes on this checkout, and fails, naming
# the file, on copies of it broken in each way it checks: an include of a folder below,
# an include of a folder outside the list, a file over 400 lines, a convolution layer file
# over 200, a folder missing. Exit 0 when all hold, 1 otherwise.
set -uo pipefail
root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)"
check="$root/scripts/check_layers.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
errors=0
expect() {  # DESCRIPTION COMMAND...: a condition that must hold
  local what="$1"
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; errors=$((errors + 1)); fi
}
# A copy of the product's folders, broken by `$@` (a command run inside it); prints the
# check's output to $tmp/out and returns its exit status.
broken() {
  rm -rf "$tmp/tree" && mkdir -p "$tmp/tree"
  (cd "$root" && cp -r runtime tensor kernels layers optim data train io apps bench "$tmp/tree/")
  (cd "$tmp/tree" && eval "$1")
  "$check" "$tmp/tree" >"$tmp/out" 2>&1
}
"$check" "$root" >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
expect "this checkout passes" test "$rc" = 0

broken 'printf "#include \"train/fit.h\"\n" >> layers/layer.cpp'
expect "an include of a folder below fails" test $? = 1
expect "... naming the file, line and header" grep -q 'layers/layer.cpp:[0-9]* includes train/fit.h' "$tmp/out"

broken 'printf "#include \"test/test_util.h\"\n" >> optim/adam.cpp'
expect "an include of a folder outside the list fails" test $? = 1
expect "... naming it" grep -q 'optim/adam.cpp:[0-9]* includes test/test_util.h, outside' "$tmp/out"

broken 'seq 401 | sed "s|^|// |" > data/long.h'
expect "a file of 401 lines fails" test $? = 1
expect "... with its count" grep -q 'data/long.h has 401 lines, more than 400' "$tmp/out"

broken 'seq 201 | sed "s|^|// |" >> layers/conv2d_cpu.cpp'
expect "a convolution layer file over 200 lines fails" test $? = 1
expect "... with the 200 limit" grep -q 'layers/conv2d_cpu.cpp has [0-9]* lines, more than 200' "$tmp/out"

broken 'rm -rf io'
expect "a missing folder fails" test $? = 1
expect "... naming it" grep -q 'the folder io/ is missing' "$tmp/out"

[ "$errors" = 0 ] && echo "test_check_layers: all checks hold" || echo "test_check_layers: $errors failed"
exit $((errors > 0))
