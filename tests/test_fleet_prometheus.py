"""``/metrics`` in the Prometheus text format, and the alert rules and Grafana dashboard shipped with it.

The exposition is read back by real parsers (prometheus_client's and ``promtool check
metrics``); the rules are checked and unit-tested by ``promtool``; and every metric the rules
and the dashboard use must be one ``render()`` emits, so renaming a metric cannot silently
leave an alert that never fires.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.core.sketch import LatencySketch
from edgekit.core.tally import ClassCount, SourceHealth
from edgekit.fleet import prometheus
from edgekit.fleet.prometheus import (
    CONTENT_TYPE,
    FRAME_BUCKETS,
    MAX_LABEL_VALUE,
    STAGE_BUCKETS,
    DeviceTotals,
    cumulative_counts,
    render,
)
from edgekit.pipeline.records import FrameRecord
from edgekit.protocol.stages import STAGES
from edgekit.telemetry.window import MetricsWindow

MONITORING = Path(prometheus.__file__).with_name("monitoring")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (apt install prometheus)"
)
# Labels Prometheus itself adds at scrape time; rules and panels may group by them.
SCRAPE_LABELS = {"job", "instance"}

Sample = tuple[str, frozenset[tuple[str, str]]]


def parse(text: str) -> dict[Sample, float]:
    """Every sample of the exposition, read by prometheus_client's parser (the reference Python one)."""
    parser = pytest.importorskip("prometheus_client.parser", reason="pip install prometheus-client")
    out: dict[Sample, float] = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def promtool_check_metrics(text: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60, check=False
    )


