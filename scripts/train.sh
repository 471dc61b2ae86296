#!/usr/bin/env bash
# train.sh [train_mnist flags]: set-up (packages, MNIST, build), then trains the article's
# model for 5 epochs: on the GPU when there is one, else on the CPU.
set -euo pipefail
root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
"$root/scripts/setup.sh"
build_dir="${MF_BUILD_DIR:-$root/build}"
exec "$build_dir/bin/train_mnist" --data "$root/.cache/mnist" "$@"
