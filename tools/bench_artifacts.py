#!/usr/bin/env python3
"""Time every artifact of a bundle side by side and print p50/p99 and the ratio to the fastest.

Each artifact runs in its own process (as on a device, one runtime per process: runtimes
keep worker threads spinning after a run, and sessions sharing a process slow each other
down), and the artifacts take turns, round after round, so that a noisy shared machine
slows all of them alike.  Read the ratios, not the absolute milliseconds.  Usage:

    .venv/bin/python tools/bench_artifacts.py BUNDLE [--rounds 3] [--runs 60] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from edgekit.backends import registry
from edgekit.build.images import smoke_set
from edgekit.bundle import open_bundle, read_manifest
from edgekit.elf import host_arch
from edgekit.tensors import to_input

log = logging.getLogger("bench_artifacts")
THREAD_OPTION = {
    "onnxruntime": "intra_op_threads",
    "openvino": "num_threads",
    "litert": "num_threads",
    "tvm": "num_threads",
}


def time_one(root: Path, name: str, runs: int, warmup: int, threads: int) -> list[float]:
    """Load one artifact and time ``runs`` single-image inferences after ``warmup``."""
    manifest = read_manifest(root)
    a = next(x for x in manifest.artifacts if x.name == name)
    opts = {THREAD_OPTION[a.backend]: threads} if a.backend in THREAD_OPTION else {}
    x = smoke_set().batch(manifest.preprocess.to_spec())[:1]
    with registry.get(a.backend).load(root / a.path, opts) as s:
        inp = to_input(x, s.inputs[0])
        for _ in range(warmup):
            s.run(inp)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            s.run(inp)
            times.append((time.perf_counter() - t0) * 1000)
    return times


def runnable(root: Path) -> list[str]:
    names = []
    for a in read_manifest(root).artifacts:
        if (
            a.arch not in ("any", host_arch())
            or a.kind == "tflite-edgetpu"
            or not registry.get(a.backend).available().ok
        ):
            log.info("skip %s: cannot run on this host", a.name)
            continue
        names.append(a.name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--rounds", type=int, default=3, help="turns each artifact takes")
    parser.add_argument("--runs", type=int, default=60, help="timed runs per artifact per turn")
    parser.add_argument("--warmup", type=int, default=10, help="untimed runs before each turn")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: time one artifact, print JSON
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    if args.one:
        print(json.dumps(time_one(args.bundle, args.one, args.runs, args.warmup, args.threads)))
        return 0
    with open_bundle(args.bundle) as root:
        names = runnable(root)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names:
                log.info("round %d/%d: %s", r + 1, args.rounds, name)
                cmd = [
                    sys.executable,
                    __file__,
                    str(root),
                    "--one",
                    name,
                    "--runs",
                    str(args.runs),
                    "--warmup",
                    str(args.warmup),
                    "--threads",
                    str(args.threads),
                ]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                times[name] += json.loads(out.strip().splitlines()[-1])

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
    for row in rows:
        row["ratio_to_fastest"] = row["p50_ms"] / fastest
    rows.sort(key=lambda row: row["p50_ms"])
    if args.json:
        print(json.dumps({"bundle": str(args.bundle), "threads": args.threads, "artifacts": rows}, indent=2))
    else:
        print(f"{'artifact':24} {'runs':>6} {'p50 ms':>8} {'p99 ms':>8} {'x fastest':>9}")
        for row in rows:
            print(
                f"{row['artifact']:24} {row['runs']:6d} {row['p50_ms']:8.2f} {row['p99_ms']:8.2f} {row['ratio_to_fastest']:9.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
