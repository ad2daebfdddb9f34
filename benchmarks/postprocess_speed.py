"""Postprocess speed: a classifier's top-k from the raw output, old path vs new, median µs side by side.

Old: what the frame loop did, ``top_k(from_output(y, spec).reshape(-1), labels, k)`` as
first written (``_top_k_plain``).  New: ``output_top_k(spec, labels, k)`` built once, then
called per frame on the raw output.  Rows: float32 logits (ONNX Runtime, OpenVINO, LiteRT
fp32 and int8) and 8-bit quantized outputs (int8 and uint8 with a scale and zero point: a
full-integer LiteRT model), 1000 classes.  Each is timed back to back (warm caches); paced,
a 30 ms sleep before every call (a 30 fps loop's idle gap); and, as in the frame loop, right
after the reference bundle's ONNX Runtime fp32 model ran (after the same sleep), which is
what leaves the caches cold there.  Old and new calls alternate, so a slow phase of this
shared machine weighs on both alike.  The results are checked equal (ids, names,
probabilities bit for bit) before anything is timed.

    .venv/bin/python -m benchmarks.postprocess_speed [BUNDLE] [--paced 150] [--k 5] [--no-model]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks._harness import bundle_of, parse, parser, run
from edgekit.backends.base import Quantization, TensorSpec
from edgekit.core.stats import median
from edgekit.processing.postprocess import _top_k_plain
from edgekit.processing.tensors import from_output, output_top_k

CLASSES = 1000
ROWS = 16  # distinct outputs, cycled: the data is not the same array every call


def outputs(dtype: str) -> tuple[TensorSpec, list[np.ndarray]]:
    rng = np.random.default_rng(19)
    logits = [(rng.standard_normal((1, CLASSES)) * 2.5).astype(np.float32) for _ in range(ROWS)]
    if dtype == "float32":
        return TensorSpec("logits", (1, CLASSES), "float32"), logits
    q = Quantization(scale=0.0625, zero_point=-8)
    info = np.iinfo(np.dtype(dtype))
    codes = [np.clip(np.rint(y / q.scale + q.zero_point), info.min, info.max).astype(dtype) for y in logits]
    return TensorSpec("logits", (1, CLASSES), dtype, q), codes


def timed(call: Callable[[np.ndarray], object], y: np.ndarray) -> float:
    t0 = time.perf_counter_ns()
    call(y)
    return (time.perf_counter_ns() - t0) / 1e3


def measure(
    calls: dict[str, Callable[[np.ndarray], object]],
    ys: list[np.ndarray],
    n: int,
    pause_s: float,
    before: Callable[[], object] | None = None,
) -> dict[str, float]:
    """Median µs of each call, alternating between them, a pause (and ``before``) ahead of each."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for j in range(n):
        y = ys[j % len(ys)]
        for name, call in calls.items():
            if pause_s:
                time.sleep(pause_s)
            if before is not None:
                before()
            times[name].append(timed(call, y))
    return {name: median(t) for name, t in times.items()}


def model_run(bundle: Path) -> Callable[[], object]:
    """One run of the bundle's ONNX Runtime fp32 model on a ready input (what precedes a frame's top-k)."""
    from edgekit.backends import registry
    from edgekit.bundle import read_manifest
    from edgekit.processing.preprocessing import PreprocessSpec, preprocess
    from edgekit.processing.tensors import to_input

    manifest = read_manifest(bundle)
    art = next(a for a in manifest.artifacts if a.backend == "onnxruntime" and a.precision == "fp32")
    session = registry.get("onnxruntime").load(bundle / art.path, dict(art.options))
    frame = np.random.default_rng(0).integers(0, 256, (480, 640, 3), np.uint8)
    x = to_input(preprocess(frame, PreprocessSpec.from_manifest(manifest), "BGR"), session.inputs[0])
    return lambda: session.run(x)


def old_path(spec: TensorSpec, labels: list[str], k: int) -> Callable[[np.ndarray], object]:
    """What the frame loop called before ``output_top_k``."""
    return lambda y: _top_k_plain(from_output(y, spec).reshape(-1), labels, k, logits=True)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, bundle=True, device=False)
    ap.add_argument("--paced", type=int, default=150, help="paced calls of each (30 ms apart)")
    ap.add_argument("--b2b", type=int, default=3000, help="back-to-back calls of each")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--no-model", action="store_true", help="skip the column after a model run")
    args = parse(ap, argv)
    before = None if args.no_model else model_run(bundle_of(args))
    labels = [f"class name {i}" for i in range(CLASSES)]
    print(f"{CLASSES} classes, k={args.k}; median µs per call: old / new (old/new)")
    heads = ["back to back", "paced 30 ms", *([] if before is None else ["after the model's run"])]
    print(f"{'output':8s} " + " ".join(f"{h:>24s}" for h in heads))
    for dtype in ("float32", "int8", "uint8"):
        spec, ys = outputs(dtype)
        top = output_top_k(spec, labels, args.k)
        calls: dict[str, Callable[[np.ndarray], object]] = {"old": old_path(spec, labels, args.k), "new": top}
        for y in ys:
            if calls["old"](y) != calls["new"](y):
                print(f"{dtype}: results DIFFER")
                return 1
        cols = [measure(calls, ys, args.b2b, 0.0), measure(calls, ys, args.paced, 0.03)]
        if before is not None:
            cols.append(measure(calls, ys, args.paced, 0.03, before))
        cells = [f"{c['old']:7.1f} / {c['new']:6.1f} ({c['old'] / c['new']:4.2f}x)" for c in cols]
        print(f"{dtype:8s} " + " ".join(f"{cell:>24s}" for cell in cells), flush=True)
    print("results identical (ids, names, probabilities bit for bit) on every row")
    return 0


if __name__ == "__main__":
    run(main)
