"""``edgekit fleet serve`` end to end: a real device (``edgekit run`` on the real bundle) through a real Mosquitto."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgekit.testing.mosquitto import Mosquitto, free_port
from edgekit.testing.process import stop_process

from conftest import EDGEKIT, ROOT, edgekit


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def wait_for(check: Callable[[], Any], timeout: float) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            value = check()
            if value:
                return value
        except (OSError, urllib.error.URLError, KeyError, IndexError, StopIteration):
            pass
        time.sleep(0.2)
    return None


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    b = Mosquitto(tmp_path).start()
    yield b
    b.stop()


@pytest.fixture
def server(tmp_path: Path, broker: Mosquitto, cache_env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [*EDGEKIT, "fleet", "serve", "--mqtt", broker.url, "--db", str(tmp_path / "fleet.db"),
         "--port", str(port), "--slo-for", "2s"],
        env=cache_env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=(tmp_path / "serve.log").open("w"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: get(f"{url}/healthz")["ok"], 60), (tmp_path / "serve.log").read_text()
        yield url
    finally:
        stop_process(proc, grace_s=15, sig=signal.SIGINT)


def test_a_real_device_shows_up_with_its_model_backend_and_latency_then_goes_offline(
    x86_bundle: tuple[Path, dict[str, Any]], broker: Mosquitto, server: str, cache_env: dict[str, str]
) -> None:
    device = subprocess.Popen(
        [*EDGEKIT, "run", str(x86_bundle[0]), "--source", "synthetic:160x120@30", "--device", "x86_64-cpu",
         "--mqtt", broker.url, "--fleet", "lab", "--device-id", "cam-1", "--telemetry-interval", "0.5",
         "--budget", "33", "--duration", "30"],
        env=cache_env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        row = wait_for(
            lambda: next(
                r
                for r in get(f"{server}/api/fleet")["devices"]
                if r["device"] == "cam-1" and r["frames"] >= 30
            ),
            90,
        )
        assert row, "the device never reached the dashboard"
        assert row["state"] == "online" and row["backend"] and row["model"] and row["budget_ms"] == 33
        assert row["p50"] is not None and 0 < row["p50"] <= row["p99"]
        page = get(f"{server}/api/device/lab/cam-1")
        assert page["birth"]["model"]["sha256"] and page["series"]["t"]
        metrics = urllib.request.urlopen(f"{server}/metrics", timeout=5).read().decode()
        assert 'edgekit_frames_total{fleet="lab",device="cam-1"}' in metrics
        device.send_signal(signal.SIGKILL)  # no clean stop: the broker sends its Will
        device.wait(10)
        gone = wait_for(
            lambda: next(a for a in get(f"{server}/api/fleet")["alerts"] if a["kind"] == "offline"), 60
        )
        assert gone and gone["device"] == "cam-1"
        assert (
            next(r for r in get(f"{server}/api/fleet")["devices"] if r["device"] == "cam-1")["state"]
            == "offline"
        )
    finally:
        if device.poll() is None:
            device.kill()


def test_serve_errors_are_plain_and_say_what_to_do(tmp_path: Path, cache_env: dict[str, str]) -> None:
    dead = f"mqtt://127.0.0.1:{free_port()}"
    r = edgekit(cache_env, "fleet", "serve", "--mqtt", dead, "--db", str(tmp_path / "f.db"))
    assert r.returncode == 2 and "error:" in r.stderr and "hint:" in r.stderr and "Traceback" not in r.stderr
    r = edgekit(cache_env, "fleet", "serve", "--mqtt", "http://nope", "--db", str(tmp_path / "f.db"))
    assert r.returncode == 2 and "not an MQTT broker URL" in r.stderr
    r = edgekit(cache_env, "fleet", "serve", "--raw-keep", "[red]soon", "--db", str(tmp_path / "f.db"))
    # User input in a message is shown as typed, never taken as rich markup.
    assert r.returncode == 2 and "'[red]soon' is not a duration" in r.stderr and "hint:" in r.stderr
    r = edgekit(
        cache_env,
        "fleet",
        "serve",
        "--mqtt",
        dead,
        "--db",
        f"postgresql://u:secret@127.0.0.1:{free_port()}/x",
    )
    assert r.returncode == 2 and "hint:" in r.stderr and "secret" not in r.stderr + r.stdout


def test_sparkplug_devices_reach_the_dashboard_with_merged_percentiles(
    broker: Mosquitto, server: str
) -> None:
    sim = subprocess.Popen(
        [*EDGEKIT, "fleet", "simulate", "--mqtt", broker.url, "--fleet", "plant",
         "--devices", "2", "--prefix", "sp", "--interval", "0.5", "--format", "sparkplug"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        rows = wait_for(
            lambda: [
                r for r in get(f"{server}/api/fleet")["devices"] if r["fleet"] == "plant" and r["frames"] > 0
            ],
            60,
        )
        assert rows and len(rows) == 2, "the Sparkplug devices never reached the dashboard"
        for r in rows:
            assert r["state"] == "online" and r["backend"] and r["model"] and r["p50"] <= r["p99"]
        fleet = get(f"{server}/api/fleet")["groups"]["fleet"]
        assert next(g for g in fleet if g["key"] == "plant")["p99"] is not None
    finally:
        sim.send_signal(signal.SIGTERM)
        sim.wait(15)
    # A clean stop sends NDEATH: offline.
    assert wait_for(
        lambda: all(
            r["state"] == "offline" for r in get(f"{server}/api/fleet")["devices"] if r["fleet"] == "plant"
        ),
        30,
    )
