"""Trace cost: the CPU frame tracing takes at 30 fps, off, on (the sampler's defaults) and capped.

Runs the reference bundle on a 30 fps 640x480 synthetic camera in alternating rounds, each
``--frames`` frames: ``off`` (no tracing), ``on`` (``trace(pipeline)`` with its defaults: every
miss, each 5 s window's slowest, 1 % of the rest, at most 10 traces a second) and ``capped``
(``ratio=1``: every frame a candidate, so the cap is what bounds the traces kept; the budget
stays the camera's, so the pipeline itself runs as in ``off``).  The traces go over OTLP/HTTP
to a receiver in another process (it accepts and drops them), so none of its CPU is counted.

Two numbers a round, as a share of one core over the round's wall time:

- *tracing's threads*: the CPU time (``time.thread_time``) spent in the ``traces`` sink (the
  sampler, and the spans of the kept frames) and in the OTLP exporter (encoding, the POST),
  on whatever thread runs them: what tracing costs, unmoved by whatever else the machine runs;
- *the process*: ``time.process_time`` over the round, against the ``off`` round before it; on
  a busy machine this difference is mostly noise, so it is shown, not trusted.

    .venv/bin/python -m benchmarks.trace_cost [BUNDLE] [--rounds 2] [--frames 300]
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from statistics import mean
from typing import Any

import edgekit
from benchmarks._harness import bundle_of, parse, parser, run
from edgekit.telemetry import trace
from edgekit.testing.mosquitto import free_port

# An OTLP/HTTP endpoint that reads each export and answers 200 with an empty ExportTraceServiceResponse.
SINK = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
MODES = ("off", "on", "capped")


class ThreadClock:
    """The CPU time spent inside the functions it wraps, on whichever threads call them."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()

    def wrap(self, obj: Any, name: str) -> None:
        inner: Callable[..., Any] = getattr(obj, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                spent = time.thread_time() - t0
                with self._lock:
                    self.seconds += spent

        setattr(obj, name, timed)  # looked up on the instance at each call: by the sinks, by the SDK


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, bundle=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--source", default="synthetic:640x480@30")
    args = parse(ap, argv)
    bundle = bundle_of(args)
    port = free_port()
    receiver = subprocess.Popen([sys.executable, "-c", SINK, str(port)])
    shares: dict[str, list[float]] = {m: [] for m in MODES}
    extra: dict[str, list[float]] = {m: [] for m in MODES[1:]}
    own: dict[str, list[float]] = {m: [] for m in MODES[1:]}
    kept: dict[str, int] = {m: 0 for m in MODES[1:]}
    try:
        with edgekit.load(bundle, device=args.device) as model:
            print(
                f"{model.name} on {model.candidate}; {args.source}; OTLP/HTTP to a receiver in another process"
            )
            for r in range(args.rounds):
                for mode in MODES:
                    clock = ThreadClock()
                    with edgekit.Pipeline(model, args.source, frames=args.frames) as p:
                        tracer = None
                        if mode != "off":
                            tracer = trace(
                                p,
                                endpoint=f"http://127.0.0.1:{port}",
                                protocol="http/protobuf",
                                ratio=1.0 if mode == "capped" else 0.01,
                            )
                            assert tracer is not None
                            clock.wrap(tracer, "frame")
                            clock.wrap(tracer.tracing.exporter, "export")
                        wall0, cpu0 = time.perf_counter(), time.process_time()
                        p.run()
                    # After the pipeline closed: tracing's last exports count too.
                    wall = time.perf_counter() - wall0
                    share = (time.process_time() - cpu0) / wall
                    shares[mode].append(share)
                    line = f"  round {r + 1} {mode:>6}: process {share:6.1%} of a core"
                    if tracer is not None:
                        c = tracer.sampler.counts
                        kept[mode] += c.missed + c.slowest + c.sampled
                        extra[mode].append(share - shares["off"][-1])
                        own[mode].append(clock.seconds / wall)
                        line += (
                            f" ({extra[mode][-1]:+.2%} on off's), tracing's threads {own[mode][-1]:.3%}"
                            f"; kept {c.to_dict()}"
                        )
                    print(line, flush=True)
    finally:
        receiver.terminate()
        receiver.wait(10)
    frames = args.rounds * args.frames
    print(f"tracing off   : process {mean(shares['off']):.1%} of a core")
    for mode in MODES[1:]:
        print(
            f"tracing {mode:<6}: tracing's threads {max(own[mode]):.3%} of a core at most "
            f"({mean(own[mode]):.3%} on average; {kept[mode]} traces kept of {frames} frames); "
            f"process {mean(shares[mode]):.1%} ({mean(extra[mode]):+.2%} on off's, noise included)"
        )
    return 0


if __name__ == "__main__":
    run(main)
