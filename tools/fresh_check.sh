#!/usr/bin/env bash
# The fresh-machine check: the README's first command, from nothing.
#
# A clean Debian bookworm amd64 root (debootstrap --variant=minbase, with what a new machine of
# this kind has: CPython with pip and venv, the Python headers, gcc, git, CA certificates) is
# entered with chroot, as root, and in it, in a copy of the code under test:
#   - tools/setup.sh (its apt-get install runs inside the root; services are not started);
#   - the tests' tiny model (tests/tiny_model.py) built with `edgekit build --onnx ... --device
#     rpi5`: its TVM library must be an aarch64 ELF, which proves the cross compiler links
#     (crti.o and the rest of libc6-dev-arm64-cross) on a machine that never had it;
#   - .venv/bin/edgekit demo (the reference bundle built from an empty cache, then the clip).
# The code under test is a `git clone` of this repository (its HEAD: CI runs from a fresh clone);
# EDGEKIT_FRESH_SOURCE=worktree copies the working tree instead (tracked files as they are now,
# and untracked files git does not ignore), for trying changes before they are committed.
# pip is configured as on this machine: its PIP_* variables and pip.conf files, with the local
# folders they name (/opt/wheels: torch's CPU build) bind-mounted read-only.
#
# Usage, as root on Debian/Ubuntu x86_64 (no .venv needed):
#   tools/fresh_check.sh [--if-possible]
# --if-possible: where this machine cannot run it (not root, no apt, not x86_64, mounts refused,
# too little disk), say SKIPPED and exit 0 instead of failing.
#
# Cache: ${EDGEKIT_FRESH_CACHE:-/var/cache/edgekit/fresh} holds the root as a tarball (made once;
# unpacked each run, in seconds), pip's download cache and the .deb files apt downloaded (both
# bind-mounted into the root, so reruns download less).  The root itself starts clean from the
# tarball every run.  Work files: $CACHE/work, remade each run; the root in it is removed after
# a pass and kept after a failure, to look into (chroot $CACHE/work/root).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

IF_POSSIBLE=0
for arg in "$@"; do
  case $arg in
    --if-possible) IF_POSSIBLE=1 ;;
    -h | --help) sed -n '2,/^set -Eeuo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fresh check: unknown argument $arg" >&2; exit 2 ;;
  esac
done

CACHE=${EDGEKIT_FRESH_CACHE:-/var/cache/edgekit/fresh}
WORK=$CACHE/work
ROOT=$WORK/root
SOURCE_MODE=${EDGEKIT_FRESH_SOURCE:-head}
MIRROR=${EDGEKIT_FRESH_MIRROR:-}
SUITE=bookworm
# What a new machine of this kind (x86_64 Debian bookworm, Python 3.11) has: CPython with pip
# and venv, gcc and the Python headers for packages that compile; git and CA certificates.
INCLUDE=python3,python3-pip,python3-venv,python3-dev,gcc,libc6-dev,git,ca-certificates
BASE_TARBALL=$CACHE/debian-$SUITE-amd64-$(echo "$INCLUDE" | sha256sum | cut -c1-8).tar.zst
SRC=/root/edgekit # the code under test, inside the root
MIN_FREE_GB=12    # the root after setup and the demo: about 6 GB (3.3 GB of it .venv)
APT_PACKAGES=(debootstrap zstd)

# Phases (each timed; a failure names the one it happened in), skip_or_fail, quiet, mounts.
CHECK="fresh check"
# shellcheck source=tools/_shell.sh
source "$REPO/tools/_shell.sh"

