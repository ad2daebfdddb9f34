#!/usr/bin/env bash
# The ARM64 check: real aarch64 machine code, run under QEMU user-mode emulation.
#
# Builds Dockerfile.arm64 for arm64 with podman, then runs commands inside the image's
# filesystem with chroot (podman cannot run containers on this kind of machine):
#   - `edgekit doctor --json` must say aarch64 and profile arm64-cpu;
#   - the rpi5 bundle (built here) classifies frames of scikit-image's chelsea through
#     edgekit.load (the TVM aarch64 library must be what it selects) and with each of its
#     artifacts (TVM aarch64, ONNX, .tflite); every label must match the same bundle run on
#     this x86_64 host (the TVM library, which cannot run here, against the fp32 ONNX) and be a cat;
#   - the same model's TVM library built for x86_64 must be refused with edgekit's clear
#     error, not crash the process;
#   - the rpi5 BlazeFace bundle (built and signed here) detects faces through edgekit.load (the
#     TVM aarch64 library again) and with each artifact in photographs with faces (scikit-image's
#     astronaut, camera) and without (rocket, moon): as many faces as the fp32 ONNX on this host,
#     boxes and scores close to it (tools/arm64_detect.py), and the device's health gate passes
#     on the bundle's eval frames with the artifact the device selects;
#   - the image's health check command must pass as its non-root user;
#   - on an emulated Cortex-A72 (a Pi 4's core: no dot product, no fp16), doctor must read those
#     features, the rpi5 TVM library (+dotprod) must be refused before it runs, edgekit.load
#     must fall back, and the full-range int8 ONNX model must give the default core's rows.
#
# Usage, as root on Debian/Ubuntu, after tools/setup.sh (it uses .venv):
#   tools/arm64_check.sh [--if-possible]
# --if-possible: when this machine cannot run aarch64 code (not root, no apt, binfmt_misc
# cannot be mounted), say SKIPPED and exit 0 instead of failing.
#
# Cache (reruns take a fraction of the first run): ${EDGEKIT_ARM64_CACHE:-/var/cache/edgekit/arm64}
# holds the Debian arm64 root (tarball), pip's downloads and the x86_64 TVM library; podman's
# storage keeps the base image and the build layers.  Work files: $CACHE/work (remade each run).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

IF_POSSIBLE=0
for arg in "$@"; do
  case $arg in
    --if-possible) IF_POSSIBLE=1 ;;
    -h | --help) sed -n '2,/^set -Eeuo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "arm64 check: unknown argument $arg" >&2; exit 2 ;;
  esac
done

CACHE=${EDGEKIT_ARM64_CACHE:-/var/cache/edgekit/arm64}
WORK=$CACHE/work
MIRROR=${EDGEKIT_ARM64_MIRROR:-}
SUITE=bookworm
BASE_IMAGE=localhost/edgekit-arm64-base:$SUITE
IMAGE=localhost/edgekit-device:arm64
BASE_TARBALL=$CACHE/debian-$SUITE-arm64-python3.tar.zst
PY=$REPO/.venv/bin/python
APT_PACKAGES=(qemu-user-static binfmt-support debootstrap podman zstd gcc-aarch64-linux-gnu binutils-aarch64-linux-gnu)

# Phases (each timed; a failure names the one it happened in), skip_or_fail, quiet, mounts.
CHECK="arm64 check"
# shellcheck source=tools/_shell.sh
source "$REPO/tools/_shell.sh"
CONTAINER=""
ROOTFS=""
# What edgekit.load selects is checked against the profile's order: emulated speed (and a busy
# host's) says nothing about a device's, so no first-load measurement here or in the image.
export EDGEKIT_MEASURE=0

check_cleanup() {
  if [[ -n ${BASE_PID:-} ]]; then
    echo "arm64 check: letting the background debootstrap finish (the next run reuses it)" >&2
    wait "$BASE_PID"
  fi
  unmount_all
  if [[ -n $CONTAINER ]]; then
    podman umount "$CONTAINER" >/dev/null 2>&1
    podman rm -f "$CONTAINER" >/dev/null 2>&1
  fi
}

