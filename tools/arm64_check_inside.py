#!/usr/bin/env python3
"""Classify image frames with every artifact of a bundle that runs on this machine; print JSON.

tools/arm64_check.sh runs it twice on the same bundle and frames: on the x86_64 host, and
inside the arm64 image under QEMU user-mode emulation (real aarch64 machine code), then
compares the labels.  It needs only the ``device`` extra and the runtimes (no scikit-image:
the frames are image files written on the host).  Usage:

    python tools/arm64_check_inside.py classify BUNDLE FRAMES_DIR [--device rpi5] [--foreign-tvm LIB] [--out F]
    python tools/arm64_check_inside.py compare X86_64.json ARM64.json [--doctor F] [--image F]

``--foreign-tvm LIB`` also loads a TVM library built for another architecture, in a child
process, and records whether edgekit refused it with its clear error (and not a crash).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BACKENDS = ("tvm", "onnxruntime", "litert")  # what an ARM CPU device runs (OpenVINO: x86 builds only)


def classify_all(
    bundle: Path, frames: list[Path], device: str, only: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Every frame through each artifact that runs here; the one ``edgekit.load`` selects is marked.

    Each frame records its two best classes and the whole probability row, so that the
    comparison can tell a near-tie from a real difference and measure how far apart the rows are.
    ``only``: besides the selected one, just these artifacts (the rest are recorded as skipped).
    """
    import cv2
    import numpy as np

    import edgekit
    from edgekit.backends import registry
    from edgekit.bundle import read_manifest
    from edgekit.core.cpu import this_cpu
    from edgekit.core.elf import host_arch
    from edgekit.errors import EdgekitError
    from edgekit.model import Model
    from edgekit.selection.matching import artifact_for

    images = []
    for f in frames:
        image = cv2.imread(str(f), cv2.IMREAD_COLOR)
        if image is None:
            raise SystemExit(f"cannot read frame {f}")
        images.append(image)

    def run(model: Model) -> list[dict[str, Any]]:
        rows = []
        for name, image in zip(frames, images, strict=True):
            t0 = time.perf_counter()
            row = model.infer(image).astype(np.float64)
            ms = (time.perf_counter() - t0) * 1000
            if model.logits:
                row = np.exp(row - row.max())
                row /= row.sum()
            best = np.argsort(-row, kind="stable")[:2].tolist()
            top = [
                [i, model.labels[i] if i < len(model.labels) else f"class {i}", float(row[i])] for i in best
            ]
            rows.append({"frame": name.name, "top": top, "probs": row.tolist(), "ms": ms})
        return rows

    out: dict[str, Any] = {"machine": platform.machine(), "host_arch": host_arch(), "artifacts": {}}
    manifest = read_manifest(bundle)
    t0 = time.perf_counter()
    # The bundle this check built itself from the checkout moments ago (unsigned): allowed explicitly.
    with edgekit.load(bundle, device=device, allow_unsigned=True) as model:
        load_s = time.perf_counter() - t0
        cand = next(c for c in model.candidates if c.key == model.candidate)
        chosen = artifact_for(cand, manifest.artifacts)
        out["selected"] = {"candidate": model.candidate, "artifact": chosen.name if chosen else None}
        selected_frames = run(model)

    for a in manifest.artifacts:
        if a.backend not in BACKENDS or a.kind in ("tflite-edgetpu", "tflite-edgetpu-src"):
            continue
        entry: dict[str, Any] = {"backend": a.backend, "precision": a.precision, "arch": a.arch}
        out["artifacts"][a.name] = entry
        if chosen is not None and a.name == chosen.name:
            entry.update(load_s=load_s, via="edgekit.load", frames=selected_frames)
            continue
        if a.arch not in ("any", host_arch()):
            entry["skipped"] = f"built for {a.arch}"
            continue
        if only and a.name not in only:
            entry["skipped"] = "not asked for (--only)"
            continue
        if a.variant == "full" and host_arch() == "x86_64" and not this_cpu().has("int8-dot"):
            # Full-range int8 weights saturate this CPU's u8 x s8 kernels: not a reference for
            # anything (the arm64 run is compared with the fp32 ONNX instead).
            entry["skipped"] = f"full-range int8 needs int8-dot; this CPU has {this_cpu().why('int8-dot')}"
            continue
        t0 = time.perf_counter()
        try:
            session = registry.get(a.backend).load(bundle / a.path, {})
        except EdgekitError as err:
            entry["skipped"] = err.message
            continue
        entry["load_s"] = time.perf_counter() - t0
        with Model(manifest, session, bundle) as model:
            entry["frames"] = run(model)
    return out


