#!/usr/bin/env python3
"""Per-operator profile of an ONNX model in ONNX Runtime: which kernels run and where the time goes.

Runs each model given with ``SessionOptions.enable_profiling``, then sums the kernel
time of every node by the operator ORT actually executed (after its graph
optimizations: QLinearConv, fused Conv+Clip, ...), and for each Conv also by kind
(depthwise / 1x1 / full).  Use it to compare an int8 model with its fp32 source:

    .venv/bin/python tools/profile_int8.py BUNDLE/artifacts/onnxruntime-fp32/*.onnx \\
        BUNDLE/artifacts/onnxruntime-int8/*.onnx [--runs 100] [--threads 2] [--nodes N]

Prints one table per model (op type, count, ms per inference, share) and the
per-kind Conv breakdown (depthwise / pointwise / full) with the GMAC/s each achieves (MACs
from the first model, the fp32 one).  Each node's time is its fastest run: other load on a
shared machine only adds time.  Node kinds come from the optimized graph ORT actually ran,
so the op table also shows which Q/DQ pairs were fused (a ``DequantizeLinear`` left feeding
a float ``Conv`` means that layer runs in fp32).
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


def _attrs(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def conv_kinds(model: Any) -> dict[str, str]:
    """Node name -> ``depthwise`` / ``pointwise`` / ``full`` for every (QLinear)Conv of a graph."""
    init = {t.name: list(t.dims) for t in model.graph.initializer}
    kinds = {}
    for n in model.graph.node:
        if n.op_type not in ("Conv", "QLinearConv", "FusedConv"):
            continue
        w = init.get(n.input[3] if n.op_type == "QLinearConv" else n.input[1])
        if not w:
            continue
        group = int(_attrs(n).get("group", 1))
        kinds[n.name] = "depthwise" if group > 1 and w[1] == 1 else "pointwise" if w[2:] == [1, 1] else "full"
    return kinds


def macs_by_kind(fp32: Path) -> dict[str, float]:
    """Multiply-accumulates per Conv kind (and Gemm) of an fp32 ONNX model with static shapes."""
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(str(fp32)))
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*model.graph.value_info, *model.graph.output]
    }
    init = {t.name: list(t.dims) for t in model.graph.initializer}
    kinds = conv_kinds(model)
    macs: dict[str, float] = collections.defaultdict(float)
    for n in model.graph.node:
        if n.name in kinds:
            w, out = init[n.input[1]], shapes[n.output[0]]
            macs[kinds[n.name]] += float(np.prod(out)) * float(np.prod(w[1:]))
        elif n.op_type == "Gemm":
            macs["gemm"] += float(np.prod(init[n.input[1]]))
    return dict(macs)


def profile(path: Path, runs: int, threads: int, options: dict[str, str]) -> dict[str, Any]:
    """Time ``runs`` inferences of ``path`` with ORT's profiler on; per-op and per-Conv-kind ms per inference."""
    import time

    import onnx
    import onnxruntime as ort

    tmp = Path(tempfile.mkdtemp(prefix="ortprof-"))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    for key, value in options.items():
        so.add_session_config_entry(key, value)
    so.optimized_model_filepath = str(tmp / "optimized.onnx")
    # A first session only writes the optimized graph (the graph ORT runs, to classify nodes).
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    kinds = conv_kinds(onnx.load(str(tmp / "optimized.onnx")))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    for key, value in options.items():
        so.add_session_config_entry(key, value)
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp / "p")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    warmup = 10
    walls = []
    for _ in range(warmup + runs):
        t0 = time.perf_counter()
        sess.run(None, {inp.name: x})
        walls.append((time.perf_counter() - t0) * 1000)
    walls = walls[warmup:]
    events = json.loads(Path(sess.end_profiling()).read_text())
    per_op: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.defaultdict(int)
    per_kind: dict[str, float] = collections.defaultdict(float)
    per_run: dict[str, list[float]] = collections.defaultdict(list)
    ops: dict[str, str] = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        node, op, ms = e["name"][: -len("_kernel_time")], e["args"]["op_name"], e["dur"] / 1000
        per_run[node].append(ms)
        ops[node] = op
    # Each node's fastest run (a busy machine only ever adds time); the warm-up runs are
    # profiled too, so only the last ``runs`` of them count.
    per_node = {node: min(t[-runs:]) for node, t in per_run.items()}
    for node, ms in per_node.items():
        op = ops[node]
        count[op] += 1
        per_op[op] += ms
        per_kind[kinds.get(node, "gemm" if op in ("Gemm", "QGemm") else "other")] += ms
    return {
        "wall_ms": min(walls),
        "per_op": dict(per_op),
        "count": dict(count),
        "per_kind": dict(per_kind),
        "per_node": {k: (ops[k], v) for k, v in per_node.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path, help="the fp32 model first (its MACs give the GFLOPS)")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=0, help="also print the N slowest nodes")
    ap.add_argument("--config", action="append", default=[], help="ORT session config KEY=VALUE")
    args = ap.parse_args()
    options = dict(c.split("=", 1) for c in args.config)
    macs = macs_by_kind(args.models[0])
    kind_rows = {}
    for path in args.models:
        r = profile(path, args.runs, args.threads, options)
        kern = sum(r["per_op"].values())
        kind_rows[path.name] = r["per_kind"]
        print(
            f"\n## {path.name}: fastest inference {r['wall_ms']:.2f} ms, sum of fastest kernels {kern:.2f} ms"
        )
        print("| op (as executed) | nodes | ms | share |\n| --- | --- | --- | --- |")
        for op, ms in sorted(r["per_op"].items(), key=lambda kv: -kv[1]):
            print(f"| {op} | {r['count'][op]} | {ms:.3f} | {ms / kern:.0%} |")
        if args.nodes:
            print("\n| node | op | ms |\n| --- | --- | --- |")
            for node, (op, ms) in sorted(r["per_node"].items(), key=lambda kv: -kv[1][1])[: args.nodes]:
                print(f"| {node} | {op} | {ms:.3f} |")
    names = list(kind_rows)
    print("\n## By layer kind: ms per inference (GMAC/s achieved)\n")
    print(
        "| kind | GMAC | "
        + " | ".join(names)
        + " |\n| --- | --- | "
        + " | ".join("---" for _ in names)
        + " |"
    )
    for kind in sorted(
        {k for r in kind_rows.values() for k in r}, key=lambda k: -kind_rows[names[0]].get(k, 0)
    ):
        cells = []
        for nm in names:
            ms = kind_rows[nm].get(kind, 0.0)
            rate = f" ({macs[kind] / ms / 1e6:.1f})" if kind in macs and ms > 0 else ""
            cells.append(f"{ms:.3f}{rate}")
        print(f"| {kind} | {macs.get(kind, 0) / 1e9:.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