# ---------------------------------------------------------------------------------------
phase "machine: QEMU, binfmt_misc, podman"
[[ $(id -u) == 0 ]] || skip_or_fail "needs root (binfmt_misc, chroot, podman storage)"
command -v apt-get >/dev/null || skip_or_fail "needs a Debian/Ubuntu machine (apt-get)"
[[ -x $PY ]] || { echo "arm64 check: $PY is missing: run tools/setup.sh first" >&2; exit 1; }
mkdir -p "$CACHE"
rm -rf "$WORK"
mkdir -p "$WORK/logs"
missing=()
for pkg in "${APT_PACKAGES[@]}"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
if ((${#missing[@]})); then
  echo "   installing ${missing[*]}"
  quiet apt.log apt-get update -q
  quiet apt-install.log env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [[ ! -e /proc/sys/fs/binfmt_misc/status ]]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null ||
    skip_or_fail "cannot mount binfmt_misc (an unprivileged container?)"
fi
update-binfmts --enable qemu-aarch64 2>/dev/null || true
grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null ||
  skip_or_fail "binfmt_misc has no enabled qemu-aarch64 handler"
# F (fix binary): the kernel keeps the interpreter open, so it need not exist inside a chroot.
grep -q '^flags: .*F' /proc/sys/fs/binfmt_misc/qemu-aarch64 ||
  skip_or_fail "the qemu-aarch64 handler lacks the F flag (qemu-user-static registers it with F)"
[[ -n $MIRROR ]] || MIRROR=$(debian_mirror)

# The base image's root (debootstrap; its package set-up runs emulated, minutes) is made in the
# background while the x86_64 side works, when neither the image nor its tarball is cached.
make_base_tarball() {
  local root=$WORK/debootstrap start=$SECONDS
  echo "debootstrap $SUITE arm64 from $MIRROR"
  nice -n 10 debootstrap --arch=arm64 --foreign --variant=minbase \
    --include=python3,python3-venv,ca-certificates "$SUITE" "$root" "$MIRROR"
  nice -n 10 chroot "$root" /debootstrap/debootstrap --second-stage
  # The second stage mounts what it needs and should unmount it; never tar a mounted /proc.
  if grep -q " $root/" /proc/mounts; then
    grep -o " $root/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l
  fi
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* "$root"/debootstrap
  tar -C "$root" --numeric-owner -cf - . | zstd -q -T0 -3 -o "$BASE_TARBALL.tmp"
  mv "$BASE_TARBALL.tmp" "$BASE_TARBALL"
  rm -rf "$root"
  echo "Debian arm64 root made in $((SECONDS - start)) s: $BASE_TARBALL ($(du -h "$BASE_TARBALL" | cut -f1))"
}
BASE_PID=""
if ! podman image exists "$BASE_IMAGE" && [[ ! -f $BASE_TARBALL ]]; then
  echo "   debootstrap of the base root starts in the background (log: $WORK/logs/debootstrap.log)"
  make_base_tarball >"$WORK/logs/debootstrap.log" 2>&1 &
  BASE_PID=$!
fi

# ---------------------------------------------------------------------------------------
phase "x86_64: the rpi5 bundle"
# Cached in $EDGEKIT_CACHE after the first build (seconds then).
quiet build-rpi5.log nice -n 10 "$REPO/.venv/bin/edgekit" build --model models/efficientnet-lite0 --device rpi5 \
  -o "$WORK/bundle"

phase "x86_64: the rpi5 BlazeFace bundle"
# Signed with a key made for this run: inside the image, edgekit.load and the health gate check
# the signature as a device does.  The build steps come from the same cache as the classifier's.
mkdir -p "$WORK/keys"
quiet keys.log "$REPO/.venv/bin/edgekit" keys generate --out "$WORK/keys/builder"
quiet build-rpi5-blazeface.log nice -n 10 "$REPO/.venv/bin/edgekit" build --model models/blazeface \
  --device rpi5 --sign-key "$WORK/keys/builder.pem" -o "$WORK/bundle-blazeface"

phase "x86_64: frames, x86_64 TVM library"
"$PY" - "$WORK/frames" <<'EOF'
import sys
from pathlib import Path

import cv2
from skimage import data

out = Path(sys.argv[1])
out.mkdir(parents=True)
cat = cv2.cvtColor(data.chelsea(), cv2.COLOR_RGB2BGR)
h, w = cat.shape[:2]
frames = {"chelsea": cat, "chelsea-mirror": cat[:, ::-1], "chelsea-crop": cat[h // 10 :, w // 8 : w - w // 8]}
# The cat is a near-tie among cat classes (int8 may flip within them); the espresso is decisive.
frames["coffee"] = cv2.cvtColor(data.coffee(), cv2.COLOR_RGB2BGR)
for name, image in frames.items():
    cv2.imwrite(str(out / f"{name}.png"), image)
# For the detector: faces in astronaut and camera (the cameraman, gray), none in rocket and moon.
faces = out.parent / "faces"
faces.mkdir()
for name in ("astronaut", "camera", "rocket", "moon"):
    image = getattr(data, name)()
    image = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR if image.ndim == 2 else cv2.COLOR_RGB2BGR)
    cv2.imwrite(str(faces / f"{name}.png"), image)
EOF
# The same model's TVM library for x86_64: what a wrong-arch deploy would put on the device.
onnx=$(find "$WORK/bundle/artifacts" -name '*-fp32.onnx' | head -n1)
[[ -n $onnx ]] || { echo "arm64 check: the rpi5 bundle has no fp32 ONNX" >&2; false; }
foreign=$CACHE/x86_64-tvm/$(sha256sum "$onnx" | cut -c1-16)
if [[ ! -f $foreign/model-x86_64.so ]]; then
  rm -rf "$foreign.tmp" && mkdir -p "$foreign.tmp"
  quiet tvm-x86_64.log nice -n 10 "$PY" -c '
import sys
from pathlib import Path
from edgekit.convert.tvm import compile_onnx
from edgekit.device.profiles import get_profile
compile_onnx(Path(sys.argv[1]), Path(sys.argv[2]), get_profile("x86_64-cpu").tvm_target)
' "$onnx" "$foreign.tmp/model-x86_64.so"
  rm -rf "$foreign" && mv "$foreign.tmp" "$foreign"
fi

phase "x86_64: reference runs"
quiet classify-x86_64.log "$PY" tools/arm64_check_inside.py classify "$WORK/bundle" "$WORK/frames" --out "$WORK/x86_64.json"
quiet detect-x86_64.log "$PY" tools/arm64_detect.py detect "$WORK/bundle-blazeface" "$WORK/faces" \
  --trusted-key "$WORK/keys/builder.pub.pem" --out "$WORK/x86_64-detect.json"

# ---------------------------------------------------------------------------------------
phase "wheelhouse: aarch64 wheels"
# Resolved and downloaded here, for the image's Python (3.11, glibc 2.36), at the versions the
# x86_64 side runs; the image installs from them with --no-index (no emulated resolving).
CTX=$WORK/context
mkdir -p "$CTX/wheelhouse" "$WORK/dist"
tar -C "$REPO" --exclude=__pycache__ -cf - pyproject.toml README.md edgekit devices models Dockerfile.arm64 .dockerignore |
  tar -C "$CTX" -xf -
quiet wheel.log "$PY" -m pip wheel --no-deps -w "$WORK/dist" "$CTX"
"$PY" -m pip freeze --exclude-editable 2>/dev/null | grep '==' | grep -v '^edgekit==' >"$WORK/constraints.txt"
platforms=(--platform manylinux2014_aarch64 --platform linux_aarch64)
for v in $(seq 17 36); do platforms+=(--platform "manylinux_2_${v}_aarch64"); done
export PIP_CACHE_DIR=$CACHE/pip
quiet pip-download.log "$PY" -m pip download --dest "$CTX/wheelhouse" --only-binary=:all: \
  --python-version 3.11 --implementation cp --abi cp311 "${platforms[@]}" -c "$WORK/constraints.txt" \
  "$(ls "$WORK"/dist/edgekit-*.whl)[device,litert,tvm,openvino]"
# pip builds the package from /src in the image: its build backend comes from here too.
quiet pip-download-build.log "$PY" -m pip download --dest "$CTX/wheelhouse" --only-binary=:all: hatchling
rm -f "$CTX"/wheelhouse/edgekit-*.whl
echo "   $(find "$CTX/wheelhouse" -name '*.whl' | wc -l) wheels, $(du -sh "$CTX/wheelhouse" | cut -f1)"

# ---------------------------------------------------------------------------------------
phase "base image: Debian $SUITE arm64"
if [[ -n $BASE_PID ]]; then
  echo "   waiting for the debootstrap started at the beginning"
  if ! wait "$BASE_PID"; then
    BASE_PID=""
    echo "arm64 check: making the Debian arm64 root failed:" >&2
    tail -n 40 "$WORK/logs/debootstrap.log" >&2
    false
  fi
  BASE_PID=""
  echo "   $(tail -n 1 "$WORK/logs/debootstrap.log")"
fi
if ! podman image exists "$BASE_IMAGE"; then
  zstd -dc "$BASE_TARBALL" | quiet podman-import.log podman import --arch arm64 --os linux \
    --change 'CMD ["python3"]' - "$BASE_IMAGE"
fi

phase "image: podman build Dockerfile.arm64"
# --isolation chroot: the default OCI runtime cannot set up cgroups here. --format docker keeps
# the HEALTHCHECK (the OCI image format has none).
old_image=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
quiet podman-build.log nice -n 10 podman build --isolation chroot --arch arm64 --format docker \
  -f "$CTX/Dockerfile.arm64" --build-arg "BASE=$BASE_IMAGE" \
  --build-arg "PIP_ARGS=--no-index --find-links /src" -t "$IMAGE" "$CTX"
podman image inspect "$IMAGE" >"$WORK/image.json"
# The image this build replaced (now untagged) would otherwise keep its layers on disk.
if [[ -n $old_image && $old_image != $(podman image inspect --format '{{.Id}}' "$IMAGE") ]]; then
  podman rmi "$old_image" >/dev/null 2>&1 || true
fi
echo "   $(podman image inspect --format '{{.Architecture}} {{.Size}}' "$IMAGE" |
  awk '{printf "%s, %.0f MB", $1, $2 / 1e6}')"

phase "image: its filesystem"
# `podman run` fails here (setrlimit), so the image's filesystem is mounted and entered
# with chroot: a container's writable layer, thrown away at the end.
# A run killed outright leaves its container behind: remove those of this image first.
podman ps -a -q --filter "ancestor=$IMAGE" | xargs -r podman rm -f >/dev/null 2>&1 || true
CONTAINER=$(podman create --arch arm64 "$IMAGE")
ROOTFS=$(podman mount "$CONTAINER")
mount_tracked -t proc proc "$ROOTFS/proc"
# Never /sys: onnxruntime would read the x86 host's CPU topology there and crash.
mount_tracked --bind /dev "$ROOTFS/dev"
mkdir -p "$ROOTFS/tmp/arm64-check"
cp -r "$WORK/bundle" "$WORK/frames" "$WORK/bundle-blazeface" "$WORK/faces" "$ROOTFS/tmp/arm64-check/"
cp "$foreign"/model-x86_64.* tools/arm64_check_inside.py tools/arm64_detect.py "$WORK/keys/builder.pub.pem" \
  "$ROOTFS/tmp/arm64-check/"
chmod -R a+rX "$ROOTFS/tmp/arm64-check"

# The image's own user, environment and working directory.
user=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["Config"]["User"])' "$WORK/image.json")
if [[ $user =~ ^[0-9]+:[0-9]+$ ]]; then
  ids=$user
else
  ids=$(awk -F: -v u="${user%%:*}" '$1 == u || $3 == u {print $3 ":" $4}' "$ROOTFS/etc/passwd")
fi
[[ -n $ids ]] || { echo "arm64 check: the image's user '$user' is not in its /etc/passwd" >&2; false; }
mapfile -t image_env < <("$PY" -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))[0]["Config"]["Env"]))' "$WORK/image.json")
workdir=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["Config"]["WorkingDir"] or "/")' "$WORK/image.json")
# IMAGE_CPU: the QEMU CPU model to emulate (default: QEMU's own, with every feature it has). It is
# passed to each aarch64 program started, since each runs in a QEMU of its own.
IMAGE_CPU=""
# shellcheck disable=SC2016  # $0 and $@ are expanded by the inner sh
in_image() {
  local cpu=()
  [[ -z $IMAGE_CPU ]] || cpu=(QEMU_CPU="$IMAGE_CPU")
  env "${cpu[@]}" chroot --userspec="$ids" "$ROOTFS" /usr/bin/env -i "${image_env[@]}" "${cpu[@]}" \
    EDGEKIT_MEASURE=0 HOME="$workdir" /bin/sh -c 'cd "$0" && exec "$@"' "$workdir" "$@"
}
[[ $(in_image uname -m) == aarch64 ]] || { echo "arm64 check: uname -m in the image is not aarch64" >&2; false; }

