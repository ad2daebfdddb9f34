#!/usr/bin/env python3
"""Per-operator profile of a compiled TVM Relax library: time and GMAC/s of every fused function.

TVM 0.27's Relax VM has no built-in profiler, so this times every VM call through
``VirtualMachine.set_instrument`` (before/after hooks, ~5 us each) over ``--runs``
inferences after a warm-up, and reports per fused PrimFunc (its fastest run: other
load on a shared machine only adds time): calls per inference, ms,
share, and the multiply-accumulates per second it achieves (MACs from its weight and
output shapes).  Calls are grouped by layer kind (depthwise / pointwise 1x1 / full conv /
dense) like ``tools/profile_int8.py`` does for ONNX Runtime, so the two tables compare
side by side.  VM bookkeeping (``vm.builtin.*``: tuples, allocation, shape checks) is
summed as ``vm``.  Usage:

    .venv/bin/python tools/profile_tvm.py BUNDLE/artifacts/tvm-fp32/*.so [--threads 1] [--runs 20] [--top 15]

``--threads 1`` (the default) measures the kernels' own speed, which a busy shared
machine disturbs least; ``--threads 2`` shows the parallel speed-up on top.
"""

from __future__ import annotations

import argparse
import collections
import math
import time
from pathlib import Path
from typing import Any

import numpy as np


def kind_of(symbol: str, shapes: list[tuple[int, ...]]) -> tuple[str, float]:
    """``(kind, MACs)`` of one call from its name and argument shapes (weights second, output last)."""
    if symbol.startswith("vm.builtin") or len(shapes) < 2:
        return "vm", 0.0
    out, w = shapes[-1], shapes[1]
    if "conv2d" in symbol and len(out) == 4 and out[1]:
        per_out = math.prod(w) / out[1]  # MACs per output element: Cin/groups * kh * kw
        macs = math.prod(out) * per_out
        cin = shapes[0][1] if len(shapes[0]) == 4 else 0
        if per_out in (9, 25) and cin != 3:
            return "depthwise", macs
        return ("pointwise" if per_out == cin else "full"), macs
    if "matmul" in symbol or "dense" in symbol:
        return "gemm", float(math.prod(w))
    return "other", 0.0


def profile(library: Path, runs: int, threads: int) -> dict[str, dict[str, Any]]:
    """Per VM call symbol: kind, calls per inference, seconds per inference, MACs per inference."""
    import tvm
    from tvm import relax

    tvm.get_global_func("runtime.config_threadpool")(0, threads)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cpu())
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype("float32")
    inp = tvm.runtime.tensor(x, tvm.cpu())
    for _ in range(5):
        vm["main"](inp)
    stats: dict[str, dict[str, Any]] = collections.defaultdict(
        lambda: {"kind": "", "calls": 0, "s": 0.0, "macs": 0.0, "runs": []}
    )
    started: list[float] = []

    def instrument(_func: Any, symbol: str, before: bool, _ret: Any, *args: Any) -> int:
        if before:
            started.append(time.perf_counter())
            return 0
        spent = time.perf_counter() - started.pop()
        s = stats[symbol]
        if not s["kind"]:
            shapes = [tuple(int(d) for d in a.shape) for a in args if hasattr(a, "shape")]
            s["kind"], s["macs_per_call"] = kind_of(symbol, shapes)
        s["calls"] += 1
        s["macs"] += s["macs_per_call"]
        if len(s["runs"]) < run[0] + 1:
            s["runs"].append(0.0)
        s["runs"][run[0]] += spent
        return 0

    vm.set_instrument(instrument)
    run = [0]
    walls = []
    for i in range(runs):
        run[0] = i
        t0 = time.perf_counter()
        vm["main"](inp)
        walls.append(time.perf_counter() - t0)
    for s in stats.values():
        s["calls"] /= runs
        s["macs"] /= runs
        # The fastest run of each function: a busy machine only ever adds time.
        s["s"] = min(s["runs"])
    return {"_wall": {"s": min(walls)}, **stats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("library", type=Path)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=15, help="print the N slowest functions")
    args = ap.parse_args()
    stats = profile(args.library, args.runs, args.threads)
    wall = stats.pop("_wall")["s"] * 1000
    total = sum(s["s"] for s in stats.values()) * 1000
    print(
        f"## {args.library.name}, {args.threads} thread(s): {wall:.2f} ms fastest inference (sum of fastest calls {total:.2f} ms)\n"
    )
    print("| kind | calls | ms | share | GMAC | GMAC/s |\n| --- | --- | --- | --- | --- | --- |")
    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for s in stats.values():
        k = kinds[s["kind"]]
        k[0] += s["calls"]
        k[1] += s["s"] * 1000
        k[2] += s["macs"]
    for kind, (calls, ms, macs) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        rate = f"{macs / ms / 1e6:.1f}" if macs else "-"
        print(f"| {kind} | {calls:.0f} | {ms:.3f} | {ms / total:.0%} | {macs / 1e9:.3f} | {rate} |")
    print("\n| function | kind | calls | ms | share | GMAC/s |\n| --- | --- | --- | --- | --- | --- |")
    for name, s in sorted(stats.items(), key=lambda kv: -kv[1]["s"])[: args.top]:
        ms = s["s"] * 1000
        rate = f"{s['macs'] / ms / 1e6:.1f}" if s["macs"] else "-"
        print(f"| {name} | {s['kind']} | {s['calls']:.0f} | {ms:.3f} | {ms / total:.0%} | {rate} |")


if __name__ == "__main__":
    main()
