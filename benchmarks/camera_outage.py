"""A camera that dies mid-run: reopened and counted, and the other cameras' p99 as it was.

    .venv/bin/python -m benchmarks.camera_outage [BUNDLE] [--cameras 4] [--fps 30] [--seconds 20] [--json]

One pipeline watches ``--cameras`` synthetic 640x480 cameras and one network camera (Motion
JPEG over HTTP on loopback, served by another process, as an IP camera is another machine).
Runs of ``--seconds`` each, alternating ``--repeats`` times: all cameras alive, then the
network camera gone a third of the way in (its streams cut, connections refused) and back
3 s later on the same port.  For each run: every synthetic camera's p99 and drops, the
network camera's frames, outages and reopens.  The undisturbed runs give the noise the
disturbed runs' p99s are compared with: the range of each.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import edgekit
from benchmarks._harness import bundle_of, parse, parser, print_json, progress_on_stderr, run

TESTS = Path(__file__).resolve().parent.parent / "tests"
# The network camera's process: the tests' loopback MJPEG camera, serving one image at FPS on PORT;
# SIGUSR1 takes it off the network (streams cut, connections refused), SIGUSR2 brings it back.
SERVE = """
import signal, sys, time, cv2
from skimage import data
import mjpeg_server
cam = mjpeg_server.MjpegCamera([cv2.resize(data.chelsea()[..., ::-1], (640, 480))], fps=float(sys.argv[2]))
cam.port = int(sys.argv[1])
signal.signal(signal.SIGUSR1, lambda *_: cam.stop())
signal.signal(signal.SIGUSR2, lambda *_: cam.start())
cam.start()
while True:
    time.sleep(3600)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class NetworkCamera:
    """The MJPEG camera in its own process: ``start()``, ``down()`` / ``up()``, ``kill()``.

    Going down and up is signalled to the running process, not done by killing and starting
    one: a new Python process importing OpenCV costs this machine a second of CPU, which a
    camera on the network does not.
    """

    def __init__(self, fps: float) -> None:
        self.port, self.fps = free_port(), fps
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/stream.mjpg"

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(TESTS)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, str(self.port), str(self.fps)], env=env, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # listening yet?
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError("the network camera did not start")

    def down(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGUSR1)

    def up(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGUSR2)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None


def one_run(model: Any, cameras: int, fps: float, seconds: float, outage: bool) -> dict[str, Any]:
    net = NetworkCamera(fps)
    net.start()
    sources = {f"synth{i}": f"synthetic:640x480@{fps:g}" for i in range(cameras)} | {"net": net.url}
    timers: list[threading.Timer] = []
    try:
        with edgekit.Pipeline(model, sources=sources, duration_s=seconds, policy="drop-oldest") as p:
            if outage:
                timers = [threading.Timer(seconds / 3, net.down), threading.Timer(seconds / 3 + 3, net.up)]
                for t in timers:
                    t.start()
            for _ in p:
                pass
            d = p.summary().to_dict()
    finally:
        for t in timers:
            t.cancel()
        net.kill()
    cams = d["cameras"]
    return {
        "outage": outage,
        "synthetic_p99_ms": {n: c["latency_ms"]["p99"] for n, c in cams.items() if n != "net"},
        "synthetic_dropped": sum(c["dropped"] for n, c in cams.items() if n != "net"),
        "net_frames": cams["net"]["frames"],
        "source_outages": d["counters"]["source_outages"],
        "source_reopens": d["counters"]["source_reopens"],
        "batch": d["batch"],
        "frames": d["frames"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, bundle=True, json_flag=True)
    ap.add_argument("--cameras", type=int, default=4, help="synthetic cameras beside the network one")
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=3, help="pairs of runs (alive, then the outage)")
    args = parse(ap, argv)
    with (
        progress_on_stderr(args.json),
        edgekit.load(bundle_of(args), device=args.device, allow_unsigned=True) as model,
    ):
        runs = []
        for outage in (False, True) * args.repeats:
            row = one_run(model, args.cameras, args.fps, args.seconds, outage)
            runs.append(row)
            worst = max(row["synthetic_p99_ms"].values())
            print(
                f"{'network camera gone for 3 s' if outage else 'all cameras alive':<36}: "
                f"synthetic p99 worst {worst:.2f} ms, dropped {row['synthetic_dropped']}; network camera "
                f"{row['net_frames']} frames, outages {row['source_outages']}, reopens {row['source_reopens']}",
                flush=True,
            )
        calm = [max(r["synthetic_p99_ms"].values()) for r in runs if not r["outage"]]
        hit = [max(r["synthetic_p99_ms"].values()) for r in runs if r["outage"]]
        print(
            f"worst synthetic p99: {min(hit):.2f}-{max(hit):.2f} ms with the outage, "
            f"{min(calm):.2f}-{max(calm):.2f} ms without",
            flush=True,
        )
        doc = {"candidate": model.candidate, "runs": runs, "cameras": args.cameras, "fps": args.fps}
    if args.json:
        print_json(doc, indent=1)
    return 0


if __name__ == "__main__":
    run(main)
