"""One benchmark candidate in its own process: ``python -m edgekit.bench.worker`` (spec as JSON on stdin).

A fresh process per candidate is what a device is: one runtime in one process, started
cold.  The worker loads the artifact, labels the first evaluation frame (the cold-start
point), warms up, then issues SingleStream queries back to back (the next query is
issued when the last one returned, as LoadGen's SingleStream does) until it has both
``min_queries`` and ``min_duration_s``, or ``max_duration_s`` has passed.  A query is one
``session.run`` on a preprocessed sample, samples taken in turn from the bundle's
evaluation frames.

With ``fps`` > 0 it then runs the camera-rate scenario on the same session: ``paced_queries``
queries issued at ``fps`` (``edgekit.device.pacing``), the runtime idle between them as it
is between a camera's frames.

It writes JSON lines on stdout: ``{"event": "loaded", ...}``, ``{"event": "progress",
"queries": n}`` about four times a second, ``{"event": "pacing", ...}`` when the paced run
starts, then ``{"event": "result", ...}`` with every query latency (the paced ones under
``paced``), the top-1 answers on the evaluation frames and the peak RSS.  Timestamps
are ``time.monotonic()``, one clock for every process on the machine, so the parent
turns them into a cold start measured from the moment it started this process.

A detector (``model.task == "detection"``) is judged as the device's health gate judges it:
every output of each evaluation frame decoded by the bundle's head (its threshold lowered as
``edgekit.detection.agreement.widened`` says), boxes mapped to the frame, and compared with
the reference detections the bundle carries by ``detection_gate``'s rule.  The result then
carries ``detection`` (the summed numbers, ``DetectionAgreement``'s fields) and
``failing_frames`` instead of top-1 answers, whose argmax over a detector's first output
would mean nothing; its first result (the cold-start point) is the first frame's detections.
Its postprocess stage (decode, NMS, boxes to frame pixels, at the head's own threshold) is
timed apart, after the queries: ``postprocess_ms``.

It imports only what a device has (numpy, OpenCV, the runtime, the manifest schema).
"""

from __future__ import annotations

import time

T_MAIN = time.monotonic()  # first thing: how long the interpreter took to get here is the parent's to see

import json  # noqa: E402  (after the timestamp on purpose)
import math  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

if TYPE_CHECKING:  # types only: the worker imports numpy and the runtime once its clock has started
    import numpy as np

    from edgekit.backends.base import Session
    from edgekit.bundle.manifest import DetectionHead
    from edgekit.processing.preprocessing import PreprocessSpec


