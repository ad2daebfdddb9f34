"""Shared fixtures: the tiny model written once per run as every backend's artifact, and the
reference bundle (EfficientNet-Lite0 for x86_64-cpu) built once per run through the real command."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.testing.mosquitto import BrokerMissing, Mosquitto

sys.path.insert(0, str(Path(__file__).parent))
from postgres import PostgresServer

import tiny_model


@dataclass(frozen=True)
class TinyArtifacts:
    onnx: Path
    openvino_ir: Path
    tflite: Path
    tvm_x86_64: Path | None
    input_nchw: np.ndarray
    expected: np.ndarray


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    """A test whose fixture starts a broker on a host without mosquitto is skipped, saying how to get it."""
    try:
        return (yield)
    except BrokerMissing as err:
        pytest.skip(str(err))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Likewise for a test that starts its broker itself."""
    try:
        return (yield)
    except BrokerMissing as err:
        pytest.skip(str(err))


def _skip_unless(module: str) -> None:
    pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[all]')")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyArtifacts:
    """The tiny model as ONNX, OpenVINO IR, TFLite and (when TVM is here) a host TVM library."""
    out = tmp_path_factory.mktemp("tiny")
    weights = tiny_model.make_weights()
    onnx_path = tiny_model.write_onnx(out / "tiny.onnx", weights)
    tflite_path = tiny_model.write_tflite(out / "tiny.tflite", weights)
    ir = out / "tiny.xml"
    if importlib.util.find_spec("openvino") is not None:
        import openvino as ov

        # fp32 IR: save_model would compress weights to fp16 by default.
        ov.save_model(ov.convert_model(str(onnx_path)), str(ir), compress_to_fp16=False)
    tvm_lib: Path | None = None
    if importlib.util.find_spec("tvm") is not None:
        from edgekit.convert.tvm import compile_onnx
        from edgekit.device.profiles import get_profile

        tvm_lib = compile_onnx(onnx_path, out / "tiny-x86_64.so", get_profile("x86_64-cpu").tvm_target).path
    x = tiny_model.sample_input()
    return TinyArtifacts(onnx_path, ir, tflite_path, tvm_lib, x, tiny_model.reference(x, weights))


@pytest.fixture(scope="session")
def aarch64_cc() -> str:
    cc = shutil.which("aarch64-linux-gnu-gcc")
    if cc is None:
        pytest.skip(
            "aarch64-linux-gnu-gcc is not installed (apt-get install gcc-aarch64-linux-gnu; .ci/run does)"
        )
    return cc


ROOT = Path(__file__).resolve().parents[1]
CARD = ROOT / "models" / "efficientnet-lite0"
EDGEKIT = [shutil.which("edgekit")] if shutil.which("edgekit") else [sys.executable, "-m", "edgekit.cli"]


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """In-process code (telemetry spools, build steps) writes under a cache and state of this run, not ~."""
    os.environ["EDGEKIT_CACHE"] = str(tmp_path_factory.mktemp("run-cache"))
    os.environ["EDGEKIT_STATE"] = str(tmp_path_factory.mktemp("run-state"))
    # The build cache's key (edgekit/convert/cache_trust.py) of this run, outside its caches. A
    # cache kept in EDGEKIT_TEST_CACHE keeps the key that sealed it: EDGEKIT_CACHE_KEY_FILE (.ci/run
    # sets it), else this user's own.
    if not os.environ.get("EDGEKIT_TEST_CACHE"):
        os.environ.setdefault(
            "EDGEKIT_CACHE_KEY_FILE", str(tmp_path_factory.mktemp("cache-key") / "cache.key")
        )
    # The trust store of this run (edgekit.bundle.trust): the `keys` fixture puts the session's
    # builder key in it, so bundles signed with it load like on a machine that trusts its builder.
    os.environ["EDGEKIT_TRUST"] = str(tmp_path_factory.mktemp("trusted-keys"))
    # Loads keep the profile's order unless a test asks for the first-load measurement
    # (tests/test_first_load_choice.py does): which candidate a test runs must not depend on
    # this machine's speed.
    os.environ["EDGEKIT_MEASURE"] = "0"


@pytest.fixture(scope="session")
def cache_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # A fresh build cache per run, so the build is tested from scratch; EDGEKIT_TEST_CACHE
    # names a cache to keep between runs while working on something else.
    kept = os.environ.get("EDGEKIT_TEST_CACHE")
    return {**os.environ, "EDGEKIT_CACHE": kept or str(tmp_path_factory.mktemp("cache"))}


def edgekit(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EDGEKIT, *args], capture_output=True, text=True, env=env, timeout=1200, cwd=ROOT)  # type: ignore[list-item]


def build_json(
    env: dict[str, str], model: Path, device: str, out: Path, key: Path, *options: str
) -> tuple[Path, dict[str, Any]]:
    """``edgekit build --model model --device device -o out --sign-key key --json`` and ``options``.

    Asserts that it succeeded; returns the bundle's folder and the build's JSON report.
    """
    r = edgekit(
        env,
        "build",
        "--model",
        str(model),
        "--device",
        device,
        *options,
        "-o",
        str(out),
        "--sign-key",
        str(key),
        "--json",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return out, json.loads(r.stdout)


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory, cache_env: dict[str, str]) -> tuple[Path, Path]:
    stem = tmp_path_factory.mktemp("keys") / "builder"
    r = edgekit(cache_env, "keys", "generate", "--out", str(stem))
    assert r.returncode == 0, r.stderr
    shutil.copy(f"{stem}.pub.pem", Path(os.environ["EDGEKIT_TRUST"]) / "builder.pub.pem")
    return Path(f"{stem}.pem"), Path(f"{stem}.pub.pem")


@pytest.fixture(scope="session")
def x86_bundle(
    tmp_path_factory: pytest.TempPathFactory, cache_env: dict[str, str], keys: tuple[Path, Path]
) -> tuple[Path, dict[str, Any]]:
    return build_json(cache_env, CARD, "x86_64-cpu", tmp_path_factory.mktemp("bundles") / "enl0-x86", keys[0])


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the run; each test takes a fresh database of it."""
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fleet store's URL, once for SQLite and once for PostgreSQL: the store's tests run on both."""
    if request.param == "sqlite":
        return str(tmp_path / "fleet.db")
    server: PostgresServer = request.getfixturevalue("pg_server")
    return server.new_database()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """A real Mosquitto for one test (skipped, by the hooks above, where mosquitto is not installed)."""
    b = Mosquitto(tmp_path).start()
    try:
        yield b
    finally:
        b.stop()
