"""int8 on the kernels each x86 CPU runs: a bundle's OpenVINO artifacts with this CPU's ISA and limited to older ones.

    .venv/bin/python -m benchmarks.int8_kernels [BUNDLE] [--isa native,AVX512_CORE_VNNI,AVX2] [--queries 300] [--json]

Why.  An x86 bundle carries two int8 recipes: full-range 8-bit weights for CPUs whose int8
dot products accumulate without saturating (VNNI, AMX: the artifact ``requires`` int8-dot),
and the portable 7-bit one for CPUs without, whose u8 x s8 kernels (``VPMADDUBSW``) saturate
their int16 pair sums.  One machine sees one CPU's kernels, except that oneDNN, which
OpenVINO's CPU plugin runs, takes ``ONEDNN_MAX_CPU_ISA``: limited to ``AVX2`` it runs the very
kernels an AVX2-only CPU runs (``jit_avx2_1x1_I8``), on this CPU; limited to
``AVX512_CORE_VNNI``, those of a VNNI CPU without AMX (Ice Lake, Zen 4).  oneDNN reads the
variable once a process, so each ISA runs in a process of its own.

Each OpenVINO fp32 and int8 artifact of the bundle is gated against the bundle's ONNX Runtime
fp32 reference on the smoke set, by the build's rule (``edgekit.convert.accuracy.compare``:
top-1 on decisive images, at least 98%), and timed back to back through ``open_session`` as
a device runs it.  The convolution kernels OpenVINO chose are listed, to show the limit held.
Speed under a limit is this microarchitecture's, not an older CPU's: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import bundle_of, parse, parser, print_doc, progress_on_stderr
from edgekit.core.stats import median

ROOT = Path(__file__).resolve().parents[1]
#: ISA limits worth running, each with the /proc/cpuinfo flag a CPU needs for the limit to
#: change anything (below a CPU's own ISA a limit is that CPU's; above it, a no-op).
LIMITS = {"AVX512_CORE_VNNI": "amx_int8", "AVX2": "avx512f"}
REFERENCE = "onnxruntime-fp32"


def kernels(path: Path, choice: str) -> list[str]:
    """The kernels (oneDNN implementation names) of the convolutions OpenVINO compiled ``path`` to, here."""
    from benchmarks.openvino_kernels import profile

    layers = profile(path, choice, runs=1, warmup=0).values()
    return sorted({layer.kernel for layer in layers if layer.op.endswith("Convolution")})


def worker(bundle: Path, queries: int) -> list[dict[str, Any]]:
    """In this process (its ISA limit set by the parent): every OpenVINO fp32/int8 artifact, gated and timed."""
    from edgekit.backends import open_session
    from edgekit.bundle import read_manifest
    from edgekit.convert.accuracy import compare, run_batch
    from edgekit.convert.images import smoke_set
    from edgekit.processing.preprocessing import PreprocessSpec

    manifest = read_manifest(bundle)
    images = smoke_set()
    batch = images.batch(PreprocessSpec.from_manifest(manifest))
    entries = {a.name: a for a in manifest.artifacts}
    if REFERENCE not in entries:
        raise SystemExit(f"{bundle} has no {REFERENCE} artifact to gate against")
    with open_session(bundle / entries[REFERENCE].path) as reference:
        want = run_batch(reference, batch)
    # edgekit's per-layer kernels are chosen by this CPU's flags, which an ISA limit does not
    # change: under a limit, the plugin's own choice is what a CPU of that ISA would run.
    choice = "plugin" if os.environ.get("ONEDNN_MAX_CPU_ISA") else "edgekit"
    rows = []
    for a in manifest.artifacts:
        if a.backend != "openvino" or a.precision not in ("fp32", "int8"):
            continue
        with open_session(bundle / a.path, "openvino", kernels=choice) as session:
            gate = compare(run_batch(session, batch), want, images.names, images.smoke)
            x = batch[:1]
            for _ in range(min(queries, 30)):
                session.run(x)
            times = []
            for _ in range(queries):
                t0 = time.perf_counter_ns()
                session.run(x)
                times.append(time.perf_counter_ns() - t0)
        rows.append(
            {
                "artifact": a.name,
                "precision": a.precision,
                "variant": a.variant,
                "requires": list(a.requires),
                "kernels": kernels(bundle / a.path, choice),
                "top1_agreement": gate.top1_agreement,
                "top1_agreement_all": gate.top1_agreement_all,
                "decisive_images": gate.decisive_images,
                "max_abs_logit_diff": gate.max_abs_logit_diff,
                "passed_gate": gate.passed,
                "p50_ms": median(times) / 1e6 if times else None,
            }
        )
    return rows


def run_limited(bundle: Path, isa: str, queries: int) -> list[dict[str, Any]]:
    """``worker`` in a fresh process with oneDNN limited to ``isa`` (``native``: no limit)."""
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
    if isa != "native":
        env["ONEDNN_MAX_CPU_ISA"] = isa
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.int8_kernels",
        str(bundle),
        "--worker",
        "--queries",
        str(queries),
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"the {isa} run failed:\n{r.stderr[-3000:]}")
    rows: list[dict[str, Any]] = json.loads(r.stdout.strip().splitlines()[-1])
    return rows


def limits_here() -> list[str]:
    """``native`` and each limit below this CPU's own ISA."""
    from edgekit.core.cpu import this_cpu

    cpu = this_cpu()
    return ["native", *(isa for isa, above in LIMITS.items() if above in cpu.flags)]


