#!/usr/bin/env python3
"""Time every artifact of a bundle side by side and print p50/p99 and the ratio to the fastest.

The artifacts are run round-robin (one inference of each, then again) so that a noisy,
shared machine slows all of them alike; the ratios are what to read, not the absolute
milliseconds.  Usage:

    .venv/bin/python tools/bench_artifacts.py BUNDLE [--seconds 20] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from edgekit.backends import registry
from edgekit.build.images import smoke_set
from edgekit.bundle import open_bundle, read_manifest
from edgekit.elf import host_arch
from edgekit.errors import EdgekitError
from edgekit.tensors import to_input

log = logging.getLogger("bench_artifacts")
THREAD_OPTION = {
    "onnxruntime": "intra_op_threads",
    "openvino": "num_threads",
    "litert": "num_threads",
    "tvm": "num_threads",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="total measuring time (all artifacts together)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    with open_bundle(args.bundle) as root:
        manifest = read_manifest(root)
        x = smoke_set().batch(manifest.preprocess.to_spec())[:1]
        sessions = {}
        for a in manifest.artifacts:
            backend = registry.get(a.backend)
            if a.arch not in ("any", host_arch()) or not backend.available().ok or a.kind == "tflite-edgetpu":
                log.info("skip %s: cannot run on this host", a.name)
                continue
            opts = {THREAD_OPTION[a.backend]: args.threads} if a.backend in THREAD_OPTION else {}
            try:
                s = backend.load(root / a.path, opts)
            except EdgekitError as err:
                log.info("skip %s: %s", a.name, err.message)
                continue
            sessions[a.name] = (s, to_input(x, s.inputs[0]))
        for s, inp in sessions.values():
            for _ in range(args.warmup):
                s.run(inp)
        times: dict[str, list[float]] = {name: [] for name in sessions}
        deadline = time.perf_counter() + args.seconds
        while time.perf_counter() < deadline:
            for name, (s, inp) in sessions.items():
                t0 = time.perf_counter()
                s.run(inp)
                times[name].append((time.perf_counter() - t0) * 1000)
        for s, _ in sessions.values():
            s.close()

    rows = []
    for name, t in times.items():
        arr = np.asarray(t)
        rows.append(
            {
                "artifact": name,
                "runs": len(t),
                "p50_ms": float(np.percentile(arr, 50)),
                "p99_ms": float(np.percentile(arr, 99)),
            }
        )
    fastest = min(r["p50_ms"] for r in rows)
    for r in rows:
        r["ratio_to_fastest"] = r["p50_ms"] / fastest
    rows.sort(key=lambda r: r["p50_ms"])
    if args.json:
        print(json.dumps({"bundle": str(args.bundle), "threads": args.threads, "artifacts": rows}, indent=2))
    else:
        print(f"{'artifact':24} {'runs':>6} {'p50 ms':>8} {'p99 ms':>8} {'x fastest':>9}")
        for r in rows:
            print(
                f"{r['artifact']:24} {r['runs']:6d} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['ratio_to_fastest']:9.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
