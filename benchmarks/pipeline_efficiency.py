"""Pipeline efficiency: bare ``session.run`` p50 on a ready tensor / end-to-end frame p50 from a 640x480 source.

Both are measured in one process, in alternating rounds (this machine is shared and
noisy), on the same session.  The end-to-end latency runs from the moment the capture
thread has the frame to the moment the sink got its labels; the source is a synthetic
640x480 camera at 30 fps, or at a third of what the session can run when that is less (a
busy machine), so the loop is never behind and every frame is fresh.  Goal: >= 0.95.

    .venv/bin/python -m benchmarks.pipeline_efficiency [BUNDLE] [--rounds 5] [--frames 150]
    .venv/bin/python -m benchmarks.pipeline_efficiency [BUNDLE] --resize-study

Without BUNDLE it uses (building if needed) the reference bundle ``edgekit demo`` uses.
After the rounds it splits the preprocess stage into the resize and the rest, and prints
the best efficiency reachable while the resize stays what it is.  ``--resize-study`` asks
what a cheaper resize would cost instead: each resize method's time on a 640x480 frame,
and the top-1 agreement (the build's gate: decisive images only) of every ONNX Runtime
artifact of the bundle fed that way, against the fp32 artifact fed INTER_AREA as built.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np

import edgekit
from benchmarks._harness import bundle_of, parse, parser, print_json, progress_on_stderr, run, verdict
from edgekit.core.stats import median
from edgekit.pipeline import sink
from edgekit.processing.preprocessing import INTERPOLATIONS, PreprocessSpec, fit, preprocess
from edgekit.protocol.stages import STAGES

# Resize methods: the spec's own (``interpolation``), then plain OpenCV filters for comparison.
OTHER_RESIZES = {"linear": cv2.INTER_LINEAR, "nearest": cv2.INTER_NEAREST}


def crop_resize(image: np.ndarray, spec: PreprocessSpec, method: str) -> np.ndarray:
    """``fit`` with interpolation ``method``: one of the spec's, or a plain OpenCV filter after the crop."""
    if method in INTERPOLATIONS:
        return fit(image, replace(spec, interpolation=method))
    return cv2.resize(
        fit(image, replace(spec, size=_crop_size(image, spec))),
        spec.size[::-1],
        interpolation=OTHER_RESIZES[method],
    )


def _crop_size(image: np.ndarray, spec: PreprocessSpec) -> tuple[int, int]:
    h, w = image.shape[:2]
    if spec.resize != "center-crop":
        return (h, w)
    scale = min(h / spec.size[0], w / spec.size[1])
    return (round(spec.size[0] * scale), round(spec.size[1] * scale))


def resize_study(bundle: Path) -> None:
    from edgekit.backends import registry
    from edgekit.bundle import read_manifest
    from edgekit.convert.accuracy import compare
    from edgekit.convert.images import smoke_set
    from edgekit.processing.tensors import from_output, to_input

    manifest = read_manifest(bundle)
    spec = PreprocessSpec.from_manifest(manifest)
    frame = np.random.default_rng(0).integers(0, 256, (480, 640, 3), np.uint8)
    methods = [*INTERPOLATIONS, *OTHER_RESIZES]
    print(f"resize of a 640x480 frame to {spec.size[1]}x{spec.size[0]} ({spec.resize}), one thread:")
    cv2.setNumThreads(1)
    for m in methods:
        times = []
        for _ in range(200):
            t0 = time.perf_counter_ns()
            crop_resize(frame, spec, m)
            times.append((time.perf_counter_ns() - t0) / 1e6)
        print(f"  {m:13s} p50 {median(times):.3f} ms  min {min(times):.3f} ms")
    images = smoke_set()
    arts = [a for a in manifest.artifacts if a.backend == "onnxruntime"]
    ref_art = next(a for a in arts if a.precision == "fp32")

    def logits(art_path: Path, method: str) -> np.ndarray:
        with registry.get("onnxruntime").load(art_path, {}) as s:
            rows = []
            for img in images.images:
                x = to_input(preprocess(crop_resize(img, spec, method), spec, "RGB"), s.inputs[0])
                rows.append(from_output(s.run(x)[0], s.outputs[0]).reshape(-1))
            return np.stack(rows)

    reference = logits(bundle / ref_art.path, "area")
    print(f"top-1 agreement with {ref_art.name} fed INTER_AREA ({len(images.names)} smoke-set images):")
    for art in arts:
        for m in methods:
            acc = compare(logits(bundle / art.path, m), reference, images.names, images.smoke)
            print(
                f"  {art.name:18s} {m:13s} decisive {acc.top1_agreement:.3f} ({acc.decisive_images} images)"
                f"  all {acc.top1_agreement_all:.3f}  max |logit diff| {acc.max_abs_logit_diff:.2f}"
                f"  flipped {', '.join(acc.flipped) or '-'}"
            )


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, bundle=True, json_flag=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frames", type=int, default=150, help="frames per pipeline round (30 fps: 5 s)")
    ap.add_argument("--runs", type=int, default=150, help="bare runs per round")
    ap.add_argument(
        "--source",
        default="auto",
        help="auto: a synthetic 640x480 camera at 30 fps, slower when the model is (see below)",
    )
    ap.add_argument(
        "--resize-study", action="store_true", help="time and gate cheaper resize methods instead"
    )
    ap.add_argument(
        "--interpolation",
        choices=INTERPOLATIONS,
        help="what-if: run with this preprocess interpolation instead of the bundle's "
        "(a bundle must be built with it for its answers to be gated)",
    )
    args = parse(ap, argv)
    with progress_on_stderr(args.json):  # the round lines become progress on stderr
        bundle = bundle_of(args)
        if args.resize_study:
            resize_study(bundle)
            return 0
        doc = measure(bundle, args)
    if args.json:
        print_json(doc, indent=1)
    return 0


