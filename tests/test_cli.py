"""The ``edgekit`` command, run as a user runs it (a subprocess of the installed entry point)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

EDGEKIT = (
    [
        shutil.which("edgekit") or "",
    ]
    if shutil.which("edgekit")
    else [sys.executable, "-m", "edgekit.cli"]
)


def edgekit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EDGEKIT, *args], capture_output=True, text=True, timeout=120)


def test_version() -> None:
    from edgekit import __version__

    r = edgekit("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"edgekit {__version__}"


def test_doctor_json_reports_every_backend() -> None:
    r = edgekit("doctor", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    backends = report["backends"]
    for name in ("onnxruntime", "openvino", "litert", "tvm"):
        assert backends[name]["available"] is True, (name, backends[name])
        assert backends[name]["version"]
    assert backends["tensorrt"]["available"] is False
    assert "tensorrt" in backends["tensorrt"]["reason"].lower() and backends["tensorrt"]["hint"]
    assert report["profile"] in ("x86_64-cpu", "arm64-cpu", "intel-npu")
    assert report["host"]["arch"] and report["candidates"]
    # Video decode: GStreamer through PyGObject here, software (this profile's path), per codec.
    decode = report["video_decode"]
    assert decode["gstreamer"]["available"] is True, decode["gstreamer"]
    assert {c: d["element"] for c, d in decode["codecs"].items()} == {
        "h264": "avdec_h264",
        "h265": "avdec_h265",
    }
    assert "GStreamer" in decode["sources"]["rtsp"] and "JetPack" in decode["needs"]["nvv4l2"]


def test_doctor_table() -> None:
    r = edgekit("doctor")
    assert r.returncode == 0, r.stderr
    assert "onnxruntime" in r.stdout and "tensorrt" in r.stdout and "profile:" in r.stdout
    assert "Video decode" in r.stdout and "avdec_h264" in r.stdout and "vaapi needs" in r.stdout


def test_devices_list_json() -> None:
    r = edgekit("devices", "list", "--json")
    assert r.returncode == 0
    names = {p["name"] for p in json.loads(r.stdout)}
    assert {"jetson-orin-nano", "rpi5", "coral-devboard", "intel-npu", "x86_64-cpu"} <= names


@pytest.mark.parametrize(
    ("alias", "name"), [("jetson", "jetson-orin-nano"), ("pi", "rpi5"), ("coral", "coral-devboard")]
)
def test_devices_show_resolves_aliases(alias: str, name: str) -> None:
    r = edgekit("devices", "show", alias, "--json")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["name"] == name and shown["candidates"] and shown["tvm_target"]["kind"] == "llvm"


def test_devices_show_table() -> None:
    r = edgekit("devices", "show", "jetson")
    assert r.returncode == 0 and "tensorrt" in r.stdout and "candidates" in r.stdout


def test_user_mistake_is_an_error_without_traceback() -> None:
    r = edgekit("devices", "show", "jetsn")
    assert r.returncode == 2
    assert "error:" in r.stderr and "did you mean 'jetson'" in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_error_and_hint_lines_are_not_wrapped_when_stderr_is_piped() -> None:
    # Piped, stderr is read by programs and grepped in logs: a message longer than the 80 columns
    # rich assumes off a terminal still comes as one error line and one hint line.
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_TERMINAL", "TTY_COMPATIBLE")}
    name = "no-such-device-" + "x" * 150
    r = subprocess.run(
        [*EDGEKIT, "devices", "show", name],
        capture_output=True,
        text=True,
        timeout=120,
        env=env | {"COLUMNS": "80"},
    )
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    error, hint = lines
    assert error.startswith("error: unknown device") and f"'{name}'" in error and len(error) > 160
    assert hint.startswith("hint: known devices:") and "rpi5" in hint and len(hint) > 80


def test_debug_shows_the_traceback() -> None:
    r = edgekit("--debug", "devices", "show", "jetsn")
    assert r.returncode == 2 and "Traceback" in r.stderr and "ProfileError" in r.stderr


def test_usage_error_exit_code() -> None:
    r = edgekit("devices", "frobnicate")
    assert r.returncode != 0 and "Traceback" not in r.stderr


def test_tables_are_not_cut_to_80_columns_when_stdout_is_piped() -> None:
    # Piped, rich would fit a table to 80 columns and cut its cells ("onnxrun…", a latency's "17…"):
    # what a program or a log reads must hold every value whole, one row a line.
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_TERMINAL", "TTY_COMPATIBLE")}
    r = subprocess.run([*EDGEKIT, "devices", "list"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout, r.stdout
    profiles = json.loads(edgekit("devices", "list", "--json").stdout)
    rows = r.stdout.splitlines()
    for p in profiles:
        cells = (p["name"], f"{p['budget_ms']:g} ms", p["candidates"][0]["name"], p["description"])
        assert any(all(c in row for c in cells) for row in rows), (cells, r.stdout)
