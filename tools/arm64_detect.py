#!/usr/bin/env python3
"""Detect faces with every artifact of a detector bundle that runs on this machine; print JSON.

tools/arm64_check.sh runs it on the rpi5 BlazeFace bundle twice, on the x86_64 host and inside
the arm64 image under QEMU user-mode emulation, then compares the boxes.  Inside the image it
also runs the device's health gate (``edgekit.deploy.health.check_health``) on the bundle: the
artifact the device selects (the TVM aarch64 library, which the build cannot run on x86_64 and
so never gated) against the reference detections the build wrote into the bundle.  It needs
only the ``device`` extra and the runtimes; the frames are image files written on the host.

    python tools/arm64_detect.py detect BUNDLE FRAMES_DIR --trusted-key PUB [--device rpi5] [--health] [--out F]
    python tools/arm64_detect.py compare X86_64.json ARM64.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from arm64_check_inside import BACKENDS  # beside this file, on the host and in the image

# The boxes an aarch64 artifact must give, against the host's fp32 ONNX, where it must be close:
# fp32 artifacts on every frame, and every artifact on the astronaut (a large, frontal face,
# scored 0.92: int8's own drift there is under 0.005 in score and 0.97 IoU on x86_64).
MIN_IOU = 0.9
MAX_SCORE_DRIFT = 0.02
STRICT_FRAME = "astronaut"
# Emulation runs aarch64 code one to two hundred times slower than the device: the health gate's
# latency budget says nothing here, so it gets this one (a minute a frame) and only accuracy decides.
EMULATED_BUDGET_MS = 60_000.0


def detect_all(bundle: Path, frames: list[Path], device: str, trusted: Path) -> dict[str, Any]:
    """Every frame through each artifact that runs here (``model.detect``); the selected one marked."""
    import cv2

    import edgekit
    from edgekit.backends import registry
    from edgekit.bundle import read_manifest
    from edgekit.core.cpu import this_cpu
    from edgekit.core.elf import host_arch
    from edgekit.errors import EdgekitError
    from edgekit.model import Model
    from edgekit.selection.matching import artifact_for

    images = {}
    for f in frames:
        image = cv2.imread(str(f), cv2.IMREAD_COLOR)
        if image is None:
            raise SystemExit(f"cannot read frame {f}")
        images[f.stem] = image

    def run(model: Model) -> dict[str, Any]:
        found, ms = {}, []
        for name, image in images.items():
            t0 = time.perf_counter()
            found[name] = [d.to_dict() for d in model.detect(image)]
            ms.append((time.perf_counter() - t0) * 1000)
        return {"frames": found, "ms": sum(ms) / len(ms)}

    out: dict[str, Any] = {"machine": platform.machine(), "host_arch": host_arch(), "artifacts": {}}
    manifest = read_manifest(bundle)
    # Signed on the host by a key made for this run: the device's signature check runs too.
    with edgekit.load(bundle, device=device, trusted_keys=[trusted]) as model:
        cand = next(c for c in model.candidates if c.key == model.candidate)
        chosen = artifact_for(cand, manifest.artifacts)
        out["selected"] = {"candidate": model.candidate, "artifact": chosen.name if chosen else None}
        selected = run(model)

    for a in manifest.artifacts:
        if a.backend not in BACKENDS or a.kind in ("tflite-edgetpu", "tflite-edgetpu-src"):
            continue
        entry: dict[str, Any] = {"backend": a.backend, "precision": a.precision, "arch": a.arch}
        out["artifacts"][a.name] = entry
        if chosen is not None and a.name == chosen.name:
            entry.update(via="edgekit.load", **selected)
            continue
        if a.arch not in ("any", host_arch()):
            entry["skipped"] = f"built for {a.arch}"
            continue
        if a.variant == "full" and host_arch() == "x86_64" and not this_cpu().has("int8-dot"):
            # As in the classifier's check: not a reference (arm64 compares it with the fp32 ONNX).
            entry["skipped"] = f"full-range int8 needs int8-dot; this CPU has {this_cpu().why('int8-dot')}"
            continue
        try:
            session = registry.get(a.backend).load(bundle / a.path, {})
        except EdgekitError as err:
            entry["skipped"] = err.message
            continue
        with Model(manifest, session, bundle) as model:
            entry.update(run(model))
    return out


def health(bundle: Path, device: str, trusted: Path) -> dict[str, Any]:
    """The device's health gate on the bundle: each eval frame once, accuracy judged, latency not."""
    from edgekit.deploy.health import check_health

    t0 = time.perf_counter()
    report = check_health(bundle, device, [trusted], runs=1, warmup=1, budget_ms=EMULATED_BUDGET_MS)
    return {**report.to_dict(), "reason": report.reason, "s": time.perf_counter() - t0}


