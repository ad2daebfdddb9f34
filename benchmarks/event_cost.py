"""Event cost: what tracking, zones and events add to a frame, alone and end to end on the reference detector.

**Per frame** (no model): ``EventSink.frame``, the whole event path of one frame (the tracker on
its detections, the zone engine on the tracks, the events to an outlet and to ``events()``'s
queue), at 1, 20 and 100 objects: ``tracker_cost``'s scene (boxes moving and bouncing across a
1920x1080 frame, with noise, 5 % misses and faint detections) through ``zone_cost``'s 4 zones and
2 lines.  ``+ proof`` adds the hand-over of each frame to the proof writer (a queue put: its JPEG
encoding runs on the writer's thread, on the other core).

**End to end**: BlazeFace (the reference detector, fp32 on ONNX Runtime) on a made-up 640x480
video of two faces (scikit-image's astronaut) crossing the frame, replayed at 30 fps; each
frame's latency (capture to every sink done), p50 and p99, without events and with them (a
zone, a line, snapshots and clips), in alternating runs so both see the same machine.

    .venv/bin/python -m benchmarks.event_cost [--frames 3000] [--seconds 10] [--rounds 2] [--json]
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._harness import parse, parser, print_doc, run
from benchmarks.tracker_cost import scene
from benchmarks.zone_cost import REGIONS
from edgekit.core.stats import label, percentile
from edgekit.events.proof import ProofConfig, ProofWriter
from edgekit.pipeline.event_sink import EventSink
from edgekit.pipeline.records import FrameResult
from edgekit.pipeline.sinks import sink
from edgekit.testing.frames import finished_frame

COUNTS = (1, 20, 100)
FPS = 30.0
W, H = 640, 480  # the end-to-end video


def per_frame(objects: int, frames: int, proof_root: Path | None) -> dict[str, Any]:
    """p50/p99 µs of ``EventSink.frame`` over ``frames`` frames of ``objects`` moving objects."""
    frame = np.zeros((1080, 1920, 3), np.uint8)
    writer = None
    if proof_root is not None:
        # Not started: each frame and event is handed over (the frame thread's cost, measured
        # here), none encoded on the core the timing runs on.
        writer = ProofWriter(proof_root, ProofConfig(clips=True, queue_size=1 << 16))
    sink = EventSink({"bench": REGIONS}, proof=writer, outlets=[lambda e: None])
    results = [
        finished_frame(f, frame, dets, t=1e6 + f / FPS, camera="bench")
        for f, dets in enumerate(scene(objects, frames, objects))
    ]
    times: list[float] = []
    for r in results:
        t0 = time.perf_counter_ns()
        sink.frame(r)
        times.append((time.perf_counter_ns() - t0) / 1e3)
        sink.take()
    times.sort()
    return {
        **{f"{label(q)}_us": round(percentile(times, q), 1) for q in (50.0, 99.0)},
        "events": sum(sink.counts.values()),
    }


def faces_video(path: Path, seconds: float) -> Path:
    """Two astronaut faces crossing a 640x480 frame in opposite directions, MJPEG at 30 fps."""
    import cv2
    from skimage import data

    astronaut = data.astronaut()  # type: ignore[no-untyped-call]
    face = cv2.cvtColor(astronaut[20:240, 140:330], cv2.COLOR_RGB2BGR)  # 220 x 190
    fh, fw = face.shape[:2]
    out = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), FPS, (W, H))
    n = round(seconds * FPS)
    for i in range(n):
        img = np.full((H, W, 3), 90, np.uint8)
        x = round((W - fw) * (i / max(n - 1, 1)))
        img[10 : 10 + fh, x : x + fw] = face
        img[H - fh - 10 : H - 10, W - fw - x : W - x] = face
        out.write(img)
    out.release()
    return path


def _bundle(work: Path) -> tuple[Path, Path]:
    """BlazeFace fp32 for ONNX Runtime, built (once, kept in the cache) and signed with a key of its own."""
    from edgekit.bundle import generate_keypair
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import read_card
    from edgekit.core.paths import cache_root

    home = cache_root() / "bench-event-cost"
    home.mkdir(parents=True, exist_ok=True)
    private, public = home / "key.pem", home / "key.pub.pem"
    if not private.is_file():
        generate_keypair(home / "key")
    out = home / "blazeface-onnxruntime-fp32"
    if not (out / "manifest.json").is_file():
        card = read_card(Path(__file__).resolve().parent.parent / "models" / "blazeface")
        build(
            BuildRequest(
                card=card,
                device="x86_64-cpu",
                out=out,
                backends=("onnxruntime",),
                precisions=("fp32",),
                sign_key=private,
                measure_latency=False,
            )
        )
    return out, public


def end_to_end(seconds: float, rounds: int) -> dict[str, Any]:
    import edgekit
    from edgekit.events.zones import regions_from_dict

    regions = regions_from_dict(
        {
            "zones": {"left": {"polygon": [[0, 0], [0.5, 0], [0.5, 1], [0, 1]], "dwell_s": 1.0}},
            "lines": {"middle": {"a": [0.5, 1.0], "b": [0.5, 0.0]}},
        }
    )
    latencies: dict[str, list[float]] = {"without": [], "with": []}
    events = 0
    faces = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        video = faces_video(work / "faces.avi", seconds)
        bundle, key = _bundle(work)
        with edgekit.load(bundle, device="x86_64-cpu", trusted_keys=[key]) as model:
            for r in range(rounds):
                for mode in ("without", "with"):
                    with edgekit.Pipeline(model, str(video), realtime=True, warm="off") as pipeline:
                        events_sink = None
                        if mode == "with":
                            events_sink = pipeline.add_events(regions, proof_dir=work / f"proofs{r}")
                        # Added last, inline: capture to every sink before it done, events included
                        # (a record's latency ends before the sinks run).
                        pipeline.add_sink(sink("latency", _until_now(latencies[mode])))
                        for result in pipeline:
                            faces += len(result.detections)
                        if events_sink is not None:
                            events += sum(events_sink.counts.values())
    out: dict[str, Any] = {"seconds": seconds, "rounds": rounds, "events": events, "faces": faces}
    for mode, values in latencies.items():
        values.sort()
        out[mode] = {f"{label(q)}_ms": round(percentile(values, q), 2) for q in (50.0, 99.0)}
        out[mode]["frames"] = len(values)
    out["added_p50_ms"] = round(out["with"]["p50_ms"] - out["without"]["p50_ms"], 2)
    return out


def _until_now(into: list[float]) -> Callable[[FrameResult], None]:
    def done(result: FrameResult) -> None:
        into.append((time.perf_counter_ns() - result.record.captured_ns) / 1e6)

    return done


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"EventSink.frame per frame: tracker + 4 zones + 2 lines + events, {doc['frames']} frames (µs)",
        "objects    p50     p99  + proof p50  + proof p99  events",
    ]
    for r in doc["rows"]:
        lines.append(
            f"{r['objects']:7d} {r['p50_us']:6.1f} {r['p99_us']:7.1f} {r['proof']['p50_us']:12.1f}"
            f" {r['proof']['p99_us']:11.1f} {r['events']:7d}"
        )
    e = doc.get("end_to_end")
    if e:
        lines += [
            "",
            f"BlazeFace fp32 (onnxruntime), 640x480 at 30 fps, {e['rounds']} x {e['seconds']:g} s each way",
            f"  without events: p50 {e['without']['p50_ms']:.2f} ms  p99 {e['without']['p99_ms']:.2f} ms"
            f"  ({e['without']['frames']} frames)",
            f"  with events:    p50 {e['with']['p50_ms']:.2f} ms  p99 {e['with']['p99_ms']:.2f} ms"
            f"  ({e['with']['frames']} frames, {e['events']} events)",
            f"  added p50: {e['added_p50_ms']:+.2f} ms",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, json_flag=True)
    ap.add_argument("--frames", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each end-to-end run")
    ap.add_argument("--rounds", type=int, default=2, help="end-to-end runs each way (0: none)")
    args = parse(ap, argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in COUNTS:
            row = {"objects": n, **per_frame(n, args.frames, None)}
            row["proof"] = per_frame(n, args.frames, Path(tmp) / f"p{n}")
            rows.append(row)
    doc: dict[str, Any] = {"frames": args.frames, "rows": rows}
    if args.rounds > 0:
        doc["end_to_end"] = end_to_end(args.seconds, args.rounds)
    print_doc(doc, args.json, render)
    return 0


if __name__ == "__main__":
    run(main)
