"""A soak: live cameras through the whole pipeline for a long time, and what the process holds per window.

    .venv/bin/python -m benchmarks.soak [BUNDLE] [--minutes 60] [--cameras 4] [--fps 30]
        [--restart-every 180] [--window 60] [--p99-every 600] [--source URI ...] [--json]

One pipeline watches ``--cameras`` network cameras on loopback, each another process as an
IP camera is another machine: RTSP (H.264 640x480, ``tests/rtsp_server.py``) where that
server is there, else Motion JPEG over HTTP (``--camera-kind``); or the ``--source`` URIs
given (repeat it).  Telemetry goes to a real Mosquitto started on loopback, the preview
server runs with a viewer reading its MJPEG stream, and every ``--restart-every`` seconds
one of the cameras (in turn) is stopped on the server side (its connections cut) and started
again ``--down`` seconds later; the source reopens by itself.

Every ``--window`` seconds: frames, drops, outages, latency p50/p99, RSS, the Python heap
(tracemalloc), open fds and threads (``edgekit.bench.soak``); the p99 per ``--p99-every``;
each resource's slope per hour after ``--warmup`` (least squares over the windows); each
camera's frames expected at ``--fps`` outside its counted outages against those captured
(``lost``: 0 is the goal); and the verdict against the bounds (``edgekit.bench.soak_judge``).
"""

from __future__ import annotations

import gc
import shutil
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol

import edgekit
from benchmarks._harness import bundle_of, parse, parser, print_doc, progress_on_stderr, run
from edgekit.bench.soak import SoakRecorder
from edgekit.bench.soak_judge import MIB, Bounds, frames_lost, render, report
from edgekit.core import resources
from edgekit.pipeline.sources import open_source, parse_source
from edgekit.preview import start_preview
from edgekit.telemetry import report as report_telemetry
from edgekit.testing.mosquitto import Mosquitto
from edgekit.testing.preview_viewer import PreviewViewer

TESTS = Path(__file__).resolve().parent.parent / "tests"
#: What a long soak may grow by after its warm-up: a leak of 1 kB a frame at 4 x 30 fps is 430 MiB an hour.
LONG_BOUNDS = Bounds(rss_mib=64.0, heap_mib=16.0, blocks=50_000, fds=4, threads=2)


class Restartable(Protocol):
    """A camera server the soak can take away and bring back on the same address."""

    @property
    def url(self) -> str: ...

    def stop(self) -> None: ...

    def start(self) -> object: ...


class MjpegProcess:
    """``benchmarks.camera_outage``'s MJPEG camera process, seen as a ``Restartable``: stop/start are signals."""

    def __init__(self, fps: float) -> None:
        from benchmarks.camera_outage import NetworkCamera

        self.camera = NetworkCamera(fps)
        self.camera.start()

    @property
    def url(self) -> str:
        return self.camera.url

    def stop(self) -> None:
        self.camera.down()

    def start(self) -> None:
        self.camera.up()

    def close(self) -> None:
        self.camera.kill()


def rtsp_available() -> bool:
    """Whether ``tests/rtsp_server.py`` can serve RTSP cameras here (it says why not)."""
    if not (TESTS / "rtsp_server.py").is_file():
        return False
    return _rtsp_server().rtsp_server_missing() is None


