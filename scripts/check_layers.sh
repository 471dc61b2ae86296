#!/usr/bin/env bash
# check_layers.sh: the product's folders are layered; each uses only the folders above it:
#   runtime tensor kernels layers optim data train io apps
# Fails, naming each offending #include, when a file includes a header of its own folder's
# level or below (its own folder excepted), or of a folder outside the list. Also fails when
# a source file of the product is over 400 lines, or a layer's CPU or GPU file of the
# convolution is over 200.
#   check_layers.sh [ROOT]   ROOT: the checkout (default: this script's)
set -euo pipefail
root="${1:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)}"
cd "$root"
order=(runtime tensor kernels layers optim data train io apps)
level() {
  local i
  for i in "${!order[@]}"; do [ "${order[$i]}" = "$1" ] && { echo "$i"; return; }; done
  echo -1
}
bad=0
for dir in "${order[@]}"; do
  [ -d "$dir" ] || { echo "check_layers: the folder $dir/ is missing"; bad=1; continue; }
  mine=$(level "$dir")
  while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$rest")
    top=${inc%%/*}
    [ "$top" = "$inc" ] && continue  # a header beside the file, or a library's
    [ "$top" = "$dir" ] && continue
    theirs=$(level "$top")
    if [ "$theirs" -lt 0 ]; then
      echo "check_layers: $file:$line includes $inc, outside the product's folders"
      bad=1
    elif [ "$theirs" -gt "$mine" ]; then
      echo "check_layers: $file:$line includes $inc: $dir/ may use only ${order[*]:0:$mine}"
      bad=1
    fi
  done < <(grep -rn --include='*.h' --include='*.cuh' --include='*.cpp' --include='*.cu' '^[[:space:]]*#[[:space:]]*include "' "$dir" || true)
done
# Sizes: the product's sources (everything but test/, fuzz/ and scripts/).
while IFS= read -r f; do
  n=$(wc -l <"$f")
  limit=400
  case "$f" in layers/conv2d_cpu.cpp | layers/conv2d_gpu.cu) limit=200 ;; esac
  if [ "$n" -gt "$limit" ]; then
    echo "check_layers: $f has $n lines, more than $limit"
    bad=1
  fi
done < <(find "${order[@]}" bench -type f \( -name '*.h' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.cu' \) 2>/dev/null | sort)
if [ "$bad" = 0 ]; then echo "check_layers: ${#order[@]} folders layered, every source within its line limit"; fi
exit "$bad"
