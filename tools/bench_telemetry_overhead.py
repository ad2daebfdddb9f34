"""Telemetry overhead: frame-loop latency p50/p99 with MQTT telemetry on vs off, in one run.

Starts its own Mosquitto on a free loopback port, then runs the reference bundle on a
30 fps 640x480 synthetic camera in alternating rounds: without telemetry, then with it
(published every ``--interval`` seconds, default 1 s: five times the default rate).
Goal: overhead < 1% on p50.

    .venv/bin/python tools/bench_telemetry_overhead.py [BUNDLE] [--rounds 4] [--frames 300]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
from pathlib import Path

import edgekit
from edgekit.demo import host_reference_bundle
from edgekit.telemetry import report

sys.path.insert(0, str(Path(__file__).parent))
from _mosquitto import start_broker


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", nargs="?", type=Path)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--source", default="synthetic:640x480@30")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    bundle = args.bundle or host_reference_bundle()
    results: dict[str, list[float]] = {"off": [], "on": []}
    ratios: list[float] = []  # on/off p50 of each round pair: robust to a slow phase of the machine
    with tempfile.TemporaryDirectory() as tmp:
        broker, port = start_broker(Path(tmp))
        try:
            with edgekit.load(bundle, device=args.device) as model:
                print(
                    f"{model.name} on {model.candidate}; {args.source}; telemetry every {args.interval:g} s"
                )
                for r in range(args.rounds):
                    for mode in ("off", "on"):
                        lat: list[float] = []
                        with edgekit.Pipeline(model, args.source, frames=args.frames) as p:
                            p.add_observer(lambda rec, into=lat: into.append(rec.latency_ms))
                            if mode == "on":
                                pub = report(
                                    p, f"mqtt://127.0.0.1:{port}", device_id="bench", interval_s=args.interval
                                )
                            p.run()
                        extra = f"  published {pub.published}, acked {pub.acked}" if mode == "on" else ""
                        print(
                            f"  round {r + 1} {mode:>3}: p50 {statistics.median(lat):.3f} ms  "
                            f"p99 {statistics.quantiles(lat, n=100)[98]:.3f} ms{extra}"
                        )
                        results[mode] += lat
                        if mode == "off":
                            off_p50 = statistics.median(lat)
                        else:
                            ratios.append(statistics.median(lat) / off_p50)
        finally:
            broker.terminate()
            broker.wait()
    p50 = {m: statistics.median(v) for m, v in results.items()}
    p99 = {m: statistics.quantiles(v, n=100)[98] for m, v in results.items()}
    print(f"telemetry off : p50 {p50['off']:.3f} ms  p99 {p99['off']:.3f} ms  ({len(results['off'])} frames)")
    print(f"telemetry on  : p50 {p50['on']:.3f} ms  p99 {p99['on']:.3f} ms  ({len(results['on'])} frames)")
    print(f"pooled p50 on/off     : {p50['on'] / p50['off'] - 1:+.2%}")
    over = statistics.median(ratios) - 1
    print(f"paired p50 overhead   : {over:+.2%} (median of {len(ratios)} round pairs; goal < 1%: "
          f"{'met' if over < 0.01 else 'NOT met'})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