def _rtsp_server() -> Any:
    """The tests' RTSP camera module (gst-rtsp-server under the system Python, in its own process)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import rtsp_server  # type: ignore[import-not-found]

    return rtsp_server


def start_cameras(kind: str, count: int, fps: float, stack: ExitStack) -> list[Restartable]:
    """``count`` cameras of ``kind`` (rtsp, mjpeg), closed with ``stack``."""
    cams: list[Restartable] = []
    if kind == "rtsp":
        RtspCamera = _rtsp_server().RtspCamera
        for _ in range(count):
            cams.append(stack.enter_context(RtspCamera(codec="h264", width=640, height=480, fps=int(fps))))
        return cams
    for _ in range(count):
        cam = MjpegProcess(fps)
        stack.callback(cam.close)
        cams.append(cam)
    return cams


class Restarter:
    """Every ``every_s``, the next camera is stopped and started again ``down_s`` later; none
    after ``last_at`` (``time.monotonic()``), so that the soak ends with every camera back."""

    def __init__(
        self, cameras: Sequence[Restartable], every_s: float, down_s: float, last_at: float | None = None
    ) -> None:
        self.cameras, self.every_s, self.down_s, self.last_at = list(cameras), every_s, down_s, last_at
        self.restarts = 0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-restarter", daemon=True)

    def start(self) -> Restarter:
        if self.cameras and self.every_s > 0:
            self._thread.start()
        return self

    def _run(self) -> None:
        i = 0
        while not self._halt.wait(self.every_s):
            if self.last_at is not None and time.monotonic() > self.last_at:
                break
            cam = self.cameras[i % len(self.cameras)]
            cam.stop()
            self._halt.wait(self.down_s)
            cam.start()  # even when halted: the camera is left as it was found
            self.restarts += 1
            i += 1

    def stop(self) -> None:
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join()


def expected_rate(uri: str, fps: float) -> float | None:
    """The rate a camera's frames are expected at: a synthetic source's own (0: none), else ``fps``."""
    spec = parse_source(uri)
    if spec.kind == "synthetic":
        rate = float(spec.params["fps"])
        return rate if rate > 0 else None
    return fps


def _open_once(sources: Mapping[str, str]) -> None:
    """Open and close each source once, so that what the libraries start once per process (GLib's
    main-context thread, its thread pool and their eventfds, GStreamer's registry) is there
    before the soak's first sample: held once, it is not what the soak looks for."""
    for uri in sources.values():
        source = open_source(uri)
        try:
            source.read()
        finally:
            source.close()


def soak(
    model: Any,
    sources: Mapping[str, str],
    *,
    seconds: float | None = None,
    frames: int | None = None,
    at_least_s: float = 0.0,
    restart: Sequence[Restartable] = (),
    restart_every_s: float = 180.0,
    down_s: float = 2.5,
    fps: float = 30.0,
    window_s: float = 60.0,
    coarse_s: float | None = None,
    warmup_s: float = 120.0,
    bounds: Bounds = LONG_BOUNDS,
    telemetry_interval_s: float = 5.0,
    heap: bool = True,
    judge_lost: bool = True,
    progress: bool = True,
    on_result: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Run ``sources`` through ``model``'s pipeline with telemetry, a watched preview and restarts;
    until ``seconds`` or ``frames`` (whichever first, but ``frames`` not before ``at_least_s``: a
    fast machine still gets its warm-up, windows after it and restarts).  Returns ``soak_judge.report``'s document
    plus the restarts, the viewer's frames and the telemetry's messages.  ``on_result`` is the
    loop body: called with each ``FrameResult``."""
    if seconds is None and frames is None:
        raise ValueError("give seconds or frames")
    rates = {name: expected_rate(uri, fps) for name, uri in sources.items()}
    started_tracing = heap and not tracemalloc.is_tracing()
    if started_tracing:
        tracemalloc.start(1)
    work = Path(tempfile.mkdtemp(prefix="edgekit-soak-"))
    try:
        with Mosquitto(work, persistence=False, log=False) as broker:
            _open_once(sources)
            gc.collect()
            before = resources.sample()
            doc, extra = _run(
                model, sources, broker, work / "spool", rates, seconds, frames, at_least_s, restart, restart_every_s, down_s,
                window_s, coarse_s, telemetry_interval_s, progress, on_result,
            )  # fmt: skip
            gc.collect()
            after = resources.sample()
    finally:
        if started_tracing:
            tracemalloc.stop()
        shutil.rmtree(work, ignore_errors=True)
    recorder, counts = doc
    cams = {name: frames_lost(recorder.tracks[name], rates[name]) | counts[name] for name in sources}
    config = {
        "candidate": model.candidate,
        "sources": {n: _redacted(u) for n, u in sources.items()},
        "window_s": window_s,
        "restart_every_s": restart_every_s if restart else None,
        "down_s": down_s,
        "fps": fps,
        "tracemalloc": heap,
    }
    out = report(
        recorder.windows,
        warmup_s,
        bounds,
        before=before,
        after=after,
        cameras=cams,
        coarse=recorder.coarse,
        config=config,
        judge_lost=judge_lost,
    )
    return out | extra


def _redacted(uri: str) -> str:
    from edgekit.core.redact import redact_source

    return redact_source(uri)


def _run(
    model: Any,
    sources: Mapping[str, str],
    broker: Mosquitto,
    spool: Path,
    rates: Mapping[str, float | None],
    seconds: float | None,
    frames: int | None,
    at_least_s: float,
    restart: Sequence[Restartable],
    restart_every_s: float,
    down_s: float,
    window_s: float,
    coarse_s: float | None,
    telemetry_interval_s: float,
    progress: bool,
    on_result: Callable[[Any], None] | None,
) -> tuple[tuple[SoakRecorder, dict[str, dict[str, Any]]], dict[str, Any]]:
    with edgekit.Pipeline(model, sources=dict(sources)) as p:
        publisher = report_telemetry(
            p,
            broker.url,
            device_id="soak",
            interval_s=telemetry_interval_s,
            labels_interval_s=1.0,
            spool=spool,
        )
        preview = start_preview(p, "127.0.0.1:0")
        viewer = PreviewViewer(preview.url).start()
        recorder = SoakRecorder(p, window_s=window_s, coarse_s=coarse_s, rates=rates)
        t0 = time.monotonic()
        end = t0 + seconds if seconds is not None else None
        not_before = t0 + at_least_s
        # The last window's sample should find every camera connected, as the first one did.
        settled = None if end is None else end - max(window_s, 4 * down_s + 5.0)
        restarter = Restarter(restart, restart_every_s, down_s, last_at=settled)
        shown = 0
        try:
            recorder.start()
            restarter.start()
            for result in p:
                if on_result is not None:
                    on_result(result)
                now = time.monotonic()
                if (frames is not None and p.counters.frames >= frames and now >= not_before) or (
                    end is not None and now >= end
                ):
                    recorder.stop()  # the last window's sample while every camera still runs
                    break
                if progress and len(recorder.windows) > shown:
                    _progress(recorder.windows[shown], restarter.restarts)
                    shown += 1
        finally:
            recorder.stop()
            restarter.stop()
            viewer.stop()
        if progress:
            for w in recorder.windows[shown:]:
                _progress(w, restarter.restarts)
        extra = {
            "restarts": restarter.restarts,
            "preview_frames": viewer.frames,
            "preview_reconnects": viewer.reconnects,
            "telemetry_published": publisher.published,
            "telemetry_acked": publisher.acked,
            "telemetry_connects": publisher.connects,
        }
        counts = {
            name: {
                "outages": src.counters.outages,
                "reopens": src.counters.reopens,
                "stalls": src.counters.stalls,
                "down_s": round(src.counters.down_s, 3),  # the source's own count of time without frames
                "dropped": p.per_camera[name].dropped,
            }
            for name, src in p.sources.items()
        }
    # Only numbers leave: the pipeline (its telemetry client, its sockets) is gone before the
    # process is sampled after the run.
    return (recorder, counts), extra


def _progress(w: Any, restarts: int) -> None:
    r = w.resources
    heap = f"{r.heap_bytes / MIB:.1f}" if r.heap_bytes is not None else "-"
    rss = f"{r.rss_bytes / MIB:.1f}" if r.rss_bytes is not None else "-"
    print(
        f"{w.end_s:7.0f} s: {w.frames} frames ({w.fps:.0f}/s), dropped {w.dropped}, outages {w.outages}, "
        f"p99 {w.p99_ms:.2f} ms, RSS {rss} MiB, heap {heap} MiB, fds {r.fds}, threads {r.threads}/"
        f"{r.tasks}, restarts {restarts}",
        file=sys.stderr,
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, bundle=True, json_flag=True)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--cameras", type=int, default=4, help="cameras the soak starts (without --source)")
    ap.add_argument(
        "--fps", type=float, default=30.0, help="the cameras' rate, and the rate frames are expected at"
    )
    ap.add_argument(
        "--camera-kind",
        choices=("rtsp", "mjpeg"),
        default="rtsp" if rtsp_available() else "mjpeg",
        help="the cameras the soak starts (default: rtsp where tests/rtsp_server.py is there)",
    )
    ap.add_argument("--source", action="append", default=[], help="a source URI instead (repeat it)")
    ap.add_argument("--restart-every", type=float, default=180.0, help="s between camera restarts (0: none)")
    ap.add_argument("--down", type=float, default=2.5, help="s a restarted camera stays away")
    ap.add_argument("--window", type=float, default=60.0, help="s per window")
    ap.add_argument("--p99-every", type=float, default=600.0, help="s per coarse p99 window")
    ap.add_argument("--warmup", type=float, default=120.0, help="s left out of the slopes and bounds")
    ap.add_argument("--no-tracemalloc", action="store_true", help="leave the Python heap untraced")
    args = parse(ap, argv)
    with progress_on_stderr(args.json), ExitStack() as stack:
        model = stack.enter_context(edgekit.load(bundle_of(args), device=args.device, allow_unsigned=True))
        if args.source:
            cams: list[Restartable] = []
            sources = {f"cam{i}": uri for i, uri in enumerate(args.source)}
        else:
            cams = start_cameras(args.camera_kind, args.cameras, args.fps, stack)
            sources = {f"cam{i}": c.url for i, c in enumerate(cams)}
        print(
            f"soak: {len(sources)} cameras ({args.camera_kind if cams else 'given'}), {args.minutes:g} min, "
            f"{model.candidate}, restart every {args.restart_every:g} s",
            flush=True,
        )
        doc = soak(
            model,
            sources,
            seconds=args.minutes * 60,
            restart=cams,
            restart_every_s=args.restart_every,
            down_s=args.down,
            fps=args.fps,
            window_s=args.window,
            coarse_s=args.p99_every,
            warmup_s=args.warmup,
            heap=not args.no_tracemalloc,
        )
        doc["config"]["camera_kind"] = args.camera_kind if cams else "given"
    print_doc(doc, args.json, render)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    run(main)