def peak_rss_mb() -> float | None:
    """This process's peak resident set (VmHWM) in MiB; None where /proc is not there."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    except (ImportError, OSError):
        return None


def emit(event: str, **data: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, "t": time.monotonic(), **data}) + "\n")
    sys.stdout.flush()


def run(spec: dict[str, Any]) -> None:
    import dataclasses

    import numpy as np

    t_import0 = time.monotonic()
    import cv2

    from edgekit.backends import registry
    from edgekit.bundle import read_manifest
    from edgekit.processing.preprocessing import Preprocessor, PreprocessSpec
    from edgekit.processing.tensors import from_output

    root = Path(spec["bundle"])
    manifest = read_manifest(root)
    art = manifest.artifact(spec["artifact"])
    backend = registry.get(art.backend)
    t_imported = time.monotonic()

    evals = manifest.eval_set
    frames = []
    evaluated = []  # the evaluation frames that decoded, for a detector's comparison
    for f in evals.frames if evals else ():
        image = cv2.imdecode(np.frombuffer((root / f.path).read_bytes(), np.uint8), cv2.IMREAD_COLOR)
        if image is not None:
            frames.append((image, f.top1, f.margin))
            evaluated.append(f)
    if not frames:  # an old bundle without evaluation frames: a mid-grey frame still times the model
        frames.append((np.full((480, 640, 3), 128, np.uint8), -1, 0.0))

    session = backend.load(root / art.path, spec["options"])  # runtime import happens here, if lazy
    t_loaded = time.monotonic()
    spec_pre = PreprocessSpec.from_manifest(manifest)
    prep = Preprocessor(spec_pre, session.inputs[0])
    out_spec = session.outputs[0]
    head = manifest.detection if manifest.model.task == "detection" else None

    def top1(x: np.ndarray) -> int:
        return int(np.argmax(from_output(session.run(x)[0], out_spec).reshape(-1)))

    if head is not None:
        from edgekit.detection.agreement import compare_frame, summarize, widened
        from edgekit.detection.detector import Detection, Detector

        # Decoded as the health gate decodes them (its threshold lowered), so a score that
        # wobbles across the threshold is drift, not a miss: the one rule of both gates.
        detector = Detector(widened(head), spec_pre, manifest.labels)
        names = [o.name for o in session.outputs]

        def detect(x: np.ndarray, frame_hw: tuple[int, int]) -> tuple[Detection, ...]:
            raw = session.run(x)
            outputs = [from_output(y, o) for y, o in zip(raw, session.outputs, strict=True)]
            found: tuple[Detection, ...] = detector(outputs, frame_hw, names)
            return found

    def hw(image: np.ndarray) -> tuple[int, int]:
        return int(image.shape[0]), int(image.shape[1])

    if head is None:
        first: dict[str, Any] = {"first_top1": top1(prep(frames[0][0]))}
    else:
        first = {"first_detections": len(detect(prep(frames[0][0]), hw(frames[0][0])))}
    t_first = time.monotonic()
    emit(
        "loaded",
        t_main=T_MAIN,
        t_import0=t_import0,
        t_imported=t_imported,
        t_loaded=t_loaded,
        t_first=t_first,
        device=session.device,
        kernels=list(session.kernels),
        **first,
    )

    samples = [prep(image).copy() for image, _, _ in frames]
    reference = [ref for _, ref, _ in frames]
    margins = [margin for _, _, margin in frames]
    judged: dict[str, Any] = {}
    if head is None:
        answers = [top1(x) for x in samples]
    else:
        answers = []
        labels = manifest.labels
        compared = []
        for f, x, (image, _, _) in zip(evaluated, samples, frames, strict=False):
            ref = [
                Detection(d.class_id, labels[d.class_id] if d.class_id < len(labels) else "", d.score, d.box)
                for d in f.detections or ()
            ]
            # The head as the bundle has it: decisive is its threshold plus the margin (both sides
            # were decoded widened), the build gate's rule.
            compared.append(compare_frame(ref, detect(x, hw(image)), head))
        if compared:  # none: an old bundle's grey stand-in frame has no reference to compare with
            summary = summarize(compared)
            judged = {
                "detection": dataclasses.asdict(summary),
                "failing_frames": [Path(evaluated[i].path).name for i in summary.failing],
            }

    warm_end = time.monotonic() + spec["warmup_s"]
    n = 0
    while n < spec["warmup_queries"] or time.monotonic() < warm_end:
        session.run(samples[n % len(samples)])
        n += 1

    lat, duration, cpu_s = single_stream(session, samples, spec)
    paced = paced_queries(
        session, samples, float(spec.get("fps") or 0.0), int(spec.get("paced_queries") or 0)
    )
    if head is not None:
        judged["postprocess_ms"] = _postprocess_times(
            session, head, spec_pre, manifest.labels, samples, frames, len(lat)
        )
    session.close()
    emit(
        "result",
        latencies_ms=lat,
        duration_s=duration,
        cpu_s=cpu_s,
        top1=answers,
        reference_top1=reference,
        reference_margin=margins,
        peak_rss_mb=peak_rss_mb(),
        **paced,
        **judged,
    )


def single_stream(
    session: Session, samples: Sequence[np.ndarray], spec: dict[str, Any]
) -> tuple[list[float], float, float]:
    """LoadGen's SingleStream: each query as soon as the last returned, until the spec's bounds.

    Runs until it has both ``min_queries`` and ``min_duration_s``, or ``max_duration_s`` has
    passed; returns the latencies (ms), the wall time and this process's CPU time (s).
    """
    min_q, min_s, max_s = spec["min_queries"], spec["min_duration_s"], spec["max_duration_s"]
    lat: list[float] = []
    clock = time.perf_counter_ns
    cpu0 = time.process_time()  # all of this process's threads: steadier than wall time on a busy machine
    start = clock()
    next_report = time.monotonic() + 0.25
    k = len(samples)
    i = 0
    while True:
        x = samples[i % k]
        t0 = clock()
        session.run(x)
        t1 = clock()
        lat.append((t1 - t0) / 1e6)
        i += 1
        elapsed = (t1 - start) / 1e9
        if (i >= min_q and elapsed >= min_s) or elapsed >= max_s:
            break
        if time.monotonic() >= next_report:
            emit("progress", queries=i, elapsed_s=elapsed)
            next_report = time.monotonic() + 0.25
    return lat, (clock() - start) / 1e9, time.process_time() - cpu0


def paced_queries(
    session: Session, samples: Sequence[np.ndarray], fps: float, queries: int
) -> dict[str, Any]:
    """The camera-rate scenario after the back-to-back one: ``queries`` issued at ``fps`` (none at 0),
    cold (nothing between them), then warm (warm passes before each, as the frame loop does).

    Same session, same samples in turn; ``edgekit.device.pacing`` keeps the schedule (each
    query at its slot, never early, overruns counted).  Its warm-up queries are paced too,
    so the first measured one comes after an idle gap like every other.
    """
    if fps <= 0 or queries < 1:
        return {}
    from edgekit.device.pacing import paced_run

    emit("pacing", fps=fps, queries=queries)
    turn = [0]

    def one() -> None:
        session.run(samples[turn[0] % len(samples)])
        turn[0] += 1

    run = paced_run(one, fps, queries)
    # Then as the frame loop runs it: warm passes (more queries, untimed) just before each.
    warm = paced_run(one, fps, queries, warm=one)
    return {
        "paced": {
            "fps": fps,
            "latencies_ms": list(run.latencies_ms),
            "overruns": run.overruns,
            "duration_s": run.duration_s,
        },
        "paced_warm": {
            "latencies_ms": list(warm.latencies_ms),
            "overruns": warm.overruns,
            "duration_s": warm.duration_s,
            "warm_passes": warm.warm_passes,
            "warm_pass_ms": None if math.isnan(warm.warm_pass_ms) else warm.warm_pass_ms,
        },
    }


def _postprocess_times(
    session: Session,
    head: DetectionHead,
    spec: PreprocessSpec,
    labels: Sequence[str],
    samples: Sequence[np.ndarray],
    frames: Sequence[tuple[np.ndarray, int, float]],
    queries: int,
) -> list[float]:
    """A detector's postprocess stage per frame (ms), timed apart from its queries.

    What the frame loop's ``postprocess`` stage does with a frame's outputs: every output
    read as float, decoded by the head at its own threshold, suppressed (NMS), boxes mapped
    to the frame's pixels; run on each evaluation frame's outputs in turn, as many times as
    there were queries (at most 1000).  Kept out of the query latencies, which stay the
    runtime's alone, comparable with a classifier's and with other tools' SingleStream numbers.
    """
    import numpy as np

    from edgekit.detection.detector import Detector
    from edgekit.processing.tensors import from_output

    detector = Detector(head, spec, labels)
    names = [o.name for o in session.outputs]
    # Copies: a runtime may hand back buffers that its next run overwrites.
    raws = [[np.array(y, copy=True) for y in session.run(x)] for x in samples]
    sizes = [(int(image.shape[0]), int(image.shape[1])) for image, _, _ in frames]
    clock = time.perf_counter_ns
    out: list[float] = []
    for n in range(max(1, min(queries, 1000))):
        raw, hw = raws[n % len(raws)], sizes[n % len(sizes)]
        t0 = clock()
        detector([from_output(y, o) for y, o in zip(raw, session.outputs, strict=True)], hw, names)
        out.append((clock() - t0) / 1e6)
    return out


def main() -> int:
    from edgekit.errors import EdgekitError

    spec = json.loads(sys.stdin.read())
    try:
        run(spec)
    except EdgekitError as err:
        emit("error", message=err.message, hint=err.hint)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
