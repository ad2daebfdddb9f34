"""Budget behaviour: 10,000 frames of a 30 fps real-time source with a 33 ms budget, then again under a CPU hog.

Run one: the pipeline alone.  Run two: the same, while another process spins on one of
the cores (pinned there with ``sched_setaffinity``).  For each it prints frames, misses,
drops, the latency percentiles and how long frames waited in the slot; then whether the
loaded run kept p99 within 2x the budget, counted its drops, and queued nothing (with
drop-oldest a frame never waits behind another: its wait stays under one inference).

    .venv/bin/python -m benchmarks.pipeline_budget [BUNDLE] [--frames 10000] [--budget 33]

Without BUNDLE it uses (building if needed) the reference bundle ``edgekit demo`` uses.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import edgekit
from benchmarks._harness import bundle_of, parse, parser, run
from edgekit.pipeline import Summary, sink

HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def measure(model: edgekit.Model, args: argparse.Namespace, title: str) -> tuple[Summary, float]:
    max_wait = 0.0

    def watch(rec: edgekit.FrameRecord) -> None:
        nonlocal max_wait
        max_wait = max(max_wait, rec.capture_wait_ms)

    with edgekit.Pipeline(
        model, args.source, budget_ms=args.budget, policy=args.policy, frames=args.frames
    ) as p:
        p.add_sink(sink("watch", lambda r: watch(r.record)))
        summary = p.run()
    d = summary.to_dict()
    lat, c = d["latency_ms"], d["counters"]
    print(
        f"{title:<22} frames {d['frames']:>6}  qps {d['qps']:6.2f}  misses {c['missed']:>5} ({d['miss_rate']:.3%})  "
        f"drops {c['dropped']:>5}  p50 {lat['p50']:6.2f}  p99 {lat['p99']:6.2f}  p99.9 {lat['p99.9']:6.2f}  "
        f"max {lat['max']:6.2f} ms  slot wait p99 {d['stages_ms']['capture_wait']['p99']:.2f} max {max_wait:.2f} ms"
    )
    return summary, max_wait


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, bundle=True)
    ap.add_argument("--frames", type=int, default=10_000)
    ap.add_argument("--budget", type=float, default=33.0)
    ap.add_argument("--policy", default="drop-oldest")
    ap.add_argument("--source", default="synthetic:640x480@30")
    ap.add_argument("--hog-core", type=int, default=0)
    args = parse(ap, argv)
    bundle = bundle_of(args)
    with edgekit.load(bundle, device=args.device) as model:
        print(
            f"{model.name} on {model.candidate}; {args.source}; budget {args.budget:g} ms; {args.policy}; "
            f"{args.frames} frames per run; {os.cpu_count()} cores"
        )
        quiet, _ = measure(model, args, "alone")
        hog = subprocess.Popen([sys.executable, "-c", HOG, str(args.hog_core)])
        try:
            loaded, max_wait = measure(model, args, f"CPU hog on core {args.hog_core}")
        finally:
            hog.kill()
            hog.wait()
    q, lo = quiet.to_dict(), loaded.to_dict()
    bounded = lo["latency_ms"]["p99"] <= 2 * args.budget
    print(f"p99 loaded / alone      : {lo['latency_ms']['p99'] / q['latency_ms']['p99']:.2f}x")
    print(
        f"p99 loaded <= 2x budget : {'yes' if bounded else 'NO'} ({lo['latency_ms']['p99']:.2f} ms vs {2 * args.budget:g} ms)"
    )
    print(f"drops counted (loaded)  : {lo['counters']['dropped']} (frames seen = labelled + dropped: "
          f"{lo['frames'] + lo['counters']['dropped']})")  # fmt: skip
    infer_max = lo["stages_ms"]["inference"]["max"] + lo["stages_ms"]["preprocess"]["max"]
    print(f"nothing queued          : {'yes' if max_wait <= infer_max + 5 else 'NO'} "
          f"(longest slot wait {max_wait:.2f} ms <= one frame's processing {infer_max:.2f} ms)")  # fmt: skip
    return 0 if bounded else 1


if __name__ == "__main__":
    run(main)