phase "arm64: edgekit doctor --json"
in_image edgekit doctor --json >"$WORK/doctor.json" 2>"$WORK/logs/doctor.log" ||
  { tail -n 40 "$WORK/logs/doctor.log" >&2; false; }

phase "arm64: health check"
mapfile -t health < <("$PY" -c '
import json, sys
image = json.load(open(sys.argv[1]))[0]
test = (image.get("Healthcheck") or image["Config"].get("Healthcheck") or {}).get("Test") or []
print("\n".join(test[1:] if test and test[0] == "CMD" else []))' "$WORK/image.json")
((${#health[@]})) || { echo "arm64 check: the image has no HEALTHCHECK (exec form)" >&2; false; }
quiet health.log in_image "${health[@]}"

phase "arm64: classify (emulated)"
quiet classify-arm64.log in_image python /tmp/arm64-check/arm64_check_inside.py classify \
  /tmp/arm64-check/bundle /tmp/arm64-check/frames --foreign-tvm /tmp/arm64-check/model-x86_64.so \
  --out /tmp/arm64-check.json
cp "$ROOTFS/tmp/arm64-check.json" "$WORK/arm64.json"

phase "arm64: detect + health (emulated)"
quiet detect-arm64.log in_image python /tmp/arm64-check/arm64_detect.py detect \
  /tmp/arm64-check/bundle-blazeface /tmp/arm64-check/faces --health \
  --trusted-key /tmp/arm64-check/builder.pub.pem --out /tmp/arm64-check-detect.json
cp "$ROOTFS/tmp/arm64-check-detect.json" "$WORK/arm64-detect.json"

phase "compare"
"$PY" tools/arm64_check_inside.py compare "$WORK/x86_64.json" "$WORK/arm64.json" \
  --doctor "$WORK/doctor.json" --image "$WORK/image.json"

phase "compare: detections"
"$PY" tools/arm64_detect.py compare "$WORK/x86_64-detect.json" "$WORK/arm64-detect.json"

phase "arm64: a Pi 4's core (emulated Cortex-A72: no dot product, no fp16)"
# The same image on an older core: doctor reads its features (QEMU gives them in AT_HWCAP), the
# rpi5 TVM library (+dotprod) is refused before it runs and edgekit.load falls back, and the
# full-range int8 model gives the rows it gave on the default core (no saturation).
IMAGE_CPU=cortex-a72
in_image edgekit doctor --json >"$WORK/doctor-$IMAGE_CPU.json" 2>"$WORK/logs/doctor-$IMAGE_CPU.log" ||
  { tail -n 40 "$WORK/logs/doctor-$IMAGE_CPU.log" >&2; false; }
quiet "classify-$IMAGE_CPU.log" in_image python /tmp/arm64-check/arm64_check_inside.py classify \
  /tmp/arm64-check/bundle /tmp/arm64-check/frames --only tvm-fp32,onnxruntime-int8-full --out "/tmp/arm64-check-$IMAGE_CPU.json"
cp "$ROOTFS/tmp/arm64-check-$IMAGE_CPU.json" "$WORK/arm64-$IMAGE_CPU.json"
"$PY" tools/arm64_check_inside.py compare-cpu "$IMAGE_CPU" "$WORK/arm64-$IMAGE_CPU.json" "$WORK/arm64.json" \
  --doctor "$WORK/doctor-$IMAGE_CPU.json"
IMAGE_CPU=""

phase "done"
echo "arm64 check: PASSED"
