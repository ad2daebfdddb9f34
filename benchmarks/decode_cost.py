"""What decoding one 640x480 H.264 stream at 30 fps costs the CPU, and how many streams fit on two cores.

    .venv/bin/python -m benchmarks.decode_cost [--seconds 20] [--fps 30] [--cores 2] [--json]

Two ways to the same BGR frames, measured in this process's CPU time (``time.process_time``:
every thread, the decoder's included) over the frames read, never wall-clock:

* ``gstreamer``: ``GstSource`` (rtspsrc ! decodebin(avdec_h264) ! videoconvert ! appsink, the
  one copy into the frame), the path RTSP takes where PyGObject is installed;
* ``opencv``: ``cv2.VideoCapture`` with FFmpeg, the path without it.

Each is run on a live RTSP camera for ``--seconds`` (served at ``--fps`` by another process,
the system Python's gst-rtsp-server, so its encoder is not in this process's time), and on
the same kind of clip from a file as fast as it decodes (decode and conversion only).  The
camera is x264 ``tune=zerolatency`` (no B-frames, as IP cameras send), 2 Mbit/s, a key frame
every 2 s, a moving test pattern.  ``streams on N cores`` is ``N x 1000 ms / (ms per frame x
fps)``: the decode alone, before any inference.  OpenCV runs on one thread, as ``Pipeline``
sets it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import parse, parser, print_doc, progress_on_stderr, run

WIDTH, HEIGHT = 640, 480
BITRATE_KBPS = 2000
CLIP_S = 20  # the file's length: 600 frames at 30 fps, decoded as fast as they come
# The camera: a moving pattern, encoded as an IP camera encodes (no B-frames, a key frame every 2 s).
SOURCE = "videotestsrc is-live={live} pattern=smpte horizontal-speed=4 {extra}"
ENCODE = "x264enc tune=zerolatency speed-preset=veryfast bitrate={kbps} key-int-max={gop}"
SERVE = """
import sys
import gi
gi.require_version("Gst", "1.0"); gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer
Gst.init(None)
server = GstRtspServer.RTSPServer(); server.set_address("127.0.0.1"); server.set_service(sys.argv[1])
factory = GstRtspServer.RTSPMediaFactory(); factory.set_shared(True); factory.set_launch(sys.argv[2])
server.get_mount_points().add_factory("/cam", factory); server.attach(None)
print("ready", flush=True)
GLib.MainLoop().run()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def caps(fps: float) -> str:
    # I420: what IP cameras send (without it videotestsrc hands x264 4:4:4 10-bit, High 4:4:4).
    return f"video/x-raw,format=I420,width={WIDTH},height={HEIGHT},framerate={int(fps)}/1"