def load_foreign(library: Path) -> dict[str, Any]:
    """Load ``library`` in a child process: edgekit's ModelLoadError is the only right outcome."""
    code = (
        "import json, sys\n"
        "from edgekit.backends import open_session\n"
        "from edgekit.errors import ModelLoadError\n"
        "try:\n"
        "    open_session(sys.argv[1])\n"
        "except ModelLoadError as err:\n"
        "    print(json.dumps({'error': type(err).__name__, 'message': err.message, 'hint': err.hint}))\n"
        "else:\n"
        "    print(json.dumps({'error': None}))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(library)], capture_output=True, text=True, timeout=600
    )
    result: dict[str, Any] = {"returncode": r.returncode}
    if r.returncode == 0 and r.stdout.strip():
        result.update(json.loads(r.stdout.strip().splitlines()[-1]))
    else:
        result["stderr"] = r.stderr[-2000:]
    return result


CAT_IDS = range(281, 286)  # ImageNet: tabby, tiger cat, Persian, Siamese, Egyptian cat


def max_dp(rows: list[dict[str, Any]], refs: list[dict[str, Any]]) -> float:
    """The largest difference in any class's probability between two runs over the same frames."""
    return max(
        abs(float(a) - float(b))
        for row, ref in zip(rows, refs, strict=True)
        for a, b in zip(row["probs"], ref["probs"], strict=True)
    )


def compare(x86: dict[str, Any], arm: dict[str, Any], doctor: dict[str, Any] | None) -> list[str]:
    """Every way the arm64 run differs from what it must be; prints the label table as it goes.

    Each arm64 artifact is compared with the same artifact on x86_64, or, when it is built for
    aarch64 (the TVM library), with the bundle's fp32 ONNX there.  fp32 top-1 labels must be
    equal on every frame.  int8 kernels differ between the two architectures (XNNPACK's
    requantization rounds differently), so an int8 artifact must agree where the reference
    is decisive and may take the reference's second class on a near-tie, as the build's
    accuracy gate allows; such flips are printed.
    """
    from edgekit.core.stats import TIE_MARGIN  # the build's accuracy gate: a frame counts when decisive

    problems: list[str] = []
    if arm["host_arch"] != "aarch64":
        problems.append(f"the emulated run says it is {arm['host_arch']}, not aarch64")
    if doctor is not None:
        backends = ", ".join(
            f"{n} {b['version']}" if b["available"] else f"{n} -" for n, b in doctor["backends"].items()
        )
        flags = " ".join(doctor["cpu"]["flags"]) or "-"
        print(
            f"doctor (arm64): arch {doctor['host']['arch']}, profile {doctor['profile']}, flags {flags}; {backends}"
        )
        if doctor["host"]["arch"] != "aarch64" or doctor["profile"] != "arm64-cpu":
            problems.append(f"doctor: arch {doctor['host']['arch']}, profile {doctor['profile']}")
        for name in BACKENDS:
            if not doctor["backends"][name]["available"]:
                problems.append(f"doctor: {name} is not available: {doctor['backends'][name]['reason']}")
    sel = arm["selected"]
    print(f"edgekit.load(device=rpi5) on arm64 selected {sel['candidate']} ({sel['artifact']})")
    if sel["candidate"] != "tvm-fp32":
        problems.append(f"edgekit.load selected {sel['candidate']} on arm64, not the TVM aarch64 library")

    fp32_onnx = next(
        (
            n
            for n, e in x86["artifacts"].items()
            if e["backend"] == "onnxruntime" and e["precision"] == "fp32"
        ),
        None,
    )
    # Milliseconds per frame on each side (one run, the same frames): emulation's slowdown, not device speed.
    print(
        f"{'arm64 artifact':<20} {'x86_64 reference':<18} {'max |dp|':>9} {'arm64 ms':>9} {'x86 ms':>7} "
        f"{'ratio':>6}  top-1 on arm64"
    )
    for name, entry in arm["artifacts"].items():
        if "frames" not in entry:
            problems.append(f"{name} did not run on arm64: {entry.get('skipped')}")
            continue
        ref_name = name if "frames" in x86["artifacts"].get(name, {}) else fp32_onnx
        if ref_name is None or "frames" not in x86["artifacts"].get(ref_name, {}):
            problems.append(f"{name}: no x86_64 run to compare with")
            continue
        rows, refs = entry["frames"], x86["artifacts"][ref_name]["frames"]
        dp = max_dp(rows, refs)
        ms = sum(r["ms"] for r in rows) / len(rows)
        ref_ms = sum(r["ms"] for r in refs) / len(refs)
        notes = []
        for row, ref in zip(rows, refs, strict=True):
            got, want, second = row["top"][0], ref["top"][0], ref["top"][1]
            margin = want[2] - second[2]
            if got[0] == want[0]:
                notes.append(got[1])
            elif entry["precision"] != "fp32" and margin < TIE_MARGIN and got[0] == second[0]:
                notes.append(
                    f"{got[1]} (near-tie: x86_64 {want[1]} {want[2]:.3f} / {second[1]} {second[2]:.3f})"
                )
            else:
                notes.append(f"{got[1]} != {want[1]}")
                problems.append(
                    f"{name} on {row['frame']}: arm64 {got[1]} ({got[2]:.3f}), x86_64 {ref_name} {want[1]} "
                    f"({want[2]:.3f}; second {second[1]} {second[2]:.3f})"
                )
            if row["frame"].startswith("chelsea") and got[0] not in CAT_IDS:
                problems.append(f"{name} on {row['frame']}: chelsea is not a cat here but {got[1]}")
        via = " (selected)" if entry.get("via") else ""
        print(
            f"{name + via:<20} {ref_name:<18} {dp:9.2e} {ms:9.0f} {ref_ms:7.1f} {ms / ref_ms:5.0f}x  {'; '.join(notes)}"
        )
    foreign = arm.get("foreign_tvm")
    if foreign is None:
        problems.append("the x86_64 TVM library was not tried on arm64")
    else:
        print(
            f"x86_64 TVM library on arm64: exit {foreign['returncode']}, {foreign.get('error')}: {foreign.get('message')}"
        )
        if foreign["returncode"] != 0 or foreign.get("error") != "ModelLoadError":
            problems.append(f"the x86_64 TVM library was not refused cleanly: {foreign}")
        elif "was built for x86_64, this host is aarch64" not in foreign.get("message", ""):
            problems.append(f"the wrong-arch message does not say which arch: {foreign['message']}")
    return problems


