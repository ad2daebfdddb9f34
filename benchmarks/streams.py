"""How many cameras this device holds: N synthetic streams through one pipeline, and N processes side by side.

    .venv/bin/python -m benchmarks.streams [BUNDLE] [--fps 30] [--seconds 10] [--max 12] [--processes] [--json]

The one-pipeline part is ``edgekit bench BUNDLE --streams MAX`` (``edgekit.bench.streams``):
for N = 1, 2, 3, ...: one ``edgekit.Pipeline`` with N ``synthetic:640x480@FPS`` sources for
``--seconds`` (drop-oldest, the bundle's budget), batched (``batch="auto"``) and unbatched
(``batch="off"``).  N is *held* when every camera's p99 is within the budget and no frame was
dropped; each series stops after its first N not held (or at ``--max``).  With
``--processes`` this benchmark then runs both answers (and one more than the unbatched) as N ``edgekit
run`` processes side by side (one camera each, each its own copy of the model): their p99s
and drops, the way a device is used without a multi-camera pipeline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import edgekit
from benchmarks._harness import bundle_of, parse, parser, print_json, progress_on_stderr
from edgekit.bench.streams import held, measure_streams, step_line


def processes(bundle: str, n: int, fps: float, seconds: float, env: dict[str, str]) -> dict[str, Any]:
    code = "import sys; from edgekit.cli import main; sys.exit(main())"
    args = ["run", bundle, "--source", f"synthetic:640x480@{fps:g}", "--duration", str(seconds)]
    # The same candidate as the pipeline: the choice its load kept (same $EDGEKIT_STATE).
    args += ["--allow-unsigned", "--warm", "off", "--json"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(n)
    ]
    docs = [json.loads(p.communicate()[0]) for p in procs]
    budget = docs[0]["budget_ms"]
    p99s = [d["latency_ms"]["p99"] for d in docs]
    drops = sum(d["counters"]["dropped"] for d in docs)
    # The same rule as the one pipeline's: every p99 within the budget, nothing dropped.
    ok = held({f"proc{i}": v for i, v in enumerate(p99s)}, drops, budget)
    return {"n": n, "held": ok, "p99_ms": p99s, "dropped": drops, "frames": sum(d["frames"] for d in docs)}


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, bundle=True, json_flag=True)
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--max", type=int, default=12)
    ap.add_argument("--processes", action="store_true")
    args = parse(ap, argv)
    with progress_on_stderr(args.json):
        doc = measure(args)
    if args.json:
        print_json(doc, indent=1)


def measure(args: Any) -> dict[str, Any]:
    bundle = bundle_of(args)
    started = time.time()
    with edgekit.load(bundle, device=args.device, allow_unsigned=True) as model:
        report = measure_streams(
            model,
            args.max,
            fps=args.fps,
            seconds=args.seconds,
            progress=lambda s: print(step_line(s), flush=True),
        )
    one = report.to_dict()
    most = report.most_held("unbatched")
    side_by_side: list[dict[str, Any]] = []
    if args.processes:
        env = {**os.environ}
        # At the counts one pipeline holds (batched and not), and one more than the unbatched one.
        for n in sorted({max(1, most), most + 1, max(1, report.most_held("batched"))}):
            row = processes(str(bundle), n, args.fps, args.seconds, env)
            side_by_side.append(row)
            print(
                f"{n} processes side by side: p99 {', '.join(f'{v:.2f}' for v in row['p99_ms'])} ms, "
                f"dropped {row['dropped']}: {'held' if row['held'] else 'NOT held'}",
                flush=True,
            )
    print(
        f"most cameras held by one pipeline ({report.candidate}): batched {report.most_held('batched')}, "
        f"unbatched {most}",
        flush=True,
    )
    return {
        "bundle": str(bundle),
        "candidate": report.candidate,
        "fps": args.fps,
        "seconds": args.seconds,
        "one_pipeline": one["steps"],
        "most_held": one["most_held"],
        "capped": one["capped"],
        "processes": side_by_side,
        "wall_s": time.time() - started,
    }


if __name__ == "__main__":
    main()