def serve(fps: float) -> tuple[subprocess.Popen[str], str]:
    """The RTSP camera in the system Python (gst-rtsp-server's bindings), its URL once it listens."""
    port = free_port()
    launch = (
        "( "
        + SOURCE.format(live="true", extra="")
        + f" ! {caps(fps)} ! videoconvert ! "
        + ENCODE.format(kbps=BITRATE_KBPS, gop=int(2 * fps))
        + " ! rtph264pay name=pay0 pt=96 )"
    )
    proc = subprocess.Popen(
        ["/usr/bin/python3", "-c", SERVE, str(port), launch], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc, f"rtsp://127.0.0.1:{port}/cam"


def encode_clip(path: Path, fps: float, seconds: float) -> Path:
    """The same camera, as a file (encoded before any measurement)."""
    frames = int(fps * seconds)
    pipeline = (
        SOURCE.format(live="false", extra=f"num-buffers={frames}")
        + f" ! {caps(fps)} ! "
        + ENCODE.format(kbps=BITRATE_KBPS, gop=int(2 * fps))
        + f" ! h264parse ! mp4mux ! filesink location={path}"
    )
    subprocess.run(["gst-launch-1.0", "-q", *pipeline.split()], check=True, timeout=300)
    return path


def measure(read: Any, seconds: float | None, frames: int | None = None) -> dict[str, Any]:
    """CPU ms per frame over the frames ``read()`` returns, after 30 warm-up frames."""
    for _ in range(30):
        if read() is None:
            raise RuntimeError("the source ended during warm-up")
    cpu0, wall0, n = time.process_time(), time.monotonic(), 0
    while (seconds is None or time.monotonic() - wall0 < seconds) and (frames is None or n < frames):
        if read() is None:
            break
        n += 1
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    return {"frames": n, "cpu_s": round(cpu, 3), "wall_s": round(wall, 2), "cpu_ms_per_frame": 1000 * cpu / n}


def gstreamer_reader(uri: str, kind: str) -> tuple[Any, Any, str]:
    from edgekit.pipeline.gst_source import GstSource
    from edgekit.pipeline.sources import SourceInfo

    src = GstSource(SourceInfo(uri, kind, kind == "stream"), decoder="software")
    return src.read, src.close, ",".join(src.decoders)


def opencv_reader(uri: str, kind: str) -> tuple[Any, Any, str]:
    import cv2

    cap = cv2.VideoCapture(uri, cv2.CAP_FFMPEG)
    if not cap.isOpened():
        raise RuntimeError(f"OpenCV's FFmpeg cannot open {uri}")

    def read() -> Any:
        ok, frame = cap.read()
        return frame if ok else None

    return read, cap.release, "FFmpeg h264 (libavcodec)"


def cpu_facts() -> dict[str, Any]:
    text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    info: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            info.setdefault(key.strip(), value.strip())
    flags = set(info.get("flags", "").split())
    notable = [
        f for f in ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags
    ]
    return {
        "model": info.get("model name", platform.processor()),
        "cores": os.cpu_count(),
        "flags": notable,
        "load_before": os.getloadavg()[0],
    }


def one_run(how: str, uri: str, kind: str, seconds: float | None, frames: int | None) -> dict[str, Any]:
    """One measurement, in the process that runs it (``--one``): one decode path in it, nothing else."""
    import cv2

    # One OpenCV thread, as Pipeline sets it (opencv_threads=1): at 30 fps its pool's workers wake
    # for every frame's conversion and spin; that doubled the conversion's CPU time here.
    cv2.setNumThreads(1)
    opener = gstreamer_reader if how == "gstreamer" else opencv_reader
    read, close, decoder = opener(uri, kind)
    try:
        result = measure(read, seconds, frames)
    finally:
        close()
    return {**result, "decoder": decoder}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, json_flag=True)
    ap.add_argument("--seconds", type=float, default=20.0, help="how long each live run reads (default 20)")
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--cores", type=int, default=2, help="the cores the stream count is for (default 2)")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of every run, alternating (default 2)")
    ap.add_argument(
        "--one", nargs=5, metavar=("HOW", "URI", "KIND", "SECONDS", "FRAMES"), help=argparse.SUPPRESS
    )
    args = parse(ap, argv)
    if args.one:
        how, uri, kind, seconds, frames = args.one
        print(json.dumps(one_run(how, uri, kind, float(seconds) or None, int(frames) or None)))
        return 0
    if shutil.which("gst-launch-1.0") is None:
        print(
            "decode_cost needs GStreamer's tools (gst-launch-1.0): tools/setup.sh installs them",
            file=sys.stderr,
        )
        return 2
    doc: dict[str, Any] = {
        "cpu": cpu_facts(),
        "fps": args.fps,
        "size": f"{WIDTH}x{HEIGHT}",
        "cores": args.cores,
        "runs": [],
    }
    with progress_on_stderr(args.json), tempfile.TemporaryDirectory() as tmp:
        clip = encode_clip(Path(tmp) / "clip.mp4", args.fps, seconds=CLIP_S)
        server, url = serve(args.fps)
        try:
            for how in ("gstreamer", "opencv") * args.repeats:
                for what, uri, kind, seconds, frames in (
                    ("file, unpaced", str(clip), "file", 0.0, int(args.fps * CLIP_S) - 60),
                    (f"RTSP live, {args.fps:g} fps", url, "stream", args.seconds, 0),
                ):
                    print(f"{how}: {what} ...", flush=True)
                    # Each run in a process of its own: its CPU time is that path's alone.  Run
                    # in this process after the file run, GStreamer's live run cost 1.6-1.8 ms a
                    # frame, against 1.2 in a fresh process (not explained; noted on the page).
                    one = ["--one", how, uri, kind, str(seconds), str(frames)]
                    out = subprocess.run(
                        [sys.executable, "-m", "benchmarks.decode_cost", *one],
                        capture_output=True,
                        text=True,
                        timeout=seconds + 120,
                        check=True,
                    )
                    result = json.loads(out.stdout.strip().splitlines()[-1])
                    ms = result["cpu_ms_per_frame"]
                    result.update(
                        how=how,
                        what=what,
                        cpu_ms_per_frame=round(ms, 2),
                        streams_on_cores=math.floor(args.cores * 1000 / (ms * args.fps)),
                    )
                    doc["runs"].append(result)
        finally:
            server.terminate()
            server.wait(10)
    print_doc(doc, args.json, render)
    return 0


def render(doc: dict[str, Any]) -> str:
    cpu = doc["cpu"]
    lines = [
        f"{cpu['model']}, {cpu['cores']} cores ({', '.join(cpu['flags']) or 'no AVX2'}), "
        f"load {cpu['load_before']:.2f} before; {doc['size']} H.264 at {doc['fps']:g} fps",
        f"{'path':<10} {'source':<22} {'decoder':<26} {'frames':>6} {'CPU ms/frame':>12} {'streams/' + str(doc['cores']) + ' cores':>15}",
    ]
    for r in doc["runs"]:
        lines.append(
            f"{r['how']:<10} {r['what']:<22} {r['decoder']:<26} {r['frames']:>6} "
            f"{r['cpu_ms_per_frame']:>12.2f} {r['streams_on_cores']:>15}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    run(main)
