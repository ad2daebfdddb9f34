"""edgekit's per-layer OpenVINO kernels against the plugin's own: a bundle's OpenVINO artifacts, side by side.

    .venv/bin/python -m benchmarks.openvino_kernels [BUNDLE] [--rounds 6] [--queries 150] [--json]

Why.  On some CPUs edgekit asks OpenVINO's CPU plugin for other kernels than it picks itself,
layer by layer (``edgekit.backends.openvino_kernels`` says which and why).  This shows what
that is worth, and that it changes nothing else: each OpenVINO artifact of the bundle is
loaded twice through ``open_session``, ``kernels="edgekit"`` and ``kernels="plugin"``, and

- the two sessions' outputs on the smoke set are compared (they must be identical);
- the two are timed back to back, interleaved in rounds (``--rounds`` x ``--queries``), so a
  machine that speeds up or slows down during the run affects both alike;
- each layer edgekit chose for is listed with the kernel that ran and its time, both ways,
  from the plugin's own profiling (PERF_COUNT, a separate compile of the same model).

The ratios are the result; the milliseconds are this machine's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._harness import bundle_of, parse, parser, print_doc, progress_on_stderr
from edgekit.core.stats import median

WAYS = ("edgekit", "plugin")


@dataclass(frozen=True)
class Profiled:
    """One executed layer as the plugin's profiling reports it."""

    op: str  # the plugin's node type: Convolution, GroupConvolution, Reorder, ...
    kernel: str  # the implementation that ran, e.g. jit_avx512_I8
    us: float  # median time over the profiled runs


def profile(path: Path, kernels: str, runs: int = 200, warmup: int = 20) -> dict[str, Profiled]:
    """Each executed layer of ``path`` compiled as a session compiles it (``kernels``: edgekit or plugin)."""
    import numpy as np
    import openvino as ov

    from edgekit.backends.openvino import read_ir

    core = ov.Core()
    model, _ = read_ir(core, path, "CPU", kernels)
    if model.inputs[0].get_partial_shape().is_dynamic:
        model.reshape({model.inputs[0]: [1, *list(model.inputs[0].get_partial_shape())[1:]]})
    # The hint and the precision edgekit sets (f32 for fp32 and int8 artifacts): the session's kernels.
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32", "PERF_COUNT": True}
    request = core.compile_model(model, "CPU", config).create_infer_request()
    port = request.model_inputs[0]
    x = np.zeros([d.get_length() for d in port.get_partial_shape()], np.float32)
    seen: dict[str, list[float]] = {}
    last: dict[str, tuple[str, str]] = {}
    for i in range(warmup + runs):
        request.infer({0: x})
        if i < warmup:
            continue
        for p in request.get_profiling_info():
            if p.status == p.Status.EXECUTED:
                seen.setdefault(p.node_name, []).append(p.real_time.total_seconds() * 1e6)
                last[p.node_name] = (p.node_type, p.exec_type)
    return {name: Profiled(*last[name], median(t)) for name, t in seen.items()}


