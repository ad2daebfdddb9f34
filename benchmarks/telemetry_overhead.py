"""Telemetry overhead: frame-loop latency p50/p99 with MQTT telemetry on vs off, in one run.

Starts its own Mosquitto on a free loopback port, then runs the reference bundle on a
30 fps 640x480 synthetic camera in alternating rounds: without telemetry, then with it
(published every ``--interval`` seconds, default 1 s: five times the default rate).
Goal: overhead < 1% on p50.

    .venv/bin/python -m benchmarks.telemetry_overhead [BUNDLE] [--rounds 4] [--frames 300]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import edgekit
from benchmarks._harness import bundle_of, parse, parser, run, verdict
from edgekit.core.stats import median, percentile
from edgekit.pipeline import sink
from edgekit.telemetry import report
from edgekit.testing.mosquitto import Mosquitto


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, bundle=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--source", default="synthetic:640x480@30")
    args = parse(ap, argv)
    bundle = bundle_of(args)
    results: dict[str, list[float]] = {"off": [], "on": []}
    ratios: list[float] = []  # on/off p50 of each round pair: robust to a slow phase of the machine
    # Neither persistence nor a log: the broker's own work should not weigh on the frame loop.
    with (
        tempfile.TemporaryDirectory() as tmp,
        Mosquitto(Path(tmp), persistence=False, log=False) as broker,
        edgekit.load(bundle, device=args.device) as model,
    ):
        print(f"{model.name} on {model.candidate}; {args.source}; telemetry every {args.interval:g} s")
        for r in range(args.rounds):
            for mode in ("off", "on"):
                lat: list[float] = []
                with edgekit.Pipeline(model, args.source, frames=args.frames) as p:
                    p.add_sink(sink("latency", lambda r: lat.append(r.record.latency_ms)))  # noqa: B023 - this round only
                    if mode == "on":
                        pub = report(p, broker.url, device_id="bench", interval_s=args.interval)
                    p.run()
                extra = f"  published {pub.published}, acked {pub.acked}" if mode == "on" else ""
                print(
                    f"  round {r + 1} {mode:>3}: p50 {median(lat):.3f} ms  "
                    f"p99 {percentile(sorted(lat), 99):.3f} ms{extra}"
                )
                results[mode] += lat
                if mode == "off":
                    off_p50 = median(lat)
                else:
                    ratios.append(median(lat) / off_p50)
    p50 = {m: median(v) for m, v in results.items()}
    tail = {m: percentile(sorted(v), 99) for m, v in results.items()}
    print(
        f"telemetry off : p50 {p50['off']:.3f} ms  p99 {tail['off']:.3f} ms  ({len(results['off'])} frames)"
    )
    print(f"telemetry on  : p50 {p50['on']:.3f} ms  p99 {tail['on']:.3f} ms  ({len(results['on'])} frames)")
    print(f"pooled p50 on/off     : {p50['on'] / p50['off'] - 1:+.2%}")
    over = median(ratios) - 1
    print(f"paired p50 overhead   : {over:+.2%} (median of {len(ratios)} round pairs; goal < 1%: "
          f"{verdict(over < 0.01)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    run(main)
