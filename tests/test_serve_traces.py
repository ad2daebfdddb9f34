"""``edgekit serve --trace``: each kept request is a span continuing its caller's ``traceparent``, one child per stage.

Real clients (tritonclient over gRPC and HTTP) against the real server, its spans received by
the OTLP receivers of tests/otlp_receiver.py and checked span by span.  Which requests are kept
is decided by the frame tracer's sampler: here with no share and no window's slowest, so the
kept ones are exactly those a caller sampled and those that failed.  "The model is busy" is a
gate the test holds shut (tests/test_serve_batching.py's ``Gate``), so that requests meet in
one batch because the test held the worker, not because this machine is slow.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tiny_detector as td
from otlp_receiver import GrpcReceiver, HttpReceiver, Receiver, Span
from served import serving
from test_serve_batching import Gate, frame, inputs, tensor, wait_for_depth

import edgekit
from edgekit.bundle import generate_keypair
from edgekit.selection.choice_cache import manifest_sha256
from edgekit.serve import Batching, Limits, ServeOptions, start
from edgekit.telemetry import trace_requests
from edgekit.telemetry.request_tracing import RequestRecord
from edgekit.telemetry.trace_sampler import TailSampler

from conftest import ROOT

grpcclient = pytest.importorskip(
    "tritonclient.grpc", reason="tritonclient is not installed (pip install -e '.[dev]')"
)
httpclient = pytest.importorskip(
    "tritonclient.http", reason="tritonclient is not installed (pip install -e '.[dev]')"
)
from tritonclient.utils import InferenceServerException  # noqa: E402

NAME = "tiny-classifier"
IMAGE = f"{NAME}-image"
#: A picture request's stages, in the order they run.
STAGES = ["receive", "decode", "preprocess", "queue", "infer", "postprocess", "respond"]
SERVER = 2  # SPAN_KIND_SERVER
ERROR = 2  # STATUS_CODE_ERROR
#: The caller's trace and span in the serve guide's curl example.
GUIDE_TRACE, GUIDE_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    keys = generate_keypair(tmp_path_factory.mktemp("keys") / "signer")
    out = tmp_path_factory.mktemp("cls") / "tiny-batch"
    return td.classifier_bundle(out, keys[0], free_batch=True), keys[1]


@pytest.fixture
def model(bundle: tuple[Path, Path]) -> Iterator[edgekit.Model]:
    with edgekit.load(bundle[0], device="x86_64-cpu", trusted_keys=[bundle[1]], measure=False) as m:
        yield m


@pytest.fixture(params=[HttpReceiver, GrpcReceiver], ids=["otlp-http", "otlp-grpc"])
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    r = request.param()
    try:
        yield r
    finally:
        r.close()


def traceparent(sampled: bool = True) -> tuple[str, str, str]:
    """A caller's (traceparent, trace id, span id)."""
    tid, sid = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{tid}-{sid}-{'01' if sampled else '00'}", tid, sid


def picture(seed: int) -> Any:
    inp = grpcclient.InferInput("IMAGE", [1], "BYTES")
    inp.set_data_from_numpy(np.array([frame(seed)], dtype=object))
    return inp


def http_picture(seed: int) -> Any:
    inp = httpclient.InferInput("IMAGE", [1], "BYTES")
    inp.set_data_from_numpy(np.array([frame(seed)], dtype=object), binary_data=True)
    return inp


def request_of(spans: list[Span]) -> tuple[Span, list[Span]]:
    """A trace's one request span and its children, in the order they ran."""
    roots = [s for s in spans if s.name == "request"]
    assert len(roots) == 1, [s.name for s in spans]
    root = roots[0]
    children = sorted((s for s in spans if s is not root), key=lambda s: s.start_ns)
    assert all(c.parent_span_id == root.span_id for c in children)
    return root, children


def consecutive(root: Span, children: list[Span]) -> None:
    """The stages run one after the other, from the request span's start to its end."""
    at = root.start_ns
    for c in children:
        assert c.start_ns == at, c.name
        at = c.end_ns
    assert abs(at - root.end_ns) <= len(children)  # rounding to whole ns, one per stage at most


def resource_is(span: Span, model: edgekit.Model, service: str, device: str) -> None:
    assert span.resource["service.name"] == service
    assert span.resource["device.id"] == device
    assert span.resource["edgekit.device.profile"] == model.manifest.device.profile
    assert span.resource["edgekit.bundle.sha256"] == manifest_sha256(model.root)
    assert span.resource["edgekit.model.name"] == NAME