def compare(x86: dict[str, Any], arm: dict[str, Any]) -> list[str]:
    """Every way the arm64 detections differ from what they must be; prints the table as it goes.

    The reference is the host's fp32 ONNX: each arm64 artifact must find as many faces on every
    frame, each matched (same class, IoU >= the build gate's 0.5), and within ``MIN_IOU`` and
    ``MAX_SCORE_DRIFT`` where that applies (see above).  A frame where the reference finds no
    face must have none either.
    """
    from edgekit.detection.detector import Detection, match

    problems: list[str] = []
    if arm["host_arch"] != "aarch64":
        problems.append(f"the emulated run says it is {arm['host_arch']}, not aarch64")
    sel = arm["selected"]
    print(f"edgekit.load(device=rpi5) on arm64 selected {sel['candidate']} ({sel['artifact']}) for BlazeFace")
    if sel["candidate"] != "tvm-fp32":
        problems.append(
            f"edgekit.load selected {sel['candidate']} for the detector, not the TVM aarch64 library"
        )

    ref_name = next(
        (
            n
            for n, e in x86["artifacts"].items()
            if e["backend"] == "onnxruntime" and e["precision"] == "fp32"
        ),
        None,
    )
    if ref_name is None or "frames" not in x86["artifacts"][ref_name]:
        return [*problems, "no fp32 ONNX run on x86_64 to compare the detections with"]
    ref = x86["artifacts"][ref_name]["frames"]
    if not ref.get(STRICT_FRAME):
        problems.append(f"the x86_64 fp32 ONNX finds no face in {STRICT_FRAME}")

    def dets(rows: list[dict[str, Any]]) -> list[Detection]:
        return [Detection(r["class_id"], r["name"], r["score"], (*r["box"][:4],)) for r in rows]

    print(
        f"{'arm64 artifact':<28} {'frame':<10} {'faces':>5} {'x86':>4} {'IoU':>6} {'score':>7} {'Δscore':>7}  ms a frame"
    )
    for name, entry in arm["artifacts"].items():
        if "frames" not in entry:
            problems.append(f"{name} did not run on arm64: {entry.get('skipped')}")
            continue
        label = name + (" (selected)" if entry.get("via") else "")
        for frame, want_rows in ref.items():
            got, want = dets(entry["frames"][frame]), dets(want_rows)
            m = match(want, got)
            ious = [v for _, _, v in m.pairs]
            drifts = [got[o].score - want[r].score for r, o, _ in m.pairs]
            iou_text = f"{min(ious):6.3f}" if ious else f"{'-':>6}"
            score_text = f"{max(d.score for d in got):7.3f}" if got else f"{'-':>7}"
            drift_text = f"{max(drifts, key=abs):+7.3f}" if drifts else f"{'-':>7}"
            ms_text = f"{entry['ms']:.0f}" if label else ""  # emulated: the slowdown, not the device's speed
            print(
                f"{label:<28} {frame:<10} {len(got):>5} {len(want):>4} {iou_text} {score_text} {drift_text}  {ms_text}".rstrip()
            )
            label = ""
            if len(got) != len(want) or m.missed or m.extra:
                problems.append(
                    f"{name} on {frame}: {len(got)} faces on arm64, {len(want)} from x86_64 {ref_name} "
                    f"({len(m.missed)} missed, {len(m.extra)} extra)"
                )
                continue
            strict = entry["precision"] == "fp32" or frame == STRICT_FRAME
            if strict and ious and min(ious) < MIN_IOU:
                problems.append(
                    f"{name} on {frame}: IoU {min(ious):.3f} with x86_64 {ref_name}, under {MIN_IOU}"
                )
            if strict and drifts and max(abs(d) for d in drifts) > MAX_SCORE_DRIFT:
                problems.append(
                    f"{name} on {frame}: score {max(drifts, key=abs):+.3f} from x86_64 {ref_name}, "
                    f"more than {MAX_SCORE_DRIFT}"
                )

    h = arm.get("health")
    if h is None:
        problems.append("the health gate did not run on arm64")
    else:
        d = h.get("detection") or {}
        print(
            f"health gate on arm64 ({h.get('candidate')}): {'passed' if h['ok'] else 'FAILED'}, "
            f"{d.get('matched')}/{d.get('decisive')} decisive faces matched, missed {d.get('missed')}, "
            f"extra {d.get('extra')}, mean IoU {d.get('mean_iou')}, {h['frames']} eval frames in {h['s']:.0f} s "
            f"(emulated p50 {h.get('p50_ms')} ms, not judged)"
        )
        if not h["ok"]:
            problems.append(f"the health gate failed on arm64: {h['reason']}")
        if h.get("candidate") != sel["candidate"]:
            problems.append(f"the health gate ran {h.get('candidate')}, not the selected {sel['candidate']}")
        if not d.get("decisive"):
            problems.append("the health gate had no decisive face to match")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("detect", help="detect in FRAMES with every artifact of BUNDLE that runs here")
    d.add_argument("bundle", type=Path)
    d.add_argument("frames", type=Path, help="a directory of .png/.jpg frames")
    d.add_argument("--device", default="rpi5", help="the profile edgekit.load selects with")
    d.add_argument("--trusted-key", type=Path, required=True, help="the public key the bundle is signed with")
    d.add_argument("--health", action="store_true", help="also run the device's health gate on the bundle")
    d.add_argument("--out", type=Path, help="write the JSON here (default: stdout)")
    m = sub.add_parser("compare", help="compare an arm64 run with the x86_64 run; exit 1 on any difference")
    m.add_argument("x86_64", type=Path)
    m.add_argument("arm64", type=Path)
    args = p.parse_args()

    if args.command == "compare":
        problems = compare(json.loads(args.x86_64.read_text()), json.loads(args.arm64.read_text()))
        for problem in problems:
            print(f"FAIL: {problem}", file=sys.stderr)
        return 1 if problems else 0

    frames = sorted(f for f in args.frames.iterdir() if f.suffix.lower() in (".png", ".jpg", ".jpeg"))
    if not frames:
        print(f"no frames in {args.frames}", file=sys.stderr)
        return 2
    out = detect_all(args.bundle, frames, args.device, args.trusted_key)
    if args.health:
        out["health"] = health(args.bundle, args.device, args.trusted_key)
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
