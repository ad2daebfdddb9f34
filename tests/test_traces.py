"""OpenTelemetry traces of slow frames and of requests, received by an OTLP receiver and checked span by span."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import tiny_detector as td
from otlp_receiver import GrpcReceiver, HttpReceiver, Receiver, Span
from stand_in import SlowSession
from test_fleet_cameras import get, wait_for
from test_telemetry import Subscriber, validator

import edgekit
from edgekit.errors import TelemetryError
from edgekit.pipeline.records import FrameRecord
from edgekit.pipeline.sinks import sink
from edgekit.protocol.stages import STAGES
from edgekit.selection.choice_cache import manifest_sha256
from edgekit.telemetry import report, trace
from edgekit.telemetry.otel_export import Tracing
from edgekit.telemetry.trace_ids import frame_trace_id, ratio_keeps, trace_hex
from edgekit.telemetry.trace_sampler import TailSampler
from edgekit.testing.mosquitto import Mosquitto, free_port
from edgekit.testing.process import stop_process

from conftest import EDGEKIT, ROOT
from conftest import edgekit as run_cli

FRAMES = 12
SLOW_EVERY = 3  # every third inference is slow: a third of the frames miss their budget
SLOW_MS = 250.0
BUDGET_MS = 120.0  # a tiny classifier's frame takes a few ms; a slow one, SLOW_MS more
SHARE = 0.3  # of the frames on budget, the share traced in a run (by trace id: which ones is known)
FPS = 3.0  # paced like a camera, slower than a slow frame: no frame waits behind another


class SlowEvery(SlowSession):
    """A real session where every ``SLOW_EVERY``-th run also sleeps ``latency_ms``: misses on any machine."""

    def __init__(self, inner: Any, latency_ms: float) -> None:
        super().__init__(inner, latency_ms)
        self.runs = 0

    def _run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = self.inner.run(*arrays)
        self.runs += 1
        if self.runs % SLOW_EVERY == 0:
            time.sleep(self.latency_s)
        return out


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path]) -> Iterator[edgekit.Model]:
    bundle = td.classifier_bundle(tmp_path_factory.mktemp("cls") / "tiny", keys[0])
    with edgekit.load(bundle, device="x86_64-cpu", trusted_keys=[keys[1]]) as model:
        real = model.session
        model.session = SlowEvery(real, SLOW_MS)
        try:
            yield model
        finally:
            model.session = real


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("frames")
    for i in range(FRAMES):
        cv2.imwrite(str(out / f"{i:03d}.png"), td.square_frame(i % 4, (i // 4) % 4))
    return out


@pytest.fixture(params=[HttpReceiver, GrpcReceiver], ids=["http", "grpc"])
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    r = request.param()
    try:
        yield r
    finally:
        r.close()


def record(
    index: int, latency_ms: float, *, met: bool = True, at: float = 0.0, camera: str = ""
) -> FrameRecord:
    return FrameRecord(
        index=index,
        captured_at=at,
        captured_ns=0,
        deadline_ns=0,
        capture_wait_ms=0.0,
        preprocess_ms=0.0,
        inference_ms=latency_ms,
        postprocess_ms=0.0,
        sink_ms=0.0,
        latency_ms=latency_ms,
        met=met,
        dropped_before=0,
        candidate="c",
        camera=camera,
    )


# -- the sampler (no OpenTelemetry) ------------------------------------------------------------


def test_the_sampler_keeps_every_miss_each_windows_slowest_and_its_share_of_the_rest() -> None:
    s = TailSampler("s1", ratio=0.05, slowest=2, window_s=1.0, max_per_s=1000.0)
    kept = []
    n = 30 * 400  # 400 s at 30 fps
    for i in range(n):
        # Every 97th frame misses; latencies vary so that each second has its own two slowest.
        latency = 10.0 + (i * 7919 % 1000) / 100
        kept += s.offer(record(i, latency, met=i % 97 != 0, at=i / 30))
    kept += s.flush()
    reasons: dict[str, set[int]] = {}
    for k in kept:
        reasons.setdefault(k.reason, set()).add(k.record.index)
    assert reasons["missed"] == set(range(0, n, 97))
    assert sum(len(v) for v in reasons.values()) == len({k.record.index for k in kept})  # none twice
    # Each 1 s window's two slowest are kept (as slowest, or already for another reason).
    every = {k.record.index for k in kept}
    for second in range(n // 30):
        frames = range(second * 30, second * 30 + 30)
        two = sorted(frames, key=lambda i: (-(10.0 + (i * 7919 % 1000) / 100), i))[:2]
        assert set(two) <= every, second
    # The rest: a 5% share by trace id (binomial: 5 sigma either side over ~11,900 frames).
    rest = n - len(reasons["missed"])
    share = len(reasons.get("sampled", ())) / rest
    sigma = (0.05 * 0.95 / rest) ** 0.5
    assert abs(share - 0.05) < 5 * sigma, share
    # Derived ids: the same frame of the same session is kept or not the same way again.
    again = TailSampler("s1", ratio=0.05, slowest=0, window_s=1.0, max_per_s=1000.0)
    same = {k.record.index for i in range(600) for k in again.offer(record(i, 10.0, at=i / 30))}
    assert same == {i for i in range(600) if i in reasons.get("sampled", set())}


def test_the_cap_bounds_the_traces_kept_when_every_frame_misses() -> None:
    s = TailSampler("s2", ratio=0.0, slowest=1, window_s=5.0, max_per_s=4.0)
    kept = [k for i in range(30 * 60) for k in s.offer(record(i, 50.0, met=False, at=i / 30))]
    kept += s.flush()
    missed = [k for k in kept if k.reason == "missed"]
    # 60 s at 4 a second, plus a second's burst; each 5 s window's slowest on top (12 windows).
    assert 4 * 60 <= len(missed) <= 4 * 61 + 1
    assert len(kept) - len(missed) <= 12
    assert s.counts.over_cap == 30 * 60 - len(missed)


def test_a_bad_sampler_setting_or_protocol_is_refused() -> None:
    with pytest.raises(ValueError, match="ratio"):
        TailSampler("s", ratio=1.5)
    with pytest.raises(TelemetryError, match="OTLP protocol"):
        Tracing(protocol="http/json")


# -- frames of a real run, exported over OTLP -------------------------------------------------


def spans_of(traces: dict[str, list[Span]], trace_id: str) -> tuple[Span, dict[str, Span]]:
    spans = traces[trace_id]
    roots = [s for s in spans if not s.parent_span_id]
    assert len(roots) == 1 and roots[0].name == "frame"
    children = {s.name: s for s in spans if s.parent_span_id}
    assert all(s.parent_span_id == roots[0].span_id for s in children.values())
    return roots[0], children


def test_every_missed_frame_is_exported_with_its_stages_timed_from_its_record(
    classifier: edgekit.Model, folder: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Configured the standard way: the exporter reads the endpoint and protocol, the SDK the service.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", receiver.protocol)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "door-camera")
    records: list[FrameRecord] = []
    with edgekit.Pipeline(
        classifier, str(folder), budget_ms=BUDGET_MS, warm="off", realtime=True, fps=FPS
    ) as p:
        p.add_sink(sink("records", lambda r: records.append(r.record)))
        tracer = trace(p, device_id="cam-7", ratio=SHARE, window_s=3600.0)
        assert tracer is not None  # the environment names an endpoint
        p.run()
    assert len(records) == FRAMES
    missed = [r for r in records if not r.met]
    assert len(missed) >= FRAMES // SLOW_EVERY and len(missed) < FRAMES  # the slow ones, not all
    assert p.sinks.errors == {} and p.sinks.dropped == {}
    traces = receiver.traces()
    session = tracer.sampler.session
    # Kept: exactly the misses and, of the rest, those whose trace id the share keeps (the run's one
    # window's slowest is a miss; 3 fps is under the cap).
    tid = {r.index: frame_trace_id(session, "", r.index) for r in records}
    sampled = [r for r in records if r.met and ratio_keeps(tid[r.index], SHARE)]
    assert set(traces) == {trace_hex(tid[r.index]) for r in missed + sampled}
    for r in sampled:
        root, stages = spans_of(traces, trace_hex(tid[r.index]))
        assert root.attributes["edgekit.met"] is True and root.attributes["edgekit.kept_for"] == "sampled"
        assert root.ms == pytest.approx(r.latency_ms, abs=1e-3) and len(stages) == len(STAGES)
    for r in missed:
        root, stages = spans_of(traces, trace_hex(frame_trace_id(session, "", r.index)))
        assert root.attributes["edgekit.frame.index"] == r.index
        assert root.attributes["edgekit.met"] is False and root.attributes["edgekit.kept_for"] == "missed"
        assert root.attributes["edgekit.budget_ms"] == BUDGET_MS
        assert root.start_ns == round(r.captured_at * 1e9)
        assert root.ms == pytest.approx(r.latency_ms, abs=1e-3)
        assert list(sorted(stages.values(), key=lambda s: s.start_ns)) == [stages[s] for s in STAGES]
        at = root.start_ns
        for name, ms in r.stage_ms().items():
            assert stages[name].start_ns == at  # one after the other, from the capture
            assert stages[name].ms == pytest.approx(ms, abs=1e-3)
            at = stages[name].end_ns
        assert stages["inference"].ms >= SLOW_MS
        assert root.resource["service.name"] == "door-camera"
        assert root.resource["device.id"] == "cam-7"
        assert root.resource["edgekit.device.profile"] == classifier.manifest.device.profile
        assert root.resource["edgekit.bundle.sha256"] == manifest_sha256(classifier.root)
    assert tracer.sampler.counts.missed == len(missed)
    assert tracer.sampler.counts.sampled == len(sampled)


def test_a_request_span_continues_the_callers_traceparent(receiver: Receiver) -> None:
    tracing = Tracing(
        resource={"device.id": "cam-7"},
        endpoint=receiver.endpoint,
        protocol=receiver.protocol,
        request_ratio=0.0,
    )
    caller_trace, caller_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    stages = [
        ("receive", 0.4),
        ("queue", 1.5),
        ("preprocess", 2.0),
        ("infer", 9.0),
        ("postprocess", 1.0),
        ("respond", 0.3),
    ]
    end = time.time()
    sampled = tracing.record_request_span(f"00-{caller_trace}-{caller_span}-01", stages, end_time=end)
    # Not sampled by the caller, under budget, no share: ids for the response, nothing exported.
    unsampled = tracing.record_request_span(f"00-{'1' * 32}-{'2' * 16}-00", stages, budget_ms=100.0)
    # Not sampled by the caller, but slower than its budget: kept (tail-based, as frames).
    slow = tracing.record_request_span(f"00-{'3' * 32}-{'4' * 16}-00", stages, budget_ms=10.0)
    # An invalid traceparent is ignored (W3C): a trace of its own.
    own = tracing.record_request_span("00-zz-nonsense-01", stages, budget_ms=1.0)
    tracing.close()
    assert sampled.kept and sampled.trace_id == caller_trace
    assert sampled.traceparent == f"00-{caller_trace}-{sampled.span_id}-01"
    assert not unsampled.kept and unsampled.trace_id == "1" * 32
    assert slow.kept and own.kept and own.trace_id not in (caller_trace, "3" * 32)
    traces = receiver.traces()
    assert set(traces) == {caller_trace, "3" * 32, own.trace_id}
    spans = traces[caller_trace]
    root = next(s for s in spans if s.name == "request")
    assert root.parent_span_id == caller_span and root.span_id == sampled.span_id
    assert root.kind == 2  # SPAN_KIND_SERVER
    assert root.end_ns == round(end * 1e9) and root.ms == pytest.approx(14.2, abs=1e-3)
    children = sorted((s for s in spans if s is not root), key=lambda s: s.start_ns)
    assert [(c.name, round(c.ms, 3)) for c in children] == stages
    assert all(c.parent_span_id == root.span_id for c in children)
    assert next(s for s in traces[own.trace_id] if s.name == "request").parent_span_id == ""


TRACE_UI = "http://jaeger.test:16686/trace/{trace_id}"


def test_each_window_names_its_slowest_frames_traces_and_the_dashboard_links_them(
    classifier: edgekit.Model, folder: Path, broker: Mosquitto, tmp_path: Path
) -> None:
    receiver = HttpReceiver()
    sub = Subscriber(broker.port, client_id="traces-json")
    port = free_port()
    serve = subprocess.Popen(
        [*EDGEKIT, "fleet", "serve", "--mqtt", broker.url, "--db", str(tmp_path / "fleet.db"),
         "--port", str(port), "--trace-url", TRACE_UI],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=(tmp_path / "serve.log").open("w"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("the fleet server", lambda: json.loads(get(f"{url}/healthz"))["ok"], 60)
        with edgekit.Pipeline(
            classifier, str(folder), budget_ms=BUDGET_MS, warm="off", realtime=True, fps=FPS
        ) as p:
            tracer = trace(p, endpoint=receiver.endpoint, protocol="http/protobuf", ratio=0.0)
            report(p, broker.url, device_id="cam-7", fleet="lab", interval_s=1.0, tracer=tracer)
            p.run()
        assert sub.wait_for(lambda: any(m.get("state") == "offline" for m in sub.of("status")), 10)
        messages = sub.of("telemetry")
        assert sum(m["window"]["frames"] for m in messages) == FRAMES
        traces = receiver.traces()
        slow: dict[str, str] = {}  # trace id -> its link, for each window over budget
        for m in messages:
            validator("telemetry.schema.json").validate(m)
            w = m["window"]
            assert len(w["traces"]) == (1 if w["frames"] else 0)  # slowest=1 a window; none without frames
            for ref in w["traces"]:
                root, _ = spans_of(traces, ref["trace_id"])  # exported, span by span
                assert root.attributes["edgekit.frame.index"] == ref["index"]
                assert ref["latency_ms"] == pytest.approx(root.attributes["edgekit.latency_ms"], abs=1e-3)
                assert ref["latency_ms"] == pytest.approx(w["latency_ms"]["max"], abs=1e-2)  # its slowest
                if w["missed"]:
                    assert ref["latency_ms"] > BUDGET_MS
                    slow[ref["trace_id"]] = TRACE_UI.replace("{trace_id}", ref["trace_id"])
        assert len(slow) >= 2
        # The fleet keeps the windows over budget and links each one's traces to the trace UI.
        page = wait_for(
            "the slow windows on the device page",
            lambda: (
                (pg := json.loads(get(f"{url}/api/device/lab/cam-7")))["slow_windows"]
                and len(pg["slow_windows"]) == len(slow)
                and pg
            ),
        )
        links = {t["trace_id"]: t["url"] for w in page["slow_windows"] for t in w["traces"]}
        assert links == slow
        drawn_links(url, tmp_path, set(slow.values()))
    finally:
        sub.close()
        receiver.close()
        stop_process(serve, grace_s=15, sig=signal.SIGINT)


def drawn_links(url: str, tmp_path: Path, want: set[str]) -> None:
    """The device page in headless Chromium shows a link to each of ``want`` (skipped without Chromium)."""
    from chromium import CHROMEDRIVER, CHROMIUM

    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        return  # the API was checked; the page needs Debian's chromium (tools/setup.sh installs it)
    from chromium import open_chromium
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    driver = open_chromium(tmp_path)
    try:
        driver.get(f"{url}/#/device/lab/cam-7")

        def hrefs() -> set[str] | None:
            links = driver.find_elements(By.CSS_SELECTOR, "#dev-traces-table a.trace")
            return {str(a.get_attribute("href")) for a in links} or None

        assert wait_for("the slow windows' links", hrefs, errors=(WebDriverException,)) == want
    finally:
        driver.quit()


def test_edgekit_run_trace_exports_over_otlp_as_the_environment_says(
    tmp_path: Path, keys: tuple[Path, Path], folder: Path
) -> None:
    bundle = td.classifier_bundle(tmp_path / "tiny", keys[0])
    receiver = GrpcReceiver()
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_SERVICE_NAME": "line-3",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
    }
    try:
        # A budget no frame meets: every frame is a miss, and so traced (12 frames: within the cap's burst).
        r = run_cli(
            env,
            *("run", str(bundle), "--device", "x86_64-cpu", "--key", str(keys[1]), "--source", str(folder)),
            *("--budget", "0.001", "--trace", "--device-id", "cam-9", "--json"),
        )
        assert r.returncode == 0, r.stderr
        assert receiver.wait_for(lambda: len(receiver.traces()) >= FRAMES - 2)
    finally:
        receiver.close()
    roots = [s for s in receiver.spans() if s.name == "frame"]
    assert {s.attributes["edgekit.kept_for"] for s in roots} <= {"missed", "slowest"}
    assert {s.resource["service.name"] for s in roots} == {"line-3"}
    assert {s.resource["deployment.environment"] for s in roots} == {"test"}
    assert {s.resource["device.id"] for s in roots} == {"cam-9"}
    assert {s.resource["edgekit.bundle.sha256"] for s in roots} == {manifest_sha256(bundle)}
    assert all(len(receiver.traces()[s.trace_id]) == 1 + len(STAGES) for s in roots)


def test_with_no_endpoint_configured_tracing_adds_nothing_and_raises_nothing(
    classifier: edgekit.Model,
    folder: Path,
    tmp_path: Path,
    keys: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    records: list[FrameRecord] = []
    with (
        caplog.at_level("INFO"),
        edgekit.Pipeline(classifier, str(folder), budget_ms=BUDGET_MS, warm="off") as p,
    ):
        p.add_sink(sink("records", lambda r: records.append(r.record)))
        before = list(p.sinks.names)
        assert trace(p, device_id="cam-7") is None
        # No sink: a frame costs what it cost without tracing, and no exporter retries to localhost.
        assert p.sinks.names == before
        p.run()
    assert len(records) == FRAMES and any(not r.met for r in records)  # misses, none traced
    assert p.sinks.errors == {}
    assert [r.levelname for r in caplog.records if "OTLP endpoint" in r.getMessage()] == ["WARNING"]
    assert not [r for r in caplog.records if r.levelno >= 40]  # nothing at ERROR or above
    # The command line: --trace alone runs, says why nothing is traced, and exits 0.
    bundle = td.classifier_bundle(tmp_path / "tiny", keys[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EXPORTER_OTLP")}
    r = run_cli(
        env,
        *("run", str(bundle), "--device", "x86_64-cpu", "--key", str(keys[1]), "--source", str(folder)),
        *("--budget", "0.001", "--trace", "--json"),
    )
    assert r.returncode == 0, r.stderr
    assert "no OTLP endpoint configured" in r.stderr
    assert "Traceback" not in r.stderr and "Failed to export" not in r.stderr


def test_a_trace_url_without_its_placeholder_is_refused() -> None:
    from edgekit.errors import EdgekitError
    from edgekit.fleet.slow_traces import check_template, linked, slow_entry

    for bad in ("http://jaeger.test/trace/", "javascript:alert(1)//{trace_id}", "jaeger/{trace_id}"):
        with pytest.raises(EdgekitError, match="trace_id"):
            check_template(bad)
    window = {
        "start": 1.0,
        "end": 2.0,
        "frames": 3,
        "missed": 1,
        "traces": [{"trace_id": "ab" * 16, "index": 4, "latency_ms": 9.0}],
    }
    assert slow_entry({**window, "missed": 0}) is None  # on budget: not a slow window
    entry = slow_entry(window)
    assert entry is not None
    assert linked(entry, TRACE_UI)["traces"][0]["url"] == "http://jaeger.test:16686/trace/" + "ab" * 16
    assert linked(entry, None)["traces"][0]["url"] is None
