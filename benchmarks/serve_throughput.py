"""Serve throughput: 1, 4 and 16 concurrent gRPC clients, dynamic batching on and off (req/s, p50/p99).

Each client is a thread with its own tritonclient gRPC connection that sends one request,
waits for its answer and sends the next, ``--requests`` times.  The server is ``edgekit serve``
in its own process (as deployed), started once per batching setting: ``--max-batch off`` and
``--max-batch N`` (``--max-queue-delay-ms`` as given, 0 by default: a batch takes only the
requests already waiting).  The queue is made deep enough for every client, so no request is
refused; a refusal would be counted, not retried.

The request is the model's own preprocessed input (``--kind tensor``, to ``NAME``) or a
640x480 JPEG (``--kind image``, to ``NAME-image``: decoded and preprocessed in the server
on each request's own thread, then one batched inference).  Every answer is checked against the
in-process one; the mean batch is the server's own count (``/metrics``: requests, and camera
frames with ``--cameras``, answered per inference; the clients' first, warming calls included).  Batching needs an artifact with a free batch dimension (``edgekit build``
exports ONNX and OpenVINO so); with a fixed batch both settings serve one at a time.

``--cameras N`` runs N synthetic 640x480 30 fps cameras beside the clients (``edgekit serve
--source synthetic:640x480@30``, repeated): their frames share the model and its batches with
the requests.  Each row then also says the cameras' frames while its clients ran (from the
server's ``--records``, by capture time): their latency p99 against the frame budget
(``--budget``, default the bundle's), the frames that missed it and those the cameras' slots
dropped.  The request p99 is to be read against the server's ``--deadline`` (``--deadline S``
passes one; 10 s unless given): the worker takes the earliest deadline first, so frames (capture
time plus budget) go ahead of requests that may wait longer, and a request still waiting at its
deadline is answered an error (counted as refused).

    .venv/bin/python -m benchmarks.serve_throughput [BUNDLE] [--clients 1,4,16] [--requests 200]
        [--max-batch 8] [--max-queue-delay-ms 0] [--kind tensor|image] [--cameras 4] [--budget MS]
        [--deadline S] [--json]
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._harness import bundle_of, parse, parser, print_doc, progress_on_stderr, run
from benchmarks.serve_overhead import chelsea_jpeg
from edgekit.core.stats import percentile

READY = re.compile(r"ready: .* on https?://\S+?:(\d+)/v2 and grpc \S+?:(\d+)")


def start_server(bundle: Path, device: str, *args: str) -> tuple[subprocess.Popen[str], int, int]:
    """``edgekit serve BUNDLE ARGS`` in its own process, once ready; its HTTP and gRPC ports."""
    proc = subprocess.Popen(
        [*(sys.executable, "-m", "edgekit.cli", "serve", str(bundle), "--device", device), *args],
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


def clients(port: int, n: int, requests: int, name: str, make_inputs: Any, check: Any) -> dict[str, Any]:
    """``n`` clients, ``requests`` each, all at once: req/s, latency p50/p99 (ms), refusals."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    times: list[list[float]] = [[] for _ in range(n)]
    refused = [0] * n
    start = threading.Barrier(n + 1)
    wrong: list[str] = []

    def client(i: int) -> None:
        conn = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        inputs = make_inputs(grpcclient)
        try:
            check(conn.infer(name, inputs))  # a connection's first call sets it up: not its speed
        except InferenceServerException:
            refused[i] += 1  # refused or late (cameras ahead of it): counted, and the run goes on
        except SystemExit as err:  # a thread drops SystemExit without a word: the run must not
            wrong.append(str(err))
        finally:
            start.wait()  # a client that failed must not hold the others at the start
        for _ in range(requests):
            t0 = time.perf_counter()
            try:
                conn.infer(name, inputs)
            except InferenceServerException:
                refused[i] += 1
                continue
            times[i].append(time.perf_counter() - t0)
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0, began = time.perf_counter(), time.time()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if wrong:
        raise SystemExit(wrong[0])
    ms = sorted(x * 1e3 for per in times for x in per)
    return {
        "window": (began, time.time()),
        "clients": n,
        "answered": len(ms),
        "refused": sum(refused),
        "req_per_s": round(len(ms) / wall, 1),
        "p50_ms": round(percentile(ms, 50), 2) if ms else None,
        "p99_ms": round(percentile(ms, 99), 2) if ms else None,
    }