def measure(bundle: Path, isas: list[str], queries: int) -> dict[str, Any]:
    from edgekit.core.cpu import this_cpu

    cpu = this_cpu()
    runs = []
    for isa in isas:
        print(f"{isa}: gating and timing the OpenVINO artifacts ...", flush=True)
        rows = run_limited(bundle, isa, queries)
        fp32 = next((r["p50_ms"] for r in rows if r["precision"] == "fp32"), None)
        for r in rows:
            r["fp32_over_this"] = fp32 / r["p50_ms"] if fp32 and r["p50_ms"] else None
        runs.append({"isa": isa, "artifacts": rows})
    return {
        "bundle": str(bundle),
        "cpu_flags": sorted(cpu.flags & {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"}),
        "reference": REFERENCE,
        "queries": queries,
        "runs": runs,
    }


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"bundle {doc['bundle']}; CPU flags: {' '.join(doc['cpu_flags'])}; gated against {doc['reference']}",
        "",
        "| oneDNN ISA | artifact | conv kernels | top-1 decisive (all) | max abs logit diff | gate | p50 ms | fp32 p50 / this |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in doc["runs"]:
        for r in run["artifacts"]:
            p50 = f"{r['p50_ms']:.3f}" if r["p50_ms"] else "-"
            ratio = f"{r['fp32_over_this']:.2f}x" if r["fp32_over_this"] else "-"
            agree = f"{r['top1_agreement']:.1%} of {r['decisive_images']} ({r['top1_agreement_all']:.1%})"
            lines.append(
                f"| {run['isa']} | {r['artifact']} | {', '.join(r['kernels'])} | {agree} "
                f"| {r['max_abs_logit_diff']:.3f} | {'passed' if r['passed_gate'] else 'FAILED'} | {p50} | {ratio} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, bundle=True, device=False, json_flag=True)
    ap.add_argument(
        "--isa",
        default="",
        help="comma-separated: native and oneDNN ISA names (default: those below this CPU's)",
    )
    ap.add_argument(
        "--queries", type=int, default=300, help="back-to-back queries per artifact (0: gate only)"
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parse(ap, argv)
    bundle = bundle_of(args)
    if args.worker:
        print(json.dumps(worker(bundle, args.queries)), flush=True)
        return 0
    isas = [s.strip() for s in args.isa.split(",") if s.strip()] or limits_here()
    with progress_on_stderr(args.json):
        doc = measure(bundle, isas, args.queries)
    print_doc(doc, args.json, render)
    return 0


if __name__ == "__main__":
    from benchmarks._harness import run

    run(main)
