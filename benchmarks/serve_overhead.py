"""Serve overhead: one request in process, over gRPC, HTTP binary and HTTP JSON, side by side (p50/p99).

Two requests, each sent one at a time (no concurrency: the latency of one request):

- **224x224 tensor**: the reference classifier's own input (its preprocessed tensor), to
  ``NAME``: in process ``model.session.run(x)``; remotely the same tensor to ``edgekit serve``.
- **640x480 JPEG**: a camera-sized JPEG (scikit-image's chelsea, resized) to ``NAME-image``:
  in process ``model.classify(cv2.imdecode(jpeg))``; over gRPC and HTTP binary the file's bytes
  (input ``IMAGE``, BYTES).  HTTP JSON cannot carry a JPEG (BYTES in JSON are UTF-8 strings), so
  its row sends the decoded frame as a UINT8 [480, 640, 3] tensor in JSON: what JSON costs for a
  picture.

The server is ``edgekit serve`` in its own process (as deployed), the clients tritonclient's
(HTTP: geventhttpclient; gRPC: grpcio), one connection each, reused.  Modes are measured in
alternating rounds so each sees the same machine.  Every mode's answer is checked against the
in-process one (labels, or the output tensor).  The seed's claim, "binary RPC ~40 % lower
latency than JSON over HTTP", is checked on the tensor row: 1 - gRPC p50 / HTTP JSON p50.

    .venv/bin/python -m benchmarks.serve_overhead [BUNDLE] [--requests 300] [--rounds 3] [--json]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._harness import bundle_of, parse, parser, print_doc, progress_on_stderr, run
from edgekit.core.stats import percentile

MODES = ("in-process", "gRPC", "HTTP binary", "HTTP JSON")
STAGES = ("queue", "decode", "preprocess", "infer", "postprocess", "request")
#: (model, stage) -> [seconds, count], as /metrics' histograms sum them.
Sums = dict[tuple[str, str], list[float]]
READY = re.compile(r"ready: .* on https?://\S+?:(\d+)/v2 and grpc \S+?:(\d+)")


def start_server(bundle: Path, device: str) -> tuple[subprocess.Popen[str], int, int]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgekit.cli",
            "serve",
            str(bundle),
            "--device",
            device,
            "--queue",
            "4",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=os.environ.copy(),
    )
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        m = READY.search(line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr or ()], daemon=True).start()
            return proc, int(m[1]), int(m[2])
    raise SystemExit("edgekit serve did not start:\n" + "".join(lines))


def chelsea_jpeg() -> bytes:
    import cv2
    from skimage import data

    cat = data.chelsea()  # type: ignore[no-untyped-call]
    frame = cv2.resize(cv2.cvtColor(cat, cv2.COLOR_RGB2BGR), (640, 480), interpolation=cv2.INTER_AREA)
    ok, jpeg = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return jpeg.tobytes()


def decode(jpeg: bytes) -> np.ndarray:
    import cv2

    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None
    return image


def _ms(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    return {
        "p50_ms": percentile(s, 50) * 1e3,
        "p99_ms": percentile(s, 99) * 1e3,
        "mean_ms": sum(s) / len(s) * 1e3,
        "n": len(s),
    }


def warm(calls: dict[str, Callable[[], Any]]) -> None:
    """Connections opened, the runtime's and the resizer's first calls (a JIT compile) made."""
    for call in calls.values():
        for _ in range(10):
            call()


def measure(
    calls: dict[str, Callable[[], Any]], requests: int, rounds: int, scrape: Callable[[], Sums]
) -> dict[str, dict[str, Any]]:
    """Each mode's client-side latency, and its server-side mean per stage (``/metrics`` read
    before and after each of its blocks, so each mode's server time is its own)."""
    times: dict[str, list[float]] = {m: [] for m in calls}
    server: dict[str, dict[str, list[float]]] = {m: {} for m in calls}  # mode -> stage -> [s, n]
    per_round = max(requests // rounds, 1)
    for _ in range(rounds):
        for mode, call in calls.items():
            before = scrape()
            for _ in range(per_round):
                t = time.perf_counter()
                call()
                times[mode].append(time.perf_counter() - t)
            for key, (total, count) in stage_diff(before, scrape()).items():
                acc = server[mode].setdefault(key[1], [0.0, 0.0])
                acc[0] += total
                acc[1] += count
    out: dict[str, dict[str, Any]] = {}
    for mode, values in times.items():
        stages = {stage: total / count * 1e3 for stage, (total, count) in server[mode].items() if count}
        out[mode] = {**_ms(values), "server_mean_ms": stages}
    return out


STAGE_LINE = re.compile(r'edgekit_serve_stage_seconds_(sum|count)\{model="([^"]+)",stage="(\w+)"\} (\S+)')


def stage_sums(http_port: int) -> Sums:
    """(model, stage) -> [seconds, count] so far, from /metrics' histograms."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode()
    sums: Sums = {}
    for m in STAGE_LINE.finditer(text):
        sums.setdefault((m[2], m[3]), [0.0, 0.0])[m[1] == "count"] = float(m[4])
    return sums


def stage_diff(before: Sums, after: Sums) -> Sums:
    """(model, stage) -> [seconds, count] between two scrapes."""
    out: Sums = {}
    for key, (total, count) in after.items():
        total0, count0 = before.get(key, [0.0, 0.0])
        if count > count0:
            out[key] = [total - total0, count - count0]
    return out


def bench(bundle: Path, device: str, requests: int, rounds: int) -> dict[str, Any]:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    import edgekit

    jpeg = chelsea_jpeg()
    model = edgekit.load(bundle, device=device)
    proc, http_port, grpc_port = start_server(bundle, device)
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        name, out = model.name, model.session.outputs[0].name
        frame = decode(jpeg)
        x = model.preprocessor()(frame)
        datatype = {"float32": "FP32", "uint8": "UINT8", "int8": "INT8"}[x.dtype.name]
        spec = model.session.inputs[0].name
        want = model.session.run(x)[0]
        labels = [lb.name for lb in model.classify(frame)]

        def tensor_http(binary: bool) -> Callable[[], Any]:
            inp = httpclient.InferInput(spec, list(x.shape), datatype)
            inp.set_data_from_numpy(x, binary_data=binary)
            outs = [httpclient.InferRequestedOutput(out, binary_data=binary)]
            return lambda: http.infer(name, [inp], outputs=outs).as_numpy(out)

        g_inp = grpcclient.InferInput(spec, list(x.shape), datatype)
        g_inp.set_data_from_numpy(x)
        tensor_calls: dict[str, Callable[[], Any]] = {
            "in-process": lambda: model.session.run(x)[0],
            "gRPC": lambda: grpc.infer(name, [g_inp]).as_numpy(out),
            "HTTP binary": tensor_http(True),
            "HTTP JSON": tensor_http(False),
        }
        for mode, call in tensor_calls.items():
            if not np.allclose(call(), want, rtol=1e-5, atol=1e-6):
                raise SystemExit(f"{mode}: the output differs from the in-process one")

        image = f"{name}-image"
        h_img = httpclient.InferInput("IMAGE", [1], "BYTES")
        h_img.set_data_from_numpy(np.array([jpeg], dtype=object), binary_data=True)
        h_frame = httpclient.InferInput("IMAGE", list(frame.shape), "UINT8")
        h_frame.set_data_from_numpy(frame, binary_data=False)
        g_img = grpcclient.InferInput("IMAGE", [1], "BYTES")
        g_img.set_data_from_numpy(np.array([jpeg], dtype=object))
        json_outs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("LABEL_NAMES", "SCORES")]

        def names(result: Any) -> list[str]:
            return [n.decode() if isinstance(n, bytes) else str(n) for n in result.as_numpy("LABEL_NAMES")]

        image_calls: dict[str, Callable[[], Any]] = {
            "in-process": lambda: [lb.name for lb in model.classify(decode(jpeg))],
            "gRPC": lambda: names(grpc.infer(image, [g_img])),
            "HTTP binary": lambda: names(http.infer(image, [h_img])),
            "HTTP JSON": lambda: names(http.infer(image, [h_frame], outputs=json_outs)),
        }
        for mode, call in image_calls.items():
            if call() != labels:
                raise SystemExit(f"{mode}: labels {call()} differ from the in-process {labels}")

        print(f"measuring {name} on {model.candidate}: {requests} requests per mode and row", file=sys.stderr)
        warm(tensor_calls)
        warm(image_calls)

        def scrape() -> Sums:
            return stage_sums(http_port)

        rows: list[dict[str, Any]] = [
            {
                "request": f"tensor {list(x.shape)} {datatype}",
                **measure(tensor_calls, requests, rounds, scrape),
            },
            {"request": "640x480 JPEG (image request)", **measure(image_calls, requests, rounds, scrape)},
        ]
    finally:
        proc.terminate()
        proc.wait(30)
        model.close()
    t = rows[0]
    claim = 1 - t["gRPC"]["p50_ms"] / t["HTTP JSON"]["p50_ms"]
    return {
        "bundle": str(bundle),
        "model": name,
        "candidate": model.candidate,
        "labels": labels,
        "requests": requests,
        "rounds": rounds,
        "rows": rows,
        "grpc_vs_http_json_p50": claim,
        "grpc_vs_http_binary_p50": 1 - t["gRPC"]["p50_ms"] / t["HTTP binary"]["p50_ms"],
    }


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"{doc['model']} on {doc['candidate']}, one request at a time, {doc['requests']} per mode "
        f"({doc['rounds']} alternating rounds); ms",
        f"{'request':32s}" + "".join(f"{m:>22s}" for m in MODES),
        f"{'':32s}" + "".join(f"{'p50':>11s}{'p99':>11s}" for _ in MODES),
    ]
    for r in doc["rows"]:
        lines.append(
            f"{r['request']:32s}" + "".join(f"{r[m]['p50_ms']:11.2f}{r[m]['p99_ms']:11.2f}" for m in MODES)
        )
    lines += [
        "",
        f"gRPC vs HTTP JSON, tensor p50: {doc['grpc_vs_http_json_p50']:+.0%} lower latency "
        f"(the seed's claim: ~40 %); gRPC vs HTTP binary: {doc['grpc_vs_http_binary_p50']:+.0%}",
        "",
        "server side, mean ms per request (from /metrics); outside: client mean minus the server's request",
        f"{'request':32s}{'mode':>12s}" + "".join(f"{st:>12s}" for st in (*STAGES, "outside")),
    ]
    for r in doc["rows"]:
        for m in MODES[1:]:
            st = r[m]["server_mean_ms"]
            cells = [st.get(k) for k in STAGES]
            outside = r[m]["mean_ms"] - st["request"] if "request" in st else None
            lines.append(
                f"{r['request']:32s}{m:>12s}"
                + "".join(f"{'-':>12s}" if v is None else f"{v:12.2f}" for v in (*cells, outside))
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, bundle=True, json_flag=True)
    ap.add_argument("--requests", type=int, default=300, help="requests per mode and row")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds the requests are split into")
    args = parse(ap, argv)
    with progress_on_stderr(args.json):
        doc = bench(bundle_of(args), args.device, args.requests, args.rounds)
    print_doc(doc, args.json, render)
    return 0


if __name__ == "__main__":
    run(main)
