#!/usr/bin/env python3
"""The performance report: every speed bar of edgekit measured in one go, as Markdown and plots.

Runs, one after another on the same machine:

1. ``edgekit bench`` on the bundle (every candidate, ``--rounds`` turns each in a fresh
   process, pooled to at least LoadGen's 662 queries): latency percentiles, cold start,
   peak RSS, top-1 agreement, and the latency plot; then each candidate at the camera rate
   (``--fps``, by default the bundle's budget: queries issued at the frame rate, the runtime
   idle between them): paced percentiles, overruns and the wake-up cost beside back to back;
2. ``benchmarks/cold_start.py``: process start -> ``edgekit.load`` -> first label, and
   peak RSS, for the auto-selected artifact and the int8 one;
3. ``benchmarks/pipeline_efficiency.py``: bare ``session.run`` p50 / end-to-end frame p50
   from a 640x480 source.

and writes ``REPORT.md`` (the bars, each as a ratio measured side by side in this run,
then the tables) with ``latency.png`` and the raw JSON beside it.  A dated page in
docs/measurements/ quotes each report's numbers with its date and machine.

    .venv/bin/python tools/perf_report.py [BUNDLE] [--out reports/perf] [--rounds 3] [--quick]

Without BUNDLE it uses (building if needed) the reference bundle ``edgekit demo`` uses.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: The issue's bars: (name, target, how to compare).
BARS = {
    "tvm_vs_fastest": 1.5,  # TVM p50 / fastest runtime p50, at most
    "int8_speedup": 2.0,  # fastest fp32 p50 / p50 of the int8 artifact this CPU takes, at least
    "int8_agreement": 0.98,  # top-1 agreement of that int8 artifact with fp32, at least
    "pipeline_efficiency": 0.95,  # bare runtime p50 / end-to-end frame p50, at least
    "cold_start_s": 1.0,  # process start -> first label, at most
    "int8_peak_rss_mb": 200.0,  # device runtime peak RSS with the int8 artifact, at most
}


def step(title: str) -> float:
    print(f"\n== {title}", flush=True)
    return time.monotonic()


def run_json(cmd: list[str], timeout: float) -> dict[str, Any]:
    """Run a program that prints one JSON document on stdout (progress on stderr, passed through).

    From the repository root: the benchmarks run as ``python -m benchmarks.<name>``.
    """
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=timeout, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"perf_report: {' '.join(cmd[1:3])} failed with exit {r.returncode}")
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def versions() -> dict[str, str]:
    from edgekit.selection.doctor import doctor_report

    rep = doctor_report()
    out = {name: b.get("version") or "-" for name, b in rep["backends"].items() if b.get("available")}
    out["python"] = platform.python_version()
    return out


def bars(bench: dict[str, Any], cold: dict[str, Any], eff: dict[str, Any]) -> list[dict[str, Any]]:
    """Each bar's measured value from this run's results."""
    ok = [c for c in bench["candidates"] if c["ok"]]
    # Keyed by artifact: a backend may have two artifacts of one precision (int8 and int8-full).
    p50 = {c["artifact"]: c["summary"]["p50_ms"] for c in ok}
    fastest_key = min(p50, key=lambda k: p50[k])
    rows: list[dict[str, Any]] = []

    def add(name: str, what: str, value: float | None, target: float, at_most: bool, detail: str) -> None:
        met = value is not None and (value <= target if at_most else value >= target)
        rows.append(
            {
                "bar": name,
                "what": what,
                "target": f"{'≤' if at_most else '≥'} {target:g}",
                "measured": value,
                "met": met,
                "detail": detail,
            }
        )

    tvm = next((p50[c["artifact"]] for c in ok if c["backend"] == "tvm" and c["precision"] == "fp32"), None)
    add(
        "tvm_vs_fastest",
        "TVM fp32 p50 / fastest runtime p50",
        tvm / p50[fastest_key] if tvm else None,
        BARS["tvm_vs_fastest"],
        True,
        f"tvm {tvm:.2f} ms vs {fastest_key} {p50[fastest_key]:.2f} ms" if tvm else "no TVM artifact ran",
    )
    # The int8 artifact a device with this CPU takes (its recipe fits the CPU) against the fastest
    # artifact that computes in fp32: what a user gains by choosing int8 here.
    by_artifact = {c["artifact"]: c for c in ok}
    pick = (bench.get("int8") or {}).get("artifact")
    fp32 = [c for c in ok if c["precision"] == "fp32"]
    if pick in by_artifact and fp32:
        i8, f32 = by_artifact[pick], min(fp32, key=lambda c: c["summary"]["p50_ms"])
        i8_ms, f32_ms = i8["summary"]["p50_ms"], f32["summary"]["p50_ms"]
        add(
            "int8_speedup",
            f"fastest fp32 p50 / p50 of the int8 artifact this CPU takes ({pick})",
            f32_ms / i8_ms,
            BARS["int8_speedup"],
            False,
            f"{f32['artifact']} {f32_ms:.2f} ms vs {pick} {i8_ms:.2f} ms; {bench['int8']['why']}",
        )
        add(
            "int8_agreement",
            f"top-1 agreement of {pick} with fp32 (bundle eval frames)",
            i8["top1_agreement"],
            BARS["int8_agreement"],
            False,
            f"{i8['eval_frames']} frames",
        )
    add(
        "pipeline_efficiency",
        "bare session.run p50 / end-to-end frame p50 (640x480 source)",
        eff.get("efficiency"),
        BARS["pipeline_efficiency"],
        False,
        f"bare {eff.get('bare_p50_ms', 0):.2f} ms, end-to-end {eff.get('e2e_p50_ms', 0):.2f} ms; "
        f"per-frame overhead {eff.get('overhead_p50_ms', 0):.2f} ms of which resize "
        f"({eff.get('interpolation', '?')}) {eff.get('resize_p50_ms', 0):.2f} ms",
    )
    auto = cold.get("results", {}).get("auto", {})
    add(
        "cold_start_s",
        f"process start → edgekit.load → first label ({auto.get('candidate', 'auto')})",
        auto["cold_start_ms"] / 1e3 if "cold_start_ms" in auto else None,
        BARS["cold_start_s"],
        True,
        "median of fresh processes",
    )
    i8 = cold.get("results", {}).get("onnxruntime-int8", {})
    add(
        "int8_peak_rss_mb",
        "peak RSS of a device process running the int8 artifact (onnxruntime-int8)",
        i8.get("peak_rss_mb"),
        BARS["int8_peak_rss_mb"],
        True,
        "VmHWM after the pipeline frames",
    )
    return rows


def markdown(
    meta: dict[str, Any],
    rows: list[dict[str, Any]],
    bench: dict[str, Any],
    cold: dict[str, Any],
    eff: dict[str, Any],
) -> str:
    lines = [
        f"# edgekit performance report — {meta['date']}",
        "",
        f"Machine: {meta['cpu']}, {meta['cores']} cores, {meta['arch']}, {meta['kernel']}; "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        f"Bundle: `{meta['bundle']}` ({bench['model']}, profile {bench['profile']}). "
        f"Wall time of this report: {meta['wall_s']:.0f} s.",
        "",
        "Every ratio below comes from this one run, its parts measured on the same machine minutes apart "
        "(latencies: candidates in turns, each round in a fresh process). Read ratios, not milliseconds: "
        "the machine is shared.",
        "",
        "## Bars",
        "",
        "| bar | measured | target | met | detail |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        v = r["measured"]
        shown = "-" if v is None else (f"{v:.0%}" if r["bar"] == "int8_agreement" else f"{v:.3g}")
        lines.append(
            f"| {r['what']} | **{shown}** | {r['target']} | {'yes' if r['met'] else '**no**'} | {r['detail']} |"
        )
    lines += [
        "",
        "## Every candidate (edgekit bench, SingleStream, p90 is the headline)",
        "",
        "![latency per candidate](latency.png)",
        "",
        "| candidate | queries | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | × best p90 | cold start s | peak RSS MB | top-1 vs fp32 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ok = sorted((c for c in bench["candidates"] if c["ok"]), key=lambda c: c["summary"]["p90_ms"])
    best = ok[0]["summary"]["p90_ms"] if ok else 1.0
    for c in ok:
        s = c["summary"]
        p99 = f"{s['p99_ms']:.2f}" + ("" if s["p99_valid"] else "*")
        agree = "-" if c["top1_agreement"] is None else f"{c['top1_agreement']:.0%}"
        lines.append(
            f"| {c['key']} | {s['count']} | {s['p50_ms']:.2f} | {s['p90_ms']:.2f} | {p99} | {s['p99.9_ms']:.2f}{'*' if 'p99.9' in s['underpowered'] else ''} | "
            f"{s['max_ms']:.2f} | {s['p90_ms'] / best:.2f} | {c['cold_start_s']:.2f} | {c['peak_rss_mb']:.0f} | {agree} |"
        )
    for c in bench["candidates"]:
        if not c["ok"]:
            lines.append(f"| {c['key']} | failed: {c['error']} | | | | | | | | | |")
    for s in bench["skipped"]:
        lines.append(f"| {s['backend']}-{s['precision']} | not run: {s['reason']} | | | | | | | | | |")
    lines += [
        "",
        "\\* fewer queries than LoadGen's early-stopping rule needs for that percentile (p99: 662, p99.9: 6636).",
        "",
        *camera_rate_rows(bench),
        "## Cold start (benchmarks/cold_start.py)",
        "",
        "```json",
        json.dumps(cold, indent=1)[:4000],
        "```",
        "",
        "## Pipeline efficiency (benchmarks/pipeline_efficiency.py)",
        "",
        "```json",
        json.dumps(eff, indent=1)[:3000],
        "```",
        "",
    ]
    return "\n".join(lines)


def camera_rate_rows(bench: dict[str, Any]) -> list[str]:
    """The camera-rate section: each candidate paced at the device's frame rate beside back to back.

    Ordered by the paced p90, which is what ``--write-selection`` and first-load selection rank
    by; ✓ marks the candidate ``edgekit bench`` chose (the fastest paced one that passes the gate).
    Empty for a report run with ``--fps 0`` or from before the camera rate.
    """
    fps = float(bench.get("camera_rate_fps") or 0.0)
    ok = [c for c in bench["candidates"] if c["ok"] and c.get("camera_rate")]
    if not fps or not ok:
        return []
    ok.sort(key=lambda c: c["camera_rate"]["p90_ms"])
    best = ok[0]["camera_rate"]["p90_ms"] or 1.0
    lines = [
        f"## At the camera rate ({fps:g} fps: queries issued at the frame rate, the runtime idle between them)",
        "",
        "| candidate | back-to-back p50 ms | paced p50 ms | paced p90 ms | paced p99 ms | wake-up ms | "
        "paced / back-to-back p50 | overruns | × best paced p90 | queries |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in ok:
        p, b2b = c["camera_rate"], c["summary"]["p50_ms"]
        mark = " ✓" if c["key"] == bench.get("fastest") else ""
        gate = "" if c.get("passed_gate", True) else " (below the gate)"
        lines.append(
            f"| {c['key']}{mark}{gate} | {b2b:.2f} | {p['p50_ms']:.2f} | {p['p90_ms']:.2f} | {p['p99_ms']:.2f} | "
            f"{p['wakeup_ms']:+.2f} | {p['p50_ms'] / b2b:.2f} | {p['overruns']} | "
            f"{p['p90_ms'] / best:.2f} | {p['queries']} |"
        )
    lines += [
        "",
        "wake-up: paced p50 − back-to-back p50, the price of the idle gap between frames; overruns: "
        "queries that ended after the next frame was due; ✓ what selection takes (ranked by "
        f"{bench.get('ranked_by', 'the paced p90')}, among candidates that pass the accuracy gate).",
        "",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("bundle", nargs="?", type=Path)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "perf")
    ap.add_argument("--rounds", type=int, default=3, help="turns each bench candidate takes")
    ap.add_argument(
        "--quick", action="store_true", help="short runs: a smoke test of the report, not numbers"
    )
    ap.add_argument(
        "--fps",
        type=float,
        default=None,
        help="camera rate of the paced rows (default: the budget's; 0: none)",
    )
    args = ap.parse_args(argv)
    t_all = time.monotonic()
    if args.bundle is None:
        from edgekit.demo import host_reference_bundle

        args.bundle = host_reference_bundle()
    args.out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    per_round = 30 if args.quick else -(-662 // args.rounds)  # pooled: at least LoadGen's 662 for a p99

    t = step(f"edgekit bench ({args.rounds} rounds)")
    bench = run_json(
        [
            py,
            "-m",
            "edgekit.cli",
            "bench",
            str(args.bundle),
            "--rounds",
            str(args.rounds),
            "--min-queries",
            str(per_round),
            "--min-duration",
            "0.5" if args.quick else "2",
            "--max-duration",
            "2" if args.quick else "10",
            # The camera rate: 300 paced queries pooled (10 s per candidate at 30 fps), a p99 of sorts.
            "--paced-queries",
            "10" if args.quick else str(-(-300 // args.rounds)),
            *(("--fps", f"{args.fps:g}") if args.fps is not None else ()),
            "--plot",
            str(args.out / "latency.png"),
            "--json",
        ],
        timeout=1800,
    )
    print(f"   {time.monotonic() - t:.0f} s")

    t = step("cold start and peak RSS")
    cold = run_json(
        [
            py,
            "-m",
            "benchmarks.cold_start",
            str(args.bundle),
            "--artifacts",
            "auto,onnxruntime-int8",
            "--runs",
            "2" if args.quick else "5",
            "--json",
        ],
        timeout=900,
    )
    print(f"   {time.monotonic() - t:.0f} s")

    t = step("pipeline efficiency")
    eff = run_json(
        [
            py,
            "-m",
            "benchmarks.pipeline_efficiency",
            str(args.bundle),
            "--rounds",
            "2" if args.quick else "5",
            "--json",
        ],
        timeout=900,
    )
    print(f"   {time.monotonic() - t:.0f} s")

    import os

    meta = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": bench["host"]["cpu"],
        "cores": bench["host"]["cores"],
        "arch": bench["host"]["arch"],
        "kernel": platform.release(),
        "versions": versions(),
        "bundle": str(args.bundle),
        "wall_s": time.monotonic() - t_all,
        "load_average": os.getloadavg(),
    }
    rows = bars(bench, cold, eff)
    (args.out / "results.json").write_text(
        json.dumps(
            {"meta": meta, "bars": rows, "bench": bench, "cold_start": cold, "efficiency": eff}, indent=1
        )
    )
    (args.out / "REPORT.md").write_text(markdown(meta, rows, bench, cold, eff), encoding="utf-8")
    print(f"\nwrote {args.out / 'REPORT.md'} ({meta['wall_s']:.0f} s)\n")
    for r in rows:
        v = r["measured"]
        print(
            f"  {r['what']:70} {('-' if v is None else f'{v:.3g}'):>8}  {r['target']:>7}  {'met' if r['met'] else 'NOT met'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