def post_json(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_each_kept_request_continues_its_callers_trace_with_one_span_per_stage(
    model: edgekit.Model, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "door-server")
    # No share and no window's slowest: kept are exactly the callers' sampled traces and the failures.
    tracer = trace_requests(
        model,
        endpoint=receiver.endpoint,
        protocol=receiver.protocol,
        device_id="cam-7",
        ratio=0.0,
        slowest=0,
        max_per_s=1000.0,
    )
    assert tracer is not None
    gate = Gate(model.session.run)
    model.session.run = gate  # type: ignore[method-assign]
    running = start(
        model, ServeOptions(http_port=0, grpc_port=0, batching=Batching(8), limits=Limits(), tracer=tracer)
    )
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
    http = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}", concurrency=2)
    held_tp, held_tid, _ = traceparent(sampled=False)
    callers = {p: traceparent() for p in ("grpc-1", "grpc-2", "http")}
    try:
        with ThreadPoolExecutor(4) as pool:
            # The worker holds a request whose caller did not sample it; three sampled ones queue behind.
            held = pool.submit(grpc.infer, NAME, [tensor(inputs(0))], headers={"traceparent": held_tp})
            assert gate.entered.wait(30)
            waiting = [
                pool.submit(grpc.infer, IMAGE, [picture(1)], headers={"traceparent": callers["grpc-1"][0]}),
                pool.submit(grpc.infer, IMAGE, [picture(2)], headers={"traceparent": callers["grpc-2"][0]}),
                pool.submit(
                    http.infer, IMAGE, [http_picture(3)], headers={"traceparent": callers["http"][0]}
                ),
            ]
            wait_for_depth(running, 3)
            gate.open.set()
            held.result(30)
            for f in waiting:
                f.result(30)
        # No traceparent, and refused (no such input): kept for its error, in a trace of its own.
        bad = {"inputs": [{"name": "nope", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
        assert post_json(f"http://127.0.0.1:{running.http_port}/v2/models/{NAME}/infer", bad) == 400
        # No traceparent, answered: not kept (no share), whatever it cost.
        grpc.infer(NAME, [tensor(inputs(4))])
    finally:
        running.stop()  # the server closes its tracer: what is queued is exported
        http.close()
    traces = receiver.traces()
    caller_tids = {tid for _, tid, _ in callers.values()}
    assert caller_tids <= set(traces) and held_tid not in traces
    own = set(traces) - caller_tids
    assert len(own) == 1  # the refused one, in a new trace
    for protocol, (_, tid, sid) in callers.items():
        root, children = request_of(traces[tid])
        assert root.parent_span_id == sid and root.kind == SERVER
        assert [c.name for c in children] == STAGES
        consecutive(root, children)
        assert root.attributes["edgekit.model"] == IMAGE
        assert root.attributes["edgekit.protocol"] == protocol.split("-")[0]
        assert root.attributes["edgekit.outcome"] == "ok"
        assert root.attributes["edgekit.kept_for"] == "sampled"
        assert root.attributes["edgekit.batch"] == 3  # the three waited together: one inference
        assert root.status != ERROR
        resource_is(root, model, "door-server", "cam-7")
    root, children = request_of(traces[own.pop()])
    assert root.parent_span_id == "" and root.kind == SERVER
    assert root.attributes["edgekit.outcome"] == "invalid" and root.attributes["edgekit.model"] == NAME
    assert root.attributes["edgekit.kept_for"] == "missed" and root.status == ERROR
    assert [c.name for c in children] == ["receive"]  # refused before it was queued
    assert tracer.sampler.counts.to_dict() == {
        "frames": 6,
        "missed": 1,
        "slowest": 0,
        "sampled": 3,
        "over_cap": 0,
    }


def test_busy_and_late_requests_are_kept_with_their_outcome(model: edgekit.Model) -> None:
    receiver = GrpcReceiver()
    tracer = trace_requests(model, endpoint=receiver.endpoint, protocol="grpc", ratio=0.0, slowest=0)
    assert tracer is not None
    gate = Gate(model.session.run)
    model.session.run = gate  # type: ignore[method-assign]
    running = start(model, ServeOptions(http_port=0, grpc_port=0, limits=Limits(queue_size=1), tracer=tracer))
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
    late_tp, late_tid, _ = traceparent(sampled=False)
    busy_tp, busy_tid, _ = traceparent(sampled=False)
    try:
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(grpc.infer, NAME, [tensor(inputs(0))])
            assert gate.entered.wait(30)
            # Queued behind the held one with a deadline of its client's: still waiting when it passes.
            late = pool.submit(
                grpc.infer, NAME, [tensor(inputs(1))], client_timeout=0.5, headers={"traceparent": late_tp}
            )
            wait_for_depth(running, 1)
            # The queue (one place) is full: answered busy at once.
            with pytest.raises(InferenceServerException, match="busy"):
                grpc.infer(NAME, [tensor(inputs(2))], headers={"traceparent": busy_tp})
            with pytest.raises(InferenceServerException, match="Deadline"):
                late.result(30)  # the client gave up; the worker is still held
            gate.open.set()
            held.result(30)
    finally:
        running.stop()
        receiver.close()
    traces = receiver.traces()
    assert set(traces) == {late_tid, busy_tid}  # failures, though their callers did not sample them
    late_root, late_stages = request_of(traces[late_tid])
    assert late_root.attributes["edgekit.outcome"] == "deadline" and late_root.status == ERROR
    assert [c.name for c in late_stages] == ["receive", "queue", "respond"]  # never computed
    busy_root, busy_stages = request_of(traces[busy_tid])
    assert busy_root.attributes["edgekit.outcome"] == "busy" and busy_root.status == ERROR
    assert [c.name for c in busy_stages] == ["receive", "respond"]  # never queued
    assert {r.attributes["edgekit.kept_for"] for r in (late_root, busy_root)} == {"missed"}


def test_a_quiet_servers_slowest_request_is_exported_within_its_window(model: edgekit.Model) -> None:
    receiver = HttpReceiver()
    tracer = trace_requests(
        model, endpoint=receiver.endpoint, protocol="http/protobuf", ratio=0.0, slowest=1, window_s=0.5
    )
    assert tracer is not None
    running = start(model, ServeOptions(http_port=0, grpc_port=0, tracer=tracer))
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
    try:
        grpc.infer(NAME, [tensor(inputs(0))])
        # No other request comes: the window closes on the tracer's clock, not at the next request.
        assert receiver.wait_for(lambda: len(receiver.traces()) == 1)
        (spans,) = receiver.traces().values()
        root, children = request_of(spans)
        assert root.attributes["edgekit.kept_for"] == "slowest" and root.parent_span_id == ""
        assert [c.name for c in children] == ["receive", "queue", "infer", "respond"]
    finally:
        running.stop()
        receiver.close()


def test_the_requests_sampler_is_the_frames_with_the_callers_choice_under_the_cap() -> None:
    s: TailSampler[RequestRecord] = TailSampler("r", ratio=0.0, slowest=1, window_s=10.0, max_per_s=2.0)

    def rec(i: int, ms: float, *, met: bool = True) -> RequestRecord:
        return RequestRecord(i, 100.0 + i / 1000, ms, met, None, (("infer", ms),), {})

    kept = []
    for i in range(10):  # within 10 ms: the cap's burst (2) is all there is
        kept += s.offer(rec(i, 5.0 + i), trace_id=i + 1, wanted=i % 2 == 0)
    kept += s.offer(rec(10, 1.0, met=False), trace_id=11)
    assert [(k.record.index, k.reason) for k in kept] == [(0, "sampled"), (2, "sampled")]
    assert s.counts.over_cap == 3 + 1  # the other wanted ones and the failure, past the cap
    assert s.expire(100.0 + 9.9) == []  # the window is still open
    (slowest,) = s.expire(100.0 + 10.1)
    assert slowest.record.index == 9 and slowest.trace_id == 10 and slowest.reason == "slowest"


def test_edgekit_serve_trace_exports_as_the_environment_says(bundle: tuple[Path, Path]) -> None:
    receiver = GrpcReceiver()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_SERVICE_NAME": "line-3",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
    }
    grpc_tp, grpc_tid, grpc_sid = traceparent()
    http_tp, http_tid, http_sid = traceparent()
    try:
        with serving(
            bundle[0], "--key", str(bundle[1]), "--trace", "--device-id", "cam-9", env=env
        ) as served:
            grpcclient.InferenceServerClient(served.grpc).infer(
                IMAGE, [picture(1)], headers={"traceparent": grpc_tp}
            )
            http = httpclient.InferenceServerClient(served.http)
            http.infer(NAME, [_http_tensor(inputs(2))], headers={"traceparent": http_tp})
            http.close()
            # The serve guide's curl with a traceparent, as written but for the address and model.
            guide = (ROOT / "docs" / "guides" / "serve.md").read_text()
            block = guide.split("## Traces", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
            script = block.replace("127.0.0.1:8000", served.http).replace("efficientnet-lite0", NAME)
            r = subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout)["model_name"] == IMAGE
        # Stopped (SIGTERM): the server flushed its traces before it exited.
        traces = receiver.traces()
    finally:
        receiver.close()
    assert {grpc_tid, http_tid, GUIDE_TRACE} <= set(traces)
    for tid, sid, stages in (
        (grpc_tid, grpc_sid, STAGES),
        (http_tid, http_sid, ["receive", "queue", "infer", "respond"]),
        (GUIDE_TRACE, GUIDE_SPAN, STAGES),
    ):
        root, children = request_of(traces[tid])
        assert root.parent_span_id == sid
        assert [c.name for c in children] == stages
        assert root.resource["service.name"] == "line-3"
        assert root.resource["deployment.environment"] == "test"
        assert root.resource["device.id"] == "cam-9"
        assert root.resource["edgekit.bundle.sha256"] == manifest_sha256(bundle[0])


def _http_tensor(x: np.ndarray) -> Any:
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    return inp


def test_with_no_endpoint_serve_trace_serves_and_warns_once(bundle: tuple[Path, Path]) -> None:
    env = {k: "" for k in os.environ if k.startswith("OTEL_EXPORTER_OTLP")}  # set for the host: unset here
    with serving(bundle[0], "--key", str(bundle[1]), "--trace", env=env) as served:
        result = grpcclient.InferenceServerClient(served.grpc).infer(NAME, [tensor(inputs(0))])
        assert result.as_numpy("logits") is not None
    log = "".join(served.stderr)
    assert log.count("no OTLP endpoint configured") == 1
    assert "Traceback" not in log and "ERROR" not in log and "Failed to export" not in log