def compare_cpu(cpu: str, run: dict[str, Any], arm: dict[str, Any], doctor: dict[str, Any]) -> list[str]:
    """The run on an older emulated Arm core (``QEMU_CPU``, e.g. a Pi 4's Cortex-A72) against the default one.

    The core lacks the dot product and fp16 (``AT_HWCAP`` says so): ``doctor`` must read that;
    the rpi5 TVM library, compiled with ``+dotprod``, must be refused before it runs (it would die
    of SIGILL) and ``edgekit.load`` must fall back; the full-range int8 ONNX model must give the
    same rows on this core's kernels (no dot product: products widened to 16 bits and
    pair-added in 32) as on the default core's, which have it: no Arm core saturates on it.
    """
    problems: list[str] = []
    flags, caps = doctor["cpu"]["flags"], doctor["cpu"]["capabilities"]
    print(f"doctor ({cpu}, emulated): flags {' '.join(flags) or '-'}; int8-dot {caps['int8-dot']['from']}")
    if "asimd" not in flags or caps["int8-dot"]["present"] or caps["fp16"]["present"]:
        problems.append(f"{cpu}: doctor read flags {flags}, int8-dot/fp16 {caps['int8-dot']}/{caps['fp16']}")
    sel = run["selected"]
    tvm = run["artifacts"].get("tvm-fp32", {})
    print(f"edgekit.load(device=rpi5) on {cpu} selected {sel['candidate']}; tvm-fp32: {tvm.get('skipped')}")
    if sel["candidate"] == "tvm-fp32" or "lacks" not in str(tvm.get("skipped")):
        problems.append(f"{cpu}: the rpi5 TVM library was not refused before it ran: {tvm}")
    chosen = run["artifacts"].get(sel["artifact"] or "", {})
    for row in chosen.get("frames", []):
        if row["frame"].startswith("chelsea") and row["top"][0][0] not in CAT_IDS:
            problems.append(f"{cpu}: {sel['candidate']} on {row['frame']}: not a cat but {row['top'][0][1]}")
    name = "onnxruntime-int8-full"
    rows, refs = run["artifacts"].get(name, {}).get("frames"), arm["artifacts"].get(name, {}).get("frames")
    if not rows or not refs:
        return [*problems, f"{cpu}: {name} did not run on both cores"]
    dp = max_dp(rows, refs)
    flips = [r["frame"] for r, f in zip(rows, refs, strict=True) if r["top"][0][0] != f["top"][0][0]]
    print(f"{name} on {cpu} vs the default core: max |dp| {dp:.2e}, top-1 changed on {flips or 'no frame'}")
    if dp > 1e-3 or flips:
        problems.append(
            f"{cpu}: {name} differs from the default core's run (max |dp| {dp:.2e}, flips {flips})"
        )
    return problems


