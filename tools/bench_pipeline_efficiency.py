"""Pipeline efficiency: bare ``session.run`` p50 on a ready tensor / end-to-end frame p50 from a 640x480 source.

Both are measured in one process, in alternating rounds (this machine is shared and
noisy), on the same session.  The end-to-end latency runs from the moment the capture
thread has the frame to the moment the sink got its labels; the source is a 30 fps
synthetic camera, so the loop is never behind and every frame is fresh.  Goal: >= 0.95.

    .venv/bin/python tools/bench_pipeline_efficiency.py [BUNDLE] [--rounds 5] [--frames 150]

Without BUNDLE it uses (building if needed) the reference bundle ``edgekit demo`` uses.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import edgekit
from edgekit.demo import host_reference_bundle
from edgekit.pipeline.records import STAGES


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", nargs="?", type=Path)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frames", type=int, default=150, help="frames per pipeline round (30 fps: 5 s)")
    ap.add_argument("--runs", type=int, default=150, help="bare runs per round")
    ap.add_argument("--source", default="synthetic:640x480@30")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    bundle = args.bundle or host_reference_bundle()
    bare: list[float] = []
    e2e: list[float] = []
    stages: dict[str, list[float]] = {s: [] for s in STAGES}
    with edgekit.load(bundle, device=args.device) as model:
        session = model.session
        x = model.preprocessor()(np.zeros((480, 640, 3), np.uint8)).copy()
        for _ in range(10):
            session.run(x)
        print(f"{model.name} on {model.candidate}; source {args.source}; {args.rounds} rounds")
        for r in range(args.rounds):
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter_ns()
                session.run(x)
                times.append((time.perf_counter_ns() - t0) / 1e6)
            recs: list[edgekit.FrameRecord] = []
            with edgekit.Pipeline(model, args.source, frames=args.frames) as p:
                p.add_observer(recs.append)
                for _ in p:
                    pass
            b, e = statistics.median(times), statistics.median(rec.latency_ms for rec in recs)
            print(f"  round {r + 1}: bare p50 {b:.2f} ms   end-to-end p50 {e:.2f} ms   ratio {b / e:.3f}")
            bare += times
            e2e += [rec.latency_ms for rec in recs]
            for s in STAGES:
                stages[s] += [getattr(rec, f"{s}_ms") for rec in recs]
    b, e = statistics.median(bare), statistics.median(e2e)
    print(f"bare session.run p50      : {b:.3f} ms ({len(bare)} runs)")
    print(f"end-to-end frame p50      : {e:.3f} ms ({len(e2e)} frames)")
    print(
        "  stage p50 (ms)          : "
        + "  ".join(f"{s} {statistics.median(v):.3f}" for s, v in stages.items())
    )
    ratio = b / e
    print(f"pipeline efficiency       : {ratio:.3f} (goal >= 0.95: {'met' if ratio >= 0.95 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