def measure(bundle: Path, rounds: int, queries: int) -> dict[str, Any]:
    import numpy as np

    from edgekit.backends import open_session
    from edgekit.bundle import read_manifest
    from edgekit.convert.images import smoke_set
    from edgekit.core.cpu import this_cpu
    from edgekit.processing.preprocessing import PreprocessSpec

    manifest = read_manifest(bundle)
    batch = smoke_set().batch(PreprocessSpec.from_manifest(manifest))
    rows: list[dict[str, Any]] = []
    for a in manifest.artifacts:
        if a.backend != "openvino" or a.precision not in ("fp32", "int8"):
            continue
        path = bundle / a.path
        print(f"{a.name}: loading both ways, comparing and timing ...", flush=True)
        sessions = {way: open_session(path, "openvino", kernels=way) for way in WAYS}
        try:
            identical = all(
                np.array_equal(sessions["edgekit"].run(x[None])[0], sessions["plugin"].run(x[None])[0])
                for x in batch
            )
            times: dict[str, list[int]] = {way: [] for way in WAYS}
            x = batch[:1]
            for _ in range(rounds):
                for way, session in sessions.items():
                    for _ in range(20):
                        session.run(x)
                    for _ in range(queries):
                        t0 = time.perf_counter_ns()
                        session.run(x)
                        times[way].append(time.perf_counter_ns() - t0)
            chosen = sessions["edgekit"].kernels
        finally:
            for session in sessions.values():
                session.close()
        layers = []
        if chosen:
            ours, theirs = profile(path, "edgekit"), profile(path, "plugin")
            for line in chosen:
                name = line.split(": ", 1)[0]
                if name in ours and name in theirs:
                    layers.append(
                        {
                            "layer": name,
                            "edgekit": {"kernel": ours[name].kernel, "us": ours[name].us},
                            "plugin": {"kernel": theirs[name].kernel, "us": theirs[name].us},
                        }
                    )
        p50 = {way: median(t) / 1e6 for way, t in times.items()}
        rows.append(
            {
                "artifact": a.name,
                "precision": a.precision,
                "kernels_chosen": list(chosen),
                "identical_outputs": identical,
                "images": len(batch),
                "p50_ms": p50,
                "plugin_over_edgekit": p50["plugin"] / p50["edgekit"],
                "layers": layers,
            }
        )
    fp32 = next((r for r in rows if r["precision"] == "fp32"), None)
    for r in rows:
        if fp32 is not None:
            r["fp32_over_this"] = {w: fp32["p50_ms"][w] / r["p50_ms"][w] for w in WAYS}
    flags = sorted(this_cpu().flags & {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"})
    return {
        "bundle": str(bundle),
        "cpu_flags": flags,
        "rounds": rounds,
        "queries": queries,
        "artifacts": rows,
    }


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"bundle {doc['bundle']}; CPU flags: {' '.join(doc['cpu_flags'])}; "
        f"{doc['rounds']} rounds x {doc['queries']} queries each way, interleaved",
        "",
        "| artifact | layers edgekit chose for | outputs | p50 ms edgekit | p50 ms plugin | plugin / edgekit "
        "| fp32 / this: edgekit (plugin) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in doc["artifacts"]:
        ratio = r.get("fp32_over_this")
        vs_fp32 = f"{ratio['edgekit']:.2f}x ({ratio['plugin']:.2f}x)" if ratio else "-"
        lines.append(
            f"| {r['artifact']} | {len(r['kernels_chosen'])} | "
            f"{'identical' if r['identical_outputs'] else 'DIFFERENT'} on {r['images']} | "
            f"{r['p50_ms']['edgekit']:.3f} | {r['p50_ms']['plugin']:.3f} | {r['plugin_over_edgekit']:.3f}x | {vs_fp32} |"
        )
    for r in doc["artifacts"]:
        if r["layers"]:
            lines += [
                "",
                f"{r['artifact']}, the layers edgekit chose for (us, median of the plugin's profiling):",
            ]
            for layer in r["layers"]:
                ours, theirs = layer["edgekit"], layer["plugin"]
                lines.append(
                    f"  {layer['layer']}: {ours['kernel']} {ours['us']:.0f} us; plugin {theirs['kernel']} {theirs['us']:.0f} us"
                )
            ours_all = sum(layer["edgekit"]["us"] for layer in r["layers"])
            theirs_all = sum(layer["plugin"]["us"] for layer in r["layers"])
            lines.append(f"  these layers together: {ours_all:.0f} us against {theirs_all:.0f} us")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, bundle=True, device=False, json_flag=True)
    ap.add_argument("--rounds", type=int, default=6, help="turns each way takes, interleaved")
    ap.add_argument("--queries", type=int, default=150, help="back-to-back queries per turn")
    args = parse(ap, argv)
    bundle = bundle_of(args)
    with progress_on_stderr(args.json):
        doc = measure(bundle, args.rounds, args.queries)
    print_doc(doc, args.json, render)
    return 0


if __name__ == "__main__":
    from benchmarks._harness import run

    run(main)