def check_image(image: dict[str, Any]) -> list[str]:
    """What the image's metadata must say: arm64, a non-root user, the agent, a health check."""
    config = image.get("Config") or {}
    health = image.get("Healthcheck") or config.get("Healthcheck") or {}  # podman: top level
    print(
        f"image: {image.get('Architecture')}, user {config.get('User')!r}, "
        f"entrypoint {config.get('Entrypoint')}, health check {health.get('Test')}"
    )
    problems = []
    if image.get("Architecture") != "arm64":
        problems.append(f"image architecture {image.get('Architecture')}, not arm64")
    if str(config.get("User") or "root").split(":")[0] in ("root", "0"):
        problems.append("the image runs as root")
    if config.get("Entrypoint") != ["edgekit", "agent"]:
        problems.append(f"entrypoint {config.get('Entrypoint')}, not edgekit agent")
    if not health.get("Test"):
        problems.append("the image has no health check")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("classify", help="classify FRAMES with every artifact of BUNDLE that runs here")
    c.add_argument("bundle", type=Path)
    c.add_argument("frames", type=Path, help="a directory of .png/.jpg frames")
    c.add_argument("--device", default="rpi5", help="the profile edgekit.load selects with")
    c.add_argument("--foreign-tvm", type=Path, help="a TVM library built for another architecture")
    c.add_argument("--out", type=Path, help="write the JSON here (default: stdout)")
    c.add_argument(
        "--only", default="", help="comma-separated: only these artifacts besides the selected one"
    )
    m = sub.add_parser("compare", help="compare an arm64 run with the x86_64 run; exit 1 on any difference")
    m.add_argument("x86_64", type=Path)
    m.add_argument("arm64", type=Path)
    m.add_argument("--doctor", type=Path, help="`edgekit doctor --json` from the arm64 image")
    m.add_argument("--image", type=Path, help="`podman image inspect` of the arm64 image")
    k = sub.add_parser("compare-cpu", help="compare a run on an older emulated core with the default core's")
    k.add_argument("cpu", help="the QEMU CPU model it ran on")
    k.add_argument("run", type=Path)
    k.add_argument("arm64", type=Path)
    k.add_argument("--doctor", type=Path, required=True, help="`edgekit doctor --json` on that core")
    args = p.parse_args()

    if args.command == "compare-cpu":
        problems = compare_cpu(
            args.cpu,
            json.loads(args.run.read_text()),
            json.loads(args.arm64.read_text()),
            json.loads(args.doctor.read_text()),
        )
        for problem in problems:
            print(f"FAIL: {problem}", file=sys.stderr)
        return 1 if problems else 0

    if args.command == "compare":
        doctor = json.loads(args.doctor.read_text()) if args.doctor else None
        problems = compare(json.loads(args.x86_64.read_text()), json.loads(args.arm64.read_text()), doctor)
        if args.image:
            problems += check_image(json.loads(args.image.read_text())[0])
        for problem in problems:
            print(f"FAIL: {problem}", file=sys.stderr)
        return 1 if problems else 0

    frames = sorted(f for f in args.frames.iterdir() if f.suffix.lower() in (".png", ".jpg", ".jpeg"))
    if not frames:
        print(f"no frames in {args.frames}", file=sys.stderr)
        return 2
    out = classify_all(args.bundle, frames, args.device, frozenset(n for n in args.only.split(",") if n))
    if args.foreign_tvm is not None:
        out["foreign_tvm"] = load_foreign(args.foreign_tvm)
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