def measure(bundle: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The rounds, then the preprocess split; prints as it goes and returns the JSON document."""
    bare: list[float] = []
    e2e: list[float] = []
    stages: dict[str, list[float]] = {s: [] for s in STAGES}
    with edgekit.load(bundle, device=args.device) as model:
        if args.interpolation:
            model.preprocess = replace(model.preprocess, interpolation=args.interpolation)
        session = model.session
        x = model.preprocessor()(np.zeros((480, 640, 3), np.uint8)).copy()
        warm = []
        for _ in range(20):
            t0 = time.perf_counter_ns()
            session.run(x)
            warm.append((time.perf_counter_ns() - t0) / 1e6)
        if args.source == "auto":
            # Frames must find the loop idle, or the time they wait in the slot (capture_wait)
            # measures an overloaded loop, not the pipeline: on a busy shared machine a run can
            # take longer than a 30 fps frame period.  A third of the loop's capacity at most.
            fps = min(30.0, 1000 / (3 * median(warm)))
            args.source = f"synthetic:640x480@{fps:.1f}"
        candidate, interpolation = model.candidate, model.preprocess.interpolation
        print(
            f"{model.name} on {model.candidate}; source {args.source}; {args.rounds} rounds; "
            f"resize {model.preprocess.resize}, interpolation {model.preprocess.interpolation}"
        )
        for r in range(args.rounds):
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter_ns()
                session.run(x)
                times.append((time.perf_counter_ns() - t0) / 1e6)
            recs: list[edgekit.FrameRecord] = []
            with edgekit.Pipeline(model, args.source, frames=args.frames) as p:
                p.add_sink(sink("records", lambda r: recs.append(r.record)))  # noqa: B023 - this round only
                for _ in p:
                    pass
            b, e = median(times), median(rec.latency_ms for rec in recs)
            print(f"  round {r + 1}: bare p50 {b:.2f} ms   end-to-end p50 {e:.2f} ms   ratio {b / e:.3f}")
            bare += times
            e2e += [rec.latency_ms for rec in recs]
            for s in STAGES:
                stages[s] += [getattr(rec, f"{s}_ms") for rec in recs]
        # The preprocess stage split on the same kind of frame, in the same process: resize vs the rest.
        spec, prep = model.preprocess, model.preprocessor()
        frame = np.random.default_rng(0).integers(0, 256, (480, 640, 3), np.uint8)
        resize_ms, prep_ms = [], []
        for _ in range(args.runs):
            t0 = time.perf_counter_ns()
            fit(frame, spec)
            t1 = time.perf_counter_ns()
            prep(frame)
            prep_ms.append((time.perf_counter_ns() - t1) / 1e6)
            resize_ms.append((t1 - t0) / 1e6)
    b, e = median(bare), median(e2e)
    print(f"bare session.run p50      : {b:.3f} ms ({len(bare)} runs)")
    print(f"end-to-end frame p50      : {e:.3f} ms ({len(e2e)} frames)")
    print("  stage p50 (ms)          : " + "  ".join(f"{s} {median(v):.3f}" for s, v in stages.items()))
    rz, pp = median(resize_ms), median(prep_ms)
    print(f"  preprocess alone (p50)  : {pp:.3f} ms, of which the resize {rz:.3f} ms ({100 * rz / pp:.0f}%)")
    ratio = b / e
    print(f"pipeline efficiency       : {ratio:.3f} (goal >= 0.95: {verdict(ratio >= 0.95)})")
    # On a shared machine the runtime's speed drifts between the bare rounds and the pipeline
    # rounds; within one frame it does not.  The overhead in ms is what the pipeline adds,
    # whatever the model: efficiency on a quiet machine is bare / (bare + overhead).
    overhead = median(lat - inf for lat, inf in zip(e2e, stages["inference"], strict=True))
    per_frame = median(inf / lat for lat, inf in zip(e2e, stages["inference"], strict=True))
    print(
        f"  per frame (same frame)  : inference / latency p50 {per_frame:.3f}; overhead p50 {overhead:.3f} ms"
    )
    print(f"  ceiling with this resize: {b / (b + rz):.3f} (bare / (bare + resize): nothing else left)")
    return {
        "bundle": str(bundle),
        "candidate": candidate,
        "source": args.source,
        "interpolation": interpolation,
        "bare_p50_ms": b,
        "e2e_p50_ms": e,
        "efficiency": ratio,
        "stages_p50_ms": {s: median(v) for s, v in stages.items()},
        "preprocess_p50_ms": pp,
        "resize_p50_ms": rz,
        "overhead_p50_ms": overhead,
        "inference_over_latency_p50": per_frame,
        "ceiling_with_this_resize": b / (b + rz),
        "bare_runs": len(bare),
        "frames": len(e2e),
    }


if __name__ == "__main__":
    run(main)