# Processes left in a root under $WORK (none should be: services are not started) are ended,
# then what is mounted there is unmounted, deepest first: a root is never removed with /dev in it.
# Only by the run holding the lock: a run waiting for it must not touch the other's root.
HAVE_LOCK=0
release_work() {
  local p root mounts
  ((HAVE_LOCK)) || return 1
  for p in /proc/[0-9]*; do
    root=$(readlink "$p/root" 2>/dev/null) || continue
    [[ $root != "$WORK"/* ]] || kill -9 "${p#/proc/}" 2>/dev/null || true
  done
  unmount_all
  mounts=$(awk -v w="$WORK/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r)
  [[ -z $mounts ]] || xargs -r -n1 umount -l <<<"$mounts"
  ! awk -v w="$WORK/" 'index($2, w) == 1 {found = 1} END {exit !found}' /proc/mounts
}

remove_work() {
  release_work || { echo "fresh check: something is still mounted under $WORK: not removing it" >&2; return 1; }
  rm -rf --one-file-system "$WORK"
}

check_cleanup() {
  release_work || return
  [[ ! -d $ROOT ]] || echo "fresh check: the root is kept for a look: chroot $ROOT (logs: $WORK/logs)" >&2
}

# Run a command inside the root, as root, with a new machine's environment (and this one's
# PIP_* and proxy variables), in the code under test.
# shellcheck disable=SC2016  # $0 and $@ are expanded by the inner sh
in_root() {
  chroot "$ROOT" /usr/bin/env -i "${ROOT_ENV[@]}" /bin/sh -c 'cd "$0" && exec "$@"' "$SRC" "$@"
}

# ---------------------------------------------------------------------------------------
phase "machine: root, chroot, disk"
[[ $(id -u) == 0 ]] || skip_or_fail "needs root (debootstrap, chroot, mounts)"
command -v apt-get >/dev/null || skip_or_fail "needs a Debian/Ubuntu machine (apt-get)"
[[ $(uname -m) == x86_64 ]] || skip_or_fail "the root is Debian amd64: this machine is $(uname -m)"
[[ $SOURCE_MODE == head || $SOURCE_MODE == worktree ]] ||
  { echo "fresh check: EDGEKIT_FRESH_SOURCE must be head or worktree, not '$SOURCE_MODE'" >&2; exit 2; }
mkdir -p "$CACHE"
# One fresh check at a time per cache (a second one would remove the first one's root).
exec 9>"$CACHE/lock"
if ! flock -n 9; then
  echo "   waiting for another fresh check using $CACHE"
  flock 9
fi
HAVE_LOCK=1
# A failed run's root is kept for a look until this one.
[[ ! -e $ROOT && ! -e $WORK/debootstrap ]] || phase "remove the last run's root"
remove_work
mkdir -p "$WORK/logs" "$CACHE/pip" "$CACHE/apt-archives"
missing=()
for pkg in "${APT_PACKAGES[@]}"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
if ((${#missing[@]})); then
  echo "   installing ${missing[*]}"
  quiet apt.log apt-get update -q
  quiet apt-install.log env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
free_gb=$(($(df --output=avail -k "$CACHE" | tail -n 1) / 1024 / 1024))
((free_gb >= MIN_FREE_GB)) || skip_or_fail "needs ${MIN_FREE_GB} GB free under $CACHE, has $free_gb GB"
mkdir -p "$WORK/probe/proc"
mount -t proc proc "$WORK/probe/proc" 2>/dev/null ||
  skip_or_fail "cannot mount /proc for a chroot (an unprivileged container?)"
umount "$WORK/probe/proc"
rm -rf "$WORK/probe"
[[ -n $MIRROR ]] || MIRROR=$(debian_mirror)
SECURITY_MIRROR=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
  grep -oE '^(URIs:|deb) +https?://[^ ]+/debian-security/?( |$)' | head -n1 | awk '{print $2}' || true)
SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}

# ---------------------------------------------------------------------------------------
phase "root: Debian $SUITE amd64 tarball"
if [[ -f $BASE_TARBALL ]]; then
  echo "   cached: $BASE_TARBALL ($(du -h "$BASE_TARBALL" | cut -f1))"
else
  echo "   debootstrap $SUITE from $MIRROR (log: $WORK/logs/debootstrap.log)"
  boot=$WORK/debootstrap
  quiet debootstrap.log debootstrap --arch=amd64 --variant=minbase --include="$INCLUDE" "$SUITE" "$boot" "$MIRROR"
  # debootstrap should unmount what it mounted; never tar a mounted /proc.
  awk -v r="$boot" 'index($2, r "/") == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l
  # A new machine's sources: the suite, its updates and its security updates.
  rm -f "$boot/etc/apt/sources.list"
  cat >"$boot/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$boot"/var/cache/apt/archives/*.deb "$boot"/var/cache/apt/*.bin "$boot"/var/lib/apt/lists/*
  rm -f "$boot/etc/resolv.conf" "$boot/etc/hosts"
  tar -C "$boot" --numeric-owner -cf - . | zstd -q -T0 -3 -o "$BASE_TARBALL.tmp"
  mv "$BASE_TARBALL.tmp" "$BASE_TARBALL"
  rm -rf --one-file-system "$boot"
  # Tarballs of an older package list are of no further use.
  find "$CACHE" -maxdepth 1 -name "debian-$SUITE-amd64-*.tar.zst" ! -path "$BASE_TARBALL" -delete
  echo "   made $BASE_TARBALL ($(du -h "$BASE_TARBALL" | cut -f1))"
fi

phase "root: unpack, mounts, config"
mkdir -p "$ROOT"
zstd -dc "$BASE_TARBALL" | tar -C "$ROOT" --numeric-owner -xf -
mount_tracked -t proc proc "$ROOT/proc"
mount_tracked -o bind,ro /sys "$ROOT/sys"
mount_tracked --bind /dev "$ROOT/dev"
mount_tracked --bind /dev/pts "$ROOT/dev/pts"
mount_tracked -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$ROOT/dev/shm"
# Downloads kept between runs: pip's cache and apt's .deb files (checked against the fresh
# package lists, so they hide nothing missing).
mkdir -p "$ROOT/root/.cache/pip"
mount_tracked --bind "$CACHE/pip" "$ROOT/root/.cache/pip"
mount_tracked --bind "$CACHE/apt-archives" "$ROOT/var/cache/apt/archives"
# The network as this machine has it: name resolution, hosts, and its CA certificates (an
# egress proxy's among them) both as files and in the bundle, so a later update-ca-certificates
# in the root keeps them.
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
cp -L /etc/hosts "$ROOT/etc/hosts"
if compgen -G "/usr/local/share/ca-certificates/*" >/dev/null; then
  cp -rL /usr/local/share/ca-certificates/. "$ROOT/usr/local/share/ca-certificates/"
fi
cp -L /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
# Services must not start in a chroot (postgresql, mosquitto, sshd are installed by setup.sh).
printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
chmod 755 "$ROOT/usr/sbin/policy-rc.d"
# pip as configured here: PIP_* variables, its configuration files, and what they name.
ROOT_ENV=(HOME=/root USER=root LOGNAME=root LANG=C.UTF-8 TERM=dumb
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
while IFS='=' read -r name value; do
  ROOT_ENV+=("$name=$value")
done < <(env | grep -E '^(PIP_[A-Z_]+|https?_proxy|HTTPS?_PROXY|no_proxy|NO_PROXY)=' || true)
pip_files=()
for f in /etc/pip.conf /etc/xdg/pip/pip.conf ${PIP_CONFIG_FILE:+"$PIP_CONFIG_FILE"}; do
  [[ -f $f ]] && { mkdir -p "$ROOT$(dirname "$f")"; cp -L "$f" "$ROOT$f"; pip_files+=("$f"); }
done
for f in "${XDG_CONFIG_HOME:-$HOME/.config}/pip/pip.conf" "$HOME/.pip/pip.conf"; do
  [[ -f $f ]] || continue
  inside=/root/${f#"$HOME"/}
  [[ $f == "$HOME"/* ]] || inside=/root/.config/pip/pip.conf
  mkdir -p "$ROOT$(dirname "$inside")"
  cp -L "$f" "$ROOT$inside"
  pip_files+=("$f")
done
# Local paths they name: files are copied, folders bind-mounted read-only (a local index's
# folder .../simple with its parent, where its links point).
mapfile -t pip_paths < <({
  ((${#pip_files[@]} == 0)) || grep -hvE '^[[:space:]]*[#;]' "${pip_files[@]}" || true
  env | grep -E '^PIP_' || true
} | grep -oE "(file://)?/[^[:space:]'\",;]+" | sed 's|^file://||; s|/*$||' | sort -u)
for p in "${pip_paths[@]}"; do
  [[ -n $p && -e $p ]] || continue
  if [[ -d $p ]]; then
    [[ $(basename "$p") != simple ]] || p=$(dirname "$p")
    # Never over a folder the root has (a path in a comment, say: /usr).
    [[ ! -e $ROOT$p ]] || continue
    mkdir -p "$ROOT$p"
    mount_tracked -o bind,ro "$p" "$ROOT$p"
    echo "   $p (read-only)"
  elif [[ -f $p ]]; then
    mkdir -p "$ROOT$(dirname "$p")"
    cp -L "$p" "$ROOT$p"
  fi
done
[[ -d /opt/wheels ]] || echo "   (no /opt/wheels on this machine: pip will take torch from PyPI)"

phase "source: $SOURCE_MODE"
mkdir -p "$ROOT$SRC"
if [[ $SOURCE_MODE == head ]] && git -C "$REPO" rev-parse --verify -q HEAD >/dev/null; then
  git clone -q --no-hardlinks "$REPO" "$ROOT$SRC"
  echo "   a clone of HEAD $(git -C "$REPO" log -1 --format='%h %cs')"
  changed=$(git -C "$REPO" status --porcelain --untracked-files=no | wc -l)
  ((changed == 0)) ||
    echo "   (not in it: $changed changed tracked files of the working tree; EDGEKIT_FRESH_SOURCE=worktree takes them)"
elif git -C "$REPO" rev-parse --verify -q HEAD >/dev/null; then
  git -C "$REPO" ls-files -z -co --exclude-standard |
    while IFS= read -r -d '' f; do [[ -e $f || -L $f ]] && printf '%s\0' "$f"; done |
    tar -C "$REPO" --null -T - -cf - | tar -C "$ROOT$SRC" -xf -
  echo "   the working tree ($(find "$ROOT$SRC" -type f | wc -l) files)"
else
  # Not a git checkout: everything but the virtual environment and caches.
  tar -C "$REPO" --exclude=./.venv --exclude=__pycache__ --exclude=.mypy_cache --exclude=.ruff_cache \
    --exclude=.pytest_cache -cf - . | tar -C "$ROOT$SRC" -xf -
  echo "   $REPO (not a git checkout: copied)"
fi
[[ ! -e $ROOT$SRC/.venv ]] || { echo "fresh check: the copied source has a .venv" >&2; false; }
echo "   $(in_root python3 --version), $(in_root python3 -m pip --version | cut -d' ' -f1-2), $(in_root gcc --version | head -n1)"

# ---------------------------------------------------------------------------------------
phase "tools/setup.sh"
quiet setup.log in_root tools/setup.sh
grep -E '^setup: ' "$WORK/logs/setup.log" | sed 's/^/   /'
# torch must be the CPU build from /opt/wheels (PyPI's is CUDA, several GB).
echo "   $(in_root .venv/bin/python -m pip list --format=freeze 2>/dev/null |
  grep -iE '^(torch|apache-tvm|onnxruntime|openvino|ai-edge-litert)==' | tr '\n' ' ')"
echo "   .venv: $(du -sh "$ROOT$SRC/.venv" | cut -f1)"

phase "rpi5: build the tiny model"
# The tests' tiny ONNX model (tests/tiny_model.py), built for the Raspberry Pi 5 as the tests
# build a user's ONNX file for it (tests/test_build.py: --backends tvm; --mean/--std, which the
# file does not say): TVM is the backend that cross-compiles and links.
quiet tiny.log in_root .venv/bin/python -c '
import sys
from pathlib import Path
sys.path.insert(0, "tests")
import tiny_model
Path("/tmp/fresh-check").mkdir()
tiny_model.write_onnx(Path("/tmp/fresh-check/tiny.onnx"), tiny_model.make_weights())'
quiet build-rpi5.log in_root .venv/bin/edgekit build --onnx /tmp/fresh-check/tiny.onnx --device rpi5 \
  --backends tvm --mean 0 --std 1 -o /tmp/fresh-check/tiny-rpi5
# Its TVM library must be there, linked for aarch64 (the cross compiler and the arm64 libc).
quiet check-rpi5.log in_root .venv/bin/python -c '
from pathlib import Path
from edgekit.bundle import read_manifest
from edgekit.core.elf import elf_arch
out = Path("/tmp/fresh-check/tiny-rpi5")
libs = [a for a in read_manifest(out).artifacts if a.backend == "tvm"]
assert libs, "the rpi5 bundle has no TVM library"
for a in libs:
    assert a.arch == "aarch64" and elf_arch(out / a.path) == "aarch64", (a.path, a.arch, elf_arch(out / a.path))
    print(f"   {a.path}: aarch64 ELF, {(out / a.path).stat().st_size} bytes")'
cat "$WORK/logs/check-rpi5.log"

phase "edgekit demo"
quiet demo.log in_root .venv/bin/edgekit demo
# What the model saw, and the latency summary.
sed -n '/what the model saw/,$p' "$WORK/logs/demo.log" | sed 's/^/   /'

phase "remove the root"
release_work
rm -rf --one-file-system "$ROOT"

phase "done"
echo "fresh check: PASSED"