def inferences(http_port: int) -> tuple[int, int]:
    """The server's (inferences, requests and camera frames they answered) so far, from /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    counts = dict(re.findall(r"^(edgekit_serve_\w+_total) (\d+)$", text, re.M))
    answered = int(counts["edgekit_serve_batched_requests_total"])
    return int(counts["edgekit_serve_inferences_total"]), answered + int(
        counts.get("edgekit_serve_camera_frames_total", 0)
    )


def camera_frames(records: Path, window: tuple[float, float]) -> dict[str, Any]:
    """The cameras' frames captured in ``window`` (wall clock): latency p99, missed, dropped."""
    rows = []
    for line in records.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if window[0] <= r["captured_at"] <= window[1]:
            rows.append(r)
    ms = sorted(r["latency_ms"] for r in rows)
    return {
        "cam_frames": len(rows),
        "cam_p99_ms": round(percentile(ms, 99), 2) if ms else None,
        "cam_missed": sum(1 for r in rows if not r["met"]),
        "cam_dropped": sum(r["dropped_before"] for r in rows),
    }


def bench(
    bundle: Path,
    device: str,
    counts: list[int],
    requests: int,
    max_batch: int,
    delay_ms: float,
    kind: str,
    cameras: int = 0,
    budget_ms: float | None = None,
    deadline_s: float | None = None,
) -> dict[str, Any]:
    import cv2

    import edgekit

    model = edgekit.load(bundle, device=device)
    jpeg = chelsea_jpeg()
    frame = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert frame is not None
    x = np.array(model.preprocessor()(frame))
    spec, out = model.session.inputs[0].name, model.session.outputs[0].name
    datatype = {"float32": "FP32", "uint8": "UINT8", "int8": "INT8"}[x.dtype.name]
    if kind == "tensor":
        name, want = model.name, model.session.run(x)[0]

        def make_inputs(module: Any) -> list[Any]:
            inp = module.InferInput(spec, list(x.shape), datatype)
            inp.set_data_from_numpy(x)
            return [inp]

        def check(result: Any) -> None:
            if not np.allclose(result.as_numpy(out), want, rtol=1e-4, atol=1e-5):
                raise SystemExit("the served output differs from the in-process one")
    else:
        name, labels = f"{model.name}-image", [lb.name for lb in model.classify(frame)]

        def make_inputs(module: Any) -> list[Any]:
            inp = module.InferInput("IMAGE", [1], "BYTES")
            inp.set_data_from_numpy(np.array([jpeg], dtype=object))
            return [inp]

        def check(result: Any) -> None:
            if [n.decode() for n in result.as_numpy("LABEL_NAMES")] != labels:
                raise SystemExit("the served labels differ from the in-process ones")

    rows = []
    queue = str(max(counts) + 4)
    work = Path(tempfile.mkdtemp(prefix="serve-throughput-"))
    for setting in ("off", str(max_batch)):
        records = work / f"records-{setting}.jsonl"
        beside = [a for _ in range(cameras) for a in ("--source", "synthetic:640x480@30")]
        if cameras:
            beside += ["--records", str(records)] + (["--budget", str(budget_ms)] if budget_ms else [])
        args = [
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--queue",
            queue,
            "--max-batch",
            setting,
            "--max-queue-delay-ms",
            str(delay_ms),
            *(["--deadline", str(deadline_s)] if deadline_s else []),
            *beside,
        ]
        proc, http_port, port = start_server(bundle, device, *args)
        try:
            for n in counts:
                print(f"batching {setting}: {n} client(s)...", flush=True)
                before = inferences(http_port)
                row = clients(port, n, requests, name, make_inputs, check)
                runs, answered = (a - b for a, b in zip(inferences(http_port), before, strict=True))
                row["mean_batch"] = round(answered / runs, 2) if runs else None
                rows.append({"max_batch": setting, **row})
        finally:
            proc.terminate()  # SIGTERM: the cameras stop and their records are written out
            proc.wait(30)
        for row in rows:
            window = row.pop("window", None)
            if cameras and window is not None:  # this setting's rows: their cameras' frames
                row.update(camera_frames(records, window))
    return {
        "model": model.name,
        "candidate": model.candidate,
        "batchable": model.session.batchable,
        "kind": kind,
        "requests_per_client": requests,
        "max_queue_delay_ms": delay_ms,
        "deadline_s": deadline_s or 10.0,
        "cameras": cameras,
        "budget_ms": budget_ms or model.manifest.device.budget_ms,
        "rows": rows,
    }


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"{doc['model']} on {doc['candidate']} ({'free batch' if doc['batchable'] else 'fixed batch of one'}), "
        f"{doc['kind']} requests over gRPC, {doc['requests_per_client']} per client, "
        f"max queue delay {doc['max_queue_delay_ms']} ms, request deadline {doc.get('deadline_s', 10.0):g} s"
        + (
            f"; {doc['cameras']} synthetic 30 fps camera(s) beside them, frame budget {doc['budget_ms']:g} ms"
            if doc.get("cameras")
            else ""
        ),
        f"{'max batch':>10s}{'clients':>9s}{'req/s':>10s}{'p50 ms':>10s}{'p99 ms':>10s}{'mean batch':>12s}"
        f"{'refused':>9s}"
        + (f"{'frames':>8s}{'frame p99':>11s}{'missed':>8s}{'dropped':>9s}" if doc.get("cameras") else ""),
    ]
    for r in doc["rows"]:
        line = (
            f"{r['max_batch']:>10s}{r['clients']:9d}{r['req_per_s']:10.1f}"
            f"{r['p50_ms'] or 0:10.2f}{r['p99_ms'] or 0:10.2f}{r['mean_batch'] or 0:12.2f}{r['refused']:9d}"
        )
        if doc.get("cameras"):
            line += (
                f"{r['cam_frames']:8d}{r['cam_p99_ms'] or 0:11.2f}{r['cam_missed']:8d}{r['cam_dropped']:9d}"
            )
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, bundle=True, json_flag=True)
    ap.add_argument("--clients", default="1,4,16", help="concurrent clients per row, comma-separated")
    ap.add_argument("--requests", type=int, default=200, help="requests each client sends")
    ap.add_argument("--max-batch", type=int, default=8, help="the batched setting's --max-batch")
    ap.add_argument("--max-queue-delay-ms", type=float, default=0.0, help="the server's --max-queue-delay-ms")
    ap.add_argument("--kind", choices=("tensor", "image"), default="tensor", help="what each request sends")
    ap.add_argument("--cameras", type=int, default=0, help="synthetic 30 fps cameras beside the clients")
    ap.add_argument("--budget", type=float, default=None, help="the cameras' frame budget, ms")
    ap.add_argument("--deadline", type=float, default=None, help="the server's --deadline, s (10)")
    args = parse(ap, argv)
    counts = [int(c) for c in args.clients.split(",")]
    with progress_on_stderr(args.json):
        doc = bench(
            bundle_of(args),
            args.device,
            counts,
            args.requests,
            args.max_batch,
            args.max_queue_delay_ms,
            args.kind,
            args.cameras,
            args.budget,
            args.deadline,
        )
    print_doc(doc, args.json, render)
    return 0


if __name__ == "__main__":
    run(main)
