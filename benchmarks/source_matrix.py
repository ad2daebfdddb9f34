"""The source matrix: codec x transport x fault against a real RTSP camera, and what edgekit made of each.

    .venv/bin/python -m benchmarks.source_matrix [--codec h264 --codec h265] [--transport tcp ...] [--json]

Each cell starts a camera (gst-rtsp-server on loopback, tests/rtsp_server.py), reads it as a
pipeline's capture thread does, and does one fault on the camera's side: the server killed
for 3 s, the stream paused 4 s with its connection open, 10 % of the encoded frames dropped
for 3 s, the resolution changed, or wrong credentials.  tests/test_sources_rtsp.py asserts on
the same cells; this prints them as a table: frames, outages, reopens, stalls, the time to
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
    head = "| codec | transport | fault | frames | after | outages | reopens | stalls | detect s | recover s | sees |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for c in doc["cells"]:
        seen = c["error"] or c["sees"]
        lines.append(
            f"| {c['codec']} | {c['transport']} | {c['fault']} | {c['frames']} | {c['frames_after']} "
            f"| {c['outages']} | {c['reopens']} | {c['stalls']} | {c['detect_s'] if c['detect_s'] is not None else '-'} "
            f"| {c['recover_s'] if c['recover_s'] is not None else '-'} | {seen} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, json_flag=True)
    ap.add_argument("--codec", action="append", choices=["h264", "h265"])
    ap.add_argument("--transport", action="append", choices=["tcp", "udp"])
    ap.add_argument("--fault", action="append", choices=list(source_faults.FAULTS))
    args = parse(ap, argv)
    cells = []
    with progress_on_stderr(args.json):
        for codec in args.codec or ["h264", "h265"]:
            for transport in args.transport or ["tcp", "udp"]:
                for fault in args.fault or source_faults.FAULTS:
                    print(f"{codec} {transport} {fault} ...", flush=True)
                    cells.append(source_faults.run_cell(codec, transport, fault).row())
    print_doc({"cells": cells}, args.json, render)
    return 0


if __name__ == "__main__":
    run(main)
