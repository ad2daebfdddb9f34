"""The source matrix: kind x codec x transport x fault against a real camera, and what edgekit made of each.

    .venv/bin/python -m benchmarks.source_matrix [--kind rtsp --kind http-mjpeg] [--codec h264 ...]
        [--transport tcp ...] [--fault ...] [--json]

The kinds: ``rtsp`` (gst-rtsp-server on loopback, tests/rtsp_server.py, read as open_source reads
it: GStreamer when PyGObject is here), ``rtsp-ffmpeg`` (the same camera through OpenCV's FFmpeg,
the path without PyGObject) and ``http-mjpeg`` (tests/mjpeg_server.py, through OpenCV's FFmpeg).
Each cell starts a camera, reads it as a
pipeline's capture thread does, and does one fault on the camera's side: the server killed
for 3 s, the stream paused 4 s with its connection open, 10 % of the encoded frames dropped
for 3 s, the resolution changed, or wrong credentials.  tests/test_sources_rtsp.py asserts on
the same cells (tests/test_source_kinds.py the other kinds'); this prints them as a table: frames, outages, reopens, stalls, the time to
notice (detect) and to get frames again after the fault ended (recover), what the user sees.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from benchmarks._harness import parse, parser, print_doc, progress_on_stderr, run

# The cells are the tests' (tests/source_faults.py, with the RTSP camera it starts): one code for both.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
source_faults: Any = importlib.import_module("source_faults")


def render(doc: dict[str, Any]) -> str:
    head = "| kind | codec | transport | fault | frames | after | outages | reopens | stalls | detect s | recover s | sees |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for c in doc["cells"]:
        if c["na"]:
            lines.append(
                f"| {c['kind']} | {c['codec']} | {c['transport']} | {c['fault']} |"
                + " - |" * 7
                + f" {c['na']} |"
            )
            continue
        seen = (c["error"] or c["sees"]).replace("|", "\\|")  # an error's hint follows a "|"
        lines.append(
            f"| {c['kind']} | {c['codec']} | {c['transport']} | {c['fault']} | {c['frames']} | {c['frames_after']} "
            f"| {c['outages']} | {c['reopens']} | {c['stalls']} | {c['detect_s'] if c['detect_s'] is not None else '-'} "
            f"| {c['recover_s'] if c['recover_s'] is not None else '-'} | {seen} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, json_flag=True)
    ap.add_argument("--kind", action="append", choices=list(source_faults.KINDS))
    ap.add_argument("--codec", action="append", choices=["h264", "h265", "mjpeg"])
    ap.add_argument("--transport", action="append", choices=["tcp", "udp", "http"])
    ap.add_argument("--fault", action="append", choices=list(source_faults.FAULTS))
    args = parse(ap, argv)
    cells = []
    with progress_on_stderr(args.json):
        for kind in args.kind or source_faults.KINDS:
            codecs, transports = source_faults.KIND_AXES[kind]
            for codec in [c for c in codecs if not args.codec or c in args.codec]:
                for transport in [t for t in transports if not args.transport or t in args.transport]:
                    for fault in args.fault or source_faults.FAULTS:
                        print(f"{kind} {codec} {transport} {fault} ...", flush=True)
                        cells.append(source_faults.run_cell(codec, transport, fault, kind=kind).row())
    print_doc({"cells": cells}, args.json, render)
    return 0


if __name__ == "__main__":
    run(main)