def value(samples: dict[Sample, float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


# -- devices with real sketches --------------------------------------------------------------


BIRTH: dict[str, Any] = {
    "model": {"name": "efficientnet-lite0", "version": "1.0", "sha256": "0" * 64},
    "backend": "onnxruntime",
    "precision": "fp32",
    "budget_ms": 33.3,
    "profile": "rpi5",
    "edgekit": "0.6.0",
}


def record(latency: float, met: bool) -> FrameRecord:
    # The stages add up to the latency the way a real frame's do (inference the bulk of it).
    wait, pre, post, sink = 0.1 * latency, 0.15 * latency, 0.05 * latency, 0.02 * latency
    inference = latency - wait - pre - post - sink
    return FrameRecord(0, 0.0, 0, 0, wait, pre, inference, post, sink, latency, met, 0, "x")


class Device:
    """One device's telemetry windows as the device makes them (MetricsWindow), folded into
    cumulative totals the way the server's view does, with the raw samples kept to compare."""

    def __init__(self, fleet: str, device: str, **birth: Any) -> None:
        b = {**BIRTH, **birth}
        self.totals = DeviceTotals(
            fleet=fleet,
            device=device,
            state="online",
            last_seen=1_800_000_000.0,
            birth=b,
            budget_ms=b.get("budget_ms"),
        )
        self.raw: list[np.ndarray] = []
        self.raw_stages: dict[str, list[float]] = {s: [] for s in STAGES}

    def window(self, latencies: np.ndarray) -> None:
        mw = MetricsWindow()
        budget = self.totals.budget_ms or math.inf
        for ms in latencies:
            r = record(float(ms), met=float(ms) <= budget)
            mw.observe(r)
            for stage, v in r.stage_ms().items():
                self.raw_stages[stage].append(v)
        body = mw.take().to_dict()  # what goes on the wire
        t = self.totals
        t.frames += body["frames"]
        t.missed += body["missed"]
        t.windows += 1
        t.latency.merge(LatencySketch.from_dict(body["latency_ms"]))
        for stage, data in body["stages_ms"].items():
            t.stages[stage].merge(LatencySketch.from_dict(data))
        self.raw.append(np.asarray(latencies, dtype=float))

    @property
    def samples(self) -> np.ndarray:
        return np.concatenate(self.raw) if self.raw else np.zeros(0)


@pytest.fixture
def fleet() -> list[Device]:
    rng = np.random.default_rng(6)
    fast = Device("demo", "cam-fast", backend="openvino", budget_ms=16.7, profile="x86_64-cpu")
    slow = Device("demo", "cam-slow", precision="int8")  # ~30 ms with a tail past its 33.3 ms budget
    for _ in range(8):
        fast.window(rng.lognormal(np.log(9.0), 0.3, 240))
        slow.window(rng.lognormal(np.log(27.0), 0.35, 120))
    quiet = Device("lab", "cam-new")  # online, born, no frames yet
    return [fast, slow, quiet]


COLLECTOR = {
    "seen": {"telemetry": 16, "status": 3, "duplicate": 1, "gaps": 1},
    "rejected": {"malformed-json": 2, "bad-id": 1},
    "lag_ms": {"p50": 4.2, "p99": 35.0},
    "remote_write": {"pushes": 7, "samples_dropped": 120, "windows_late": 1, "pending_samples": 3000},
}


def full_exposition() -> str:
    """An exposition with every family in it (an offline device without birth too)."""
    d = Device("demo", "cam-1")
    d.window(np.random.default_rng(1).lognormal(np.log(20.0), 0.3, 50))
    d.totals.gaps = 1
    d.totals.detections = {"face": ClassCount(3, 5, 0.9)}  # a detector's per-class counters
    d.totals.health = {"": SourceHealth(2, 2, 1, 4, 1, 12.5, 0.03)}  # a single source's health
    offline = DeviceTotals(
        fleet="demo", device="cam-2", state="offline", last_seen=1_800_000_000.0, birth={}, budget_ms=None
    )
    return render([d.totals, offline], COLLECTOR)


def emitted() -> tuple[set[str], set[str]]:
    """The metric (sample) names and the label names ``render()`` emits."""
    names, labels = set(), set()
    for name, labelset in parse(full_exposition()):
        names.add(name)
        labels |= {k for k, _ in labelset}
    return names, labels


# -- the exposition ------------------------------------------------------------------------


def test_exposition_parses_with_prometheus_client_and_promtool(fleet: list[Device]) -> None:
    text = render([d.totals for d in fleet], COLLECTOR)
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    assert text.endswith("\n")
    parsers = []
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        pass
    else:
        parsers.append("prometheus_client")
        kinds = {f.name: f.type for f in text_string_to_metric_families(text)}
        assert kinds["edgekit_frame_latency_seconds"] == "histogram"
        assert kinds["edgekit_stage_latency_seconds"] == "histogram"
        assert kinds["edgekit_device_up"] == "gauge"
        assert kinds["edgekit_device_info"] == "gauge"
        # prometheus_client names a counter family without its _total.
        for counter in ("frames", "frames_missed", "windows", "telemetry_gaps", "collector_rejected"):
            assert kinds[f"edgekit_{counter}"] == "counter"
    if PROMTOOL is not None:
        parsers.append("promtool")
        done = promtool_check_metrics(text)
        # promtool also lints: names, units, _total on counters; any finding is printed.
        assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), (
            done.stdout + done.stderr
        )
    if not parsers:
        pytest.skip("neither prometheus_client (pip install prometheus-client) nor promtool is here")


def test_every_device_has_its_gauges_counters_and_info(fleet: list[Device]) -> None:
    s = parse(render([d.totals for d in fleet], COLLECTOR))
    slow = {"fleet": "demo", "device": "cam-slow"}
    assert value(s, "edgekit_device_up", **slow) == 1
    assert value(s, "edgekit_budget_seconds", **slow) == 0.0333  # exactly the bucket edge
    assert value(s, "edgekit_device_last_seen_timestamp_seconds", **slow) == 1_800_000_000.0
    assert value(s, "edgekit_frames_total", **slow) == 8 * 120
    assert value(s, "edgekit_frames_missed_total", **slow) == fleet[1].totals.missed > 0
    assert value(s, "edgekit_windows_total", **slow) == 8
    info = {
        **slow,
        "profile": "rpi5",
        "model": "efficientnet-lite0",
        "version": "1.0",
        "backend": "onnxruntime",
        "precision": "int8",
        "edgekit": "0.6.0",
    }
    assert value(s, "edgekit_device_info", **info) == 1
    assert value(s, "edgekit_collector_rejected_total", reason="malformed-json") == 2
    assert value(s, "edgekit_collector_messages_total", kind="telemetry") == 16
    assert value(s, "edgekit_collector_lag_seconds", stat="p99") == pytest.approx(0.035)
    # The push to a time-series database (--remote-write): its counters, and what waits.
    assert value(s, "edgekit_collector_remote_write_total", event="samples_dropped") == 120
    assert value(s, "edgekit_collector_remote_write_waiting", what="pending_samples") == 3000
    # A device with no frames yet still has its histogram, at zero, so rate() starts from 0.
    new = {"fleet": "lab", "device": "cam-new"}
    assert value(s, "edgekit_frame_latency_seconds_count", **new) == 0
    assert value(s, "edgekit_frame_latency_seconds_bucket", **new, le="+Inf") == 0
    # Every device has the same buckets: histogram_quantile sums them across the fleet.
    les = {(dict(k)["device"], dict(k)["le"]) for n, k in s if n == "edgekit_frame_latency_seconds_bucket"}
    expected = [*(repr(b) for b in FRAME_BUCKETS), "+Inf"]
    for d in fleet:
        assert sorted(le for dev, le in les if dev == d.totals.device) == sorted(expected)


def histogram(
    s: dict[Sample, float], name: str, **labels: str
) -> tuple[list[tuple[float, float]], float, float]:
    buckets = sorted(
        (float(dict(k)["le"]), v)
        for (n, k), v in s.items()
        if n == f"{name}_bucket" and {x: y for x, y in k if x != "le"} == labels
    )
    return buckets, value(s, f"{name}_sum", **labels), value(s, f"{name}_count", **labels)


def check_buckets(buckets: list[tuple[float, float]], raw: np.ndarray, total: float, sum_s: float) -> None:
    counts = [c for _, c in buckets]
    assert counts == sorted(counts), "buckets must be cumulative"
    assert buckets[-1] == (math.inf, total) and total == raw.size
    assert sum_s == pytest.approx(raw.sum() / 1000, rel=1e-9)
    for le, count in buckets[:-1]:
        # A 1 % sketch: values within 1 % of the edge may land on either side of it.
        assert np.count_nonzero(raw <= le * 1000 * 0.99) <= count <= np.count_nonzero(raw <= le * 1000 * 1.01)


def test_histogram_buckets_are_cumulative_and_match_the_raw_samples(fleet: list[Device]) -> None:
    s = parse(render([d.totals for d in fleet], COLLECTOR))
    for d in fleet:
        who = {"fleet": d.totals.fleet, "device": d.totals.device}
        buckets, sum_s, total = histogram(s, "edgekit_frame_latency_seconds", **who)
        assert [le for le, _ in buckets] == [*FRAME_BUCKETS, math.inf]
        check_buckets(buckets, d.samples, total, sum_s)
        for stage in STAGES:
            buckets, sum_s, total = histogram(s, "edgekit_stage_latency_seconds", **who, stage=stage)
            assert [le for le, _ in buckets] == [*STAGE_BUCKETS, math.inf]
            check_buckets(buckets, np.asarray(d.raw_stages[stage]), total, sum_s)
    # The slow device's budget edge says how many frames kept the budget, within the band.
    slow = fleet[1]
    le = dict(histogram(s, "edgekit_frame_latency_seconds", fleet="demo", device="cam-slow")[0])[0.0333]
    assert le == pytest.approx(np.count_nonzero(slow.samples <= 33.3), abs=0.02 * slow.samples.size)


@settings(max_examples=150, deadline=None)
@given(
    a=st.lists(st.floats(0, 3000, allow_nan=False), max_size=200),
    b=st.lists(st.floats(0, 3000, allow_nan=False), max_size=200),
)
def test_bucket_counts_stay_in_the_sketch_band_and_only_grow_when_sketches_merge(
    a: list[float], b: list[float]
) -> None:
    bounds = [le * 1000 for le in FRAME_BUCKETS]
    sa, sb = LatencySketch(), LatencySketch()
    sa.extend(a)
    sb.extend(b)
    ca, cb = cumulative_counts(sa, bounds), cumulative_counts(sb, bounds)
    raw = np.asarray(a, dtype=float)
    assert ca == sorted(ca) and (not ca or ca[-1] <= len(a))
    for bound, count in zip(bounds, ca, strict=True):
        assert np.count_nonzero(raw <= bound * 0.99) <= count <= np.count_nonzero(raw <= bound * 1.01)
    # Counts depend on the sketch's counts alone: a merged sketch's are the sums, so a growing
    # cumulative sketch never lowers a bucket (Prometheus would read that as a counter reset).
    sa.merge(sb)
    assert cumulative_counts(sa, bounds) == [x + y for x, y in zip(ca, cb, strict=True)]


def test_counters_and_buckets_never_go_down_while_the_totals_grow() -> None:
    d = Device("demo", "cam-edge")
    rng = np.random.default_rng(3)
    previous: dict[Sample, float] = {}
    # Values on bucket edges whose sketch bucket reaches past the edge first, then a longer
    # tail: the case a shortcut through the sketch's exact max would get wrong (counted
    # while they are the max, not counted once the max grows).
    windows = [np.full(20, 10.0), np.full(20, 33.3), rng.lognormal(np.log(40.0), 0.5, 200)]
    windows += [rng.lognormal(np.log(25.0), 0.4, 100) for _ in range(5)]
    for latencies in windows:
        d.window(latencies)
        d.totals.gaps += int(rng.integers(0, 2))
        now = parse(render([d.totals], COLLECTOR))
        for key, v in now.items():
            name = key[0]
            if name.endswith(("_total", "_bucket", "_count", "_sum")) and key in previous:
                assert v >= previous[key], f"{key} went down: {previous[key]} -> {v}"
        previous = now


def test_hostile_label_values_are_escaped() -> None:
    # Device ids are safe_name-checked by the collector, but escape them anyway; birth fields
    # (model names, versions) are free text from the network.
    hostile_id = 'cam"1\\x\ny'
    model = 'evil"} 1\nedgekit_device_up{fleet="x",device="y"} 0\\'
    birth = {
        "model": {"name": model, "version": "lone \ud800 surrogate"},
        "backend": 42,
        "precision": None,
        "profile": "p" * 1000,
    }
    t = DeviceTotals(
        fleet="demo", device=hostile_id, state="online", last_seen=1.0, birth=birth, budget_ms=20.0
    )
    t.latency.extend([10.0, 20.0])
    # Class names come from the device's model too: a detector's counters escape them alike.
    hostile_class = 'fa"ce} 9\nedgekit_up 1\\'
    t.detections = {hostile_class: ClassCount(1, 2, 0.5)}
    text = render([t], {"rejected": {'re"ason\n': 1}})
    text.encode("utf-8")  # a lone surrogate would make the response unencodable
    # No label broke a line: each line is a comment or an edgekit_ sample.
    assert all(line.startswith(("# ", "edgekit_")) for line in text.splitlines())
    s = parse(text)
    info = next(dict(k) for n, k in s if n == "edgekit_device_info")
    assert info["device"] == hostile_id
    assert info["model"] == model
    assert info["version"] == "lone ? surrogate"
    assert info["backend"] == "42" and info["precision"] == ""
    assert info["profile"] == "p" * MAX_LABEL_VALUE
    assert value(s, "edgekit_device_up", fleet="demo", device=hostile_id) == 1
    assert [k for n, k in s if n == "edgekit_device_up"] == [
        frozenset({("fleet", "demo"), ("device", hostile_id)})
    ]
    assert value(s, "edgekit_collector_rejected_total", reason='re"ason\n') == 1
    detected = {"fleet": "demo", "device": hostile_id, "class": hostile_class}
    assert value(s, "edgekit_detections_total", **detected) == 2
    assert value(s, "edgekit_detection_frames_total", **detected) == 1
    if PROMTOOL is not None:
        done = promtool_check_metrics(text)
        assert done.returncode == 0, done.stdout + done.stderr


# -- alert rules -----------------------------------------------------------------------------

METRIC = re.compile(r"\bedgekit_[a-zA-Z0-9_]+")
GROUPING = re.compile(r"\b(?:by|on|without|group_left|group_right)\s*\(([^)]*)\)")


def used(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and the grouping/matching label names a PromQL expression uses."""
    labels = {x.strip() for group in GROUPING.findall(expr) for x in group.split(",") if x.strip()}
    return set(METRIC.findall(expr)), labels


def load_yaml(path: Path) -> Any:
    yaml = pytest.importorskip("yaml", reason="pip install pyyaml")
    return yaml.safe_load(path.read_text())


@needs_promtool
def test_promtool_checks_and_unit_tests_the_alert_rules() -> None:
    assert PROMTOOL is not None
    for args in (
        ["check", "rules", "prometheus-alerts.yml"],
        ["test", "rules", "prometheus-alerts.test.yml"],
    ):
        done = subprocess.run(
            [PROMTOOL, *args], cwd=MONITORING, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_alert_rules_are_complete_and_use_only_emitted_metrics() -> None:
    names, labels = emitted()
    rules = [r for g in load_yaml(MONITORING / "prometheus-alerts.yml")["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} >= {
        "EdgekitP95OverBudget",
        "EdgekitDeviceOffline",
        "EdgekitMissRateHigh",
        "EdgekitTelemetryGaps",
        "EdgekitCollectorRejecting",
        "EdgekitCameraStalled",
        "EdgekitCameraFlapping",
    }
    for r in rules:
        assert re.fullmatch(r"\d+[smh]", str(r["for"])), r["alert"]
        assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
        assert {"summary", "description", "runbook"} <= r["annotations"].keys(), r["alert"]
        metrics, grouping = used(r["expr"])
        assert metrics and metrics <= names, f"{r['alert']} uses {metrics - names}, not emitted"
        assert grouping <= labels | SCRAPE_LABELS, f"{r['alert']} groups by {grouping - labels}"
    p95 = next(r for r in rules if r["alert"] == "EdgekitP95OverBudget")
    assert "histogram_quantile(0.95" in p95["expr"] and "edgekit_budget_seconds" in p95["expr"]
    assert p95["for"] == "5m"
    # The unit tests prove something only if their input series are the ones /metrics has.
    tests = load_yaml(MONITORING / "prometheus-alerts.test.yml")
    series = {name for t in tests["tests"] for s in t["input_series"] for name in METRIC.findall(s["series"])}
    assert series <= names, f"unit tests feed {series - names}"
    tested = {a["alertname"] for t in tests["tests"] for a in t["alert_rule_test"]}
    assert {
        "EdgekitP95OverBudget",
        "EdgekitDeviceOffline",
        "EdgekitCameraStalled",
        "EdgekitCameraFlapping",
    } <= tested


# -- the Grafana dashboard -------------------------------------------------------------------


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])  # inside collapsed rows


def test_grafana_dashboard_loads_and_queries_only_emitted_metrics() -> None:
    names, labels = emitted()
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert dash["schemaVersion"] >= 36 and dash["uid"] and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for name in ("fleet", "device"):
        query = variables[name]["definition"]
        assert query.startswith("label_values(") and query.rstrip(")").endswith(name)
        assert used(query)[0] <= names
    ids, exprs = set(), []
    for p in panels(dash):
        assert p["id"] not in ids
        ids.add(p["id"])
        grid = p["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
        assert p["targets"], p["title"]
        for target in p["targets"]:
            expr = target["expr"]
            metrics, grouping = used(expr)
            assert metrics and metrics <= names, f"{p['title']!r} uses {metrics - names}, not emitted"
            assert grouping <= labels | SCRAPE_LABELS, f"{p['title']!r} groups by {grouping - labels}"
            exprs.append((p["title"], expr))
    titles = " | ".join(t for t, _ in exprs).lower()
    for part in (
        "devices up",
        "devices down",
        "p50 / p95 / p99",
        "per-device p99",
        "miss rate",
        "per-stage p99",
    ):
        assert part in titles, part
    joined = "\n".join(e for _, e in exprs)
    assert "edgekit_device_info" in joined and "edgekit_collector_rejected_total" in joined
    assert "edgekit_budget_seconds" in joined
    for q in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({q}, sum by (le)" in joined


@needs_promtool
def test_grafana_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool has no 'check this expression': each panel query becomes a recording rule it parses."""
    assert PROMTOOL is not None
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    rules = []
    for p in panels(dash):
        for target in p.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "5m").replace("$__range", "1h")
            expr = expr.replace("$fleet", ".*").replace("$device", ".*")
            rules.append({"record": f"grafana:panel{p['id']}:{target['refId']}", "expr": expr})
    path = tmp_path / "grafana-queries.yml"
    path.write_text(json.dumps({"groups": [{"name": "grafana", "rules": rules}]}))  # JSON is YAML
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


# -- /metrics from the server ----------------------------------------------------------------


def test_metrics_endpoint_serves_the_collectors_feed(tmp_path: Path) -> None:
    pytest.importorskip("fastapi", reason="pip install -e '.[fleet]'")
    pytest.importorskip("httpx", reason="FastAPI's TestClient needs httpx (pip install -e '.[dev]')")
    from fastapi.testclient import TestClient

    from edgekit.fleet import Collector, FleetStore
    from edgekit.fleet.dashboard import create_app
    from edgekit.fleet.view import FleetView
    from edgekit.telemetry import BrokerConfig, Spool, TelemetryPublisher

    store = FleetStore(tmp_path / "fleet.db")
    view = FleetView(store)
    collector = Collector(store, listener=view)
    view.stats = collector.stats

    rng = np.random.default_rng(9)
    devices = {}
    for name, budget in (("cam-a", 33.3), ("cam-b", 16.7)):
        window = MetricsWindow()
        pub = TelemetryPublisher(
            BrokerConfig.from_url("mqtt://127.0.0.1:1"),
            device_id=name,
            fleet="lab",
            window=window,
            spool=Spool(tmp_path / f"{name}.db"),
            counters=lambda: {"frames": 0, "missed": 0, "dropped": 0},
        )
        birth = {
            "schema": "edgekit/v1/status",
            "state": "online",
            "device": name,
            "fleet": "lab",
            "ts": 1.0,
            "session": "s",
            "edgekit": "0.6.0",
            "model": {"name": "efficientnet-lite0", "version": "1.0", "sha256": "0" * 64},
            "backend": "onnxruntime",
            "precision": "fp32",
            "budget_ms": budget,
            "profile": "rpi5",
        }
        assert collector.handle(f"edgekit/v1/lab/{name}/status", json.dumps(birth).encode()) == "status"
        devices[name] = (window, pub, budget)

    raw: dict[str, list[float]] = {"cam-a": [], "cam-b": []}

    def send(n_windows: int) -> None:
        for name, (window, pub, budget) in devices.items():
            for _ in range(n_windows):
                xs = rng.lognormal(np.log(budget * 0.7), 0.3, 60)
                for v in xs:
                    window.observe(record(float(v), met=v <= budget))
                raw[name] += list(xs)
                payload = json.dumps(pub.telemetry_payload()).encode()
                assert collector.handle(f"edgekit/v1/lab/{name}/telemetry", payload) == "telemetry"
        collector.flush()

    send(4)
    assert collector.handle("edgekit/v1/lab/cam-a/telemetry", b"{not json").startswith("rejected")
    with TestClient(create_app(view), base_url="http://127.0.0.1") as client:
        response = client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"] == CONTENT_TYPE
        first = parse(response.text)
        if PROMTOOL is not None:
            done = promtool_check_metrics(response.text)
            assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
        for name in devices:
            who = {"fleet": "lab", "device": name}
            assert value(first, "edgekit_device_up", **who) == 1
            assert value(first, "edgekit_frames_total", **who) == len(raw[name]) == 4 * 60
            assert value(first, "edgekit_windows_total", **who) == 4
            buckets, sum_s, total = histogram(first, "edgekit_frame_latency_seconds", **who)
            check_buckets(buckets, np.asarray(raw[name]), total, sum_s)
        assert value(first, "edgekit_budget_seconds", fleet="lab", device="cam-b") == 0.0167
        info = next(dict(k) for n, k in first if n == "edgekit_device_info" and ("device", "cam-b") in k)
        assert info["model"] == "efficientnet-lite0" and info["backend"] == "onnxruntime"
        assert value(first, "edgekit_collector_rejected_total", reason="malformed-json") == 1
        assert value(first, "edgekit_collector_messages_total", kind="telemetry") == 2 * 4
        assert {dict(k)["stat"] for n, k in first if n == "edgekit_collector_lag_seconds"} == {"p50", "p99"}

        send(2)
        offline = {"schema": "edgekit/v1/status", "state": "offline", "device": "cam-b", "fleet": "lab"}
        collector.handle("edgekit/v1/lab/cam-b/status", json.dumps(offline).encode())
        second = parse(client.get("/metrics").text)
    assert value(second, "edgekit_device_up", fleet="lab", device="cam-b") == 0
    assert value(second, "edgekit_frames_total", fleet="lab", device="cam-a") == 6 * 60
    for key, v in first.items():
        if key[0].endswith(("_total", "_bucket", "_count")):
            assert second[key] >= v, key
