"""Secrets stay off command lines, out of logs and out of what a device publishes.

The end-to-end test runs two real ``edgekit agent run`` processes against a real Mosquitto
with TLS and password authentication, each running its pipeline child on a real MJPEG
camera whose URL holds a password and a ``?token=``:

- cam-8 is set up as the shipped unit is: EDGEKIT_MQTT without a password, the password as
  the systemd credential ``$CREDENTIALS_DIRECTORY/mqtt-password``, the source in EDGEKIT_SOURCE;
- cam-9 is given everything on its command line, the MQTT password in the URL.

Neither password nor token may show in ``ps`` for any process but cam-9's agent itself (what
it was started with), nor in the agents' logs; yet both children authenticate (telemetry
flows) and the retained birth names the camera with its secrets masked.  The rest are
unit tests: the redaction of GStreamer strings and query tokens, the credentials file,
the trust store's ownership, the TensorRT engine cache's hash check.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mjpeg_server import MjpegCamera

from edgekit.core.redact import has_secret, on_command_line, redact_source, redact_url, without_password
from edgekit.errors import DeployError
from edgekit.protocol.broker import BrokerConfig, password_from_environment, warn_if_on_command_line
from edgekit.testing.mosquitto import secure_mosquitto

from conftest import EDGEKIT, ROOT, edgekit

MQTT_PW = "Mqtt-Pw-7f3a9c"
CAM_PW = "Cam-Pw-51be20"
TOKEN = "Tok-e88d41c2"
SECRETS = (MQTT_PW, CAM_PW, TOKEN)
FLEET = "lab"


# -- the one redaction function -----------------------------------------------------------------


EXAMPLES = [  # (a source or URL, how it may be shown)
    (
        "rtspsrc location=rtsp://admin:S1@10.0.0.9:554/s1 latency=0 ! decodebin ! videoconvert ! appsink",
        "rtspsrc location=rtsp://admin:***@10.0.0.9:554/s1 latency=0 ! decodebin ! videoconvert ! appsink",
    ),
    (
        'rtspsrc location="rtsp://cam/s1" user-id=S1 user-pw="S2 S3" ! appsink',
        'rtspsrc location="rtsp://cam/s1" user-id=*** user-pw="***" ! appsink',
    ),
    (
        "rtspsrc location=rtsp://cam/s1 proxy-id=S1 proxy-pw=S2 password=S3 ! appsink",
        "rtspsrc location=rtsp://cam/s1 proxy-id=*** proxy-pw=*** password=*** ! appsink",
    ),
    (
        "souphttpsrc location=https://cam/mjpg?token=S1&fps=5 ! jpegdec ! appsink",
        "souphttpsrc location=https://cam/mjpg?token=***&fps=5 ! jpegdec ! appsink",
    ),
    (
        "rtsp://cam/s1?access_token=S1&key=S2&sig=S3&password=S4&api_key=S5",
        "rtsp://cam/s1?access_token=***&key=***&sig=***&password=***&api_key=***",
    ),
    (
        "https://s3/b.tar.gz?X-Amz-Credential=S1&X-Amz-Signature=S2&v=2",
        "https://s3/b.tar.gz?X-Amz-Credential=***&X-Amz-Signature=***&v=2",
    ),
    ("rtsp://admin:S1@S2@cam/s1", "rtsp://admin:***@cam/s1"),  # an unescaped "@" in the password
    ("mqtts://cam-1@broker:8883", "mqtts://cam-1@broker:8883"),  # a user alone is kept
    ("x264enc pass=quant key-int-max=30 ! fakesink", "x264enc pass=quant key-int-max=30 ! fakesink"),
    ("synthetic:640x480@30", "synthetic:640x480@30"),
    ("/data/clips/cam-3", "/data/clips/cam-3"),
]


@pytest.mark.parametrize(("text", "shown"), EXAMPLES)
def test_sources_and_urls_are_shown_without_their_secrets(text: str, shown: str) -> None:
    assert redact_source(text) == shown
    assert "S1" not in shown and "S2" not in shown
    assert has_secret(text) == (shown != text)


def test_a_url_loses_its_password_and_keeps_its_user() -> None:
    assert redact_url("mqtts://cam-1:hunter2@broker:8883") == "mqtts://cam-1:***@broker:8883"
    argv = "edgekit run b --mqtt mqtts://u:hunter2@h:8883 --source rtsp://a:b@cam/s?token=t"
    assert (
        redact_url(argv) == "edgekit run b --mqtt mqtts://u:***@h:8883 --source rtsp://a:***@cam/s?token=***"
    )
    assert without_password("mqtts://cam-1:hunter2@broker:8883/") == "mqtts://cam-1@broker:8883/"
    assert without_password("mqtts://u%40x:p@w@h") == "mqtts://u%40x@h"
    assert without_password("mqtt://broker:1883") == "mqtt://broker:1883"
    source = "rtsp://cam/s1?token=t"
    assert on_command_line(source, ["edgekit", "run", "--source", source])
    assert not on_command_line(source, ["edgekit", "run"])
    assert not on_command_line("rtsp://cam/s1", ["--source", "rtsp://cam/s1"])  # nothing secret in it


def test_the_password_comes_from_the_environment_or_a_systemd_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("EDGEKIT_MQTT_PASSWORD", raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    assert password_from_environment() is None
    (tmp_path / "mqtt-password").write_text(f"{MQTT_PW}\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert BrokerConfig.from_url("mqtts://cam-1@h").password == MQTT_PW
    monkeypatch.setenv("EDGEKIT_MQTT_PASSWORD", "from-env")  # the environment first
    assert BrokerConfig.from_url("mqtts://cam-1@h").password == "from-env"
    monkeypatch.delenv("EDGEKIT_MQTT_PASSWORD")
    (tmp_path / "mqtt-password").write_text("")  # an empty credential: no password
    assert password_from_environment() is None
    # A password on the command line still works, with a warning that never repeats it.
    url = f"mqtts://cam-1:{MQTT_PW}@h:8883"
    with caplog.at_level(logging.WARNING):
        assert warn_if_on_command_line(url, ["edgekit", "run", "--mqtt", url])
        assert not warn_if_on_command_line(url, ["edgekit", "run"])
        assert not warn_if_on_command_line("mqtts://cam-1@h", ["--mqtt", "mqtts://cam-1@h"])
    assert "command line" in caplog.text and "cam-1:***@h" in caplog.text and MQTT_PW not in caplog.text


def test_fleet_serve_warns_of_a_database_password_on_its_command_line_as_of_the_mqtt_one(
    tmp_path: Path,
) -> None:
    # The real CLI: both URLs carry a password; both are warned about, in the same words, and
    # neither password is repeated.  Nothing listens on port 1, so the store fails to open after.
    db_pw = "Db-Pw-0c4e17"
    r = subprocess.run(
        [*EDGEKIT, "fleet", "serve", "--mqtt", f"mqtt://collector:{MQTT_PW}@127.0.0.1:1",
         "--db", f"postgresql://fleet:{db_pw}@127.0.0.1:1/fleet", "--port", "0"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={k: v for k, v in os.environ.items() if k not in ("PGPASSWORD", "EDGEKIT_FLEET_DB")},
    )  # fmt: skip
    said = r.stdout + r.stderr
    assert r.returncode != 0 and "Traceback" not in said, said[-3000:]
    where = "is on the command line, where ps and /proc/<pid>/cmdline show it to every user"
    assert f"the MQTT password in mqtt://collector:***@127.0.0.1:1 {where}" in said, said[-3000:]
    assert f"the database password in postgresql://fleet:***@127.0.0.1:1/fleet {where}" in said, said[-3000:]
    assert "PGPASSWORD" in said and db_pw not in said and MQTT_PW not in said


# -- the trust store belongs to root ---------------------------------------------------------------


def test_a_system_trust_store_the_agents_user_could_change_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from edgekit.deploy import StateRoot, keystore

    if os.geteuid() != 0:
        pytest.skip("making files of another user takes root")
    agent_uid = 4242
    state = StateRoot(tmp_path / "root")
    key = state.keys_dir / "k1.pub.pem"
    key.write_text("-----BEGIN PUBLIC KEY-----\n")
    os.chown(state.keys_dir, agent_uid, agent_uid)  # what an agent that made keys/ itself leaves
    assert "agent's own user" in (keystore.trust_store_problem(state.keys_dir, agent_uid) or "")
    os.chown(state.keys_dir, 0, 0)
    state.keys_dir.chmod(0o775)
    assert "writable by its group" in (keystore.trust_store_problem(state.keys_dir, agent_uid) or "")
    state.keys_dir.chmod(0o755)
    key.chmod(0o644)
    assert keystore.trust_store_problem(state.keys_dir, agent_uid) is None
    os.chown(key, agent_uid, 0)
    assert "k1.pub.pem belongs to uid 4242" in (keystore.trust_store_problem(state.keys_dir, agent_uid) or "")
    assert keystore.trust_store_problem(state.keys_dir, 0) is None  # root may change anything anyway

    # Another root than the system one is the user's own business; the system one is checked.
    keystore.check_trust_store(state.path, state.keys_dir, agent_uid)
    monkeypatch.setattr(keystore, "SYSTEM_ROOT", state.path)
    with pytest.raises(DeployError, match="not safe") as err:
        keystore.check_trust_store(state.path, state.keys_dir, agent_uid)
    assert "sudo chown -R root:root" in err.value.hint
    # An agent that is not root trusts no key from such a store (every install is refused).
    monkeypatch.setattr(keystore.os, "geteuid", lambda: agent_uid)
    with caplog.at_level(logging.ERROR):
        assert state.trusted_keys() == []
    assert "not safe" in caplog.text
    with pytest.raises(DeployError, match="root's") as err:
        keystore.require_root_for(state.path)  # `edgekit agent trust` as the agent's user
    assert "sudo edgekit agent trust" in err.value.hint


def test_agent_trust_as_root_makes_keys_roots(
    tmp_path: Path, keys: tuple[Path, Path], cache_env: dict[str, str]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("checks what root's `edgekit agent trust` writes")
    keys_dir = tmp_path / "root" / "keys"
    keys_dir.mkdir(parents=True)
    os.chown(keys_dir, 4242, 4242)  # made by the agent's user, as the agent's first start does
    keys_dir.chmod(0o775)
    r = edgekit(cache_env, "agent", "trust", str(keys[1]), "--root", str(tmp_path / "root"), "--json")
    assert r.returncode == 0, r.stderr
    dest = Path(json.loads(r.stdout)["file"])
    for path, mode in ((keys_dir, 0o755), (dest, 0o644)):
        st = path.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, mode), path


# -- the TensorRT engine cache --------------------------------------------------------------------


def test_a_cached_engine_is_loaded_only_when_its_hash_matches(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from edgekit.backends.tensorrt.cache import _read_cached, _sidecar, _write_atomically

    engine = tmp_path / "cache" / "abc-trt10.3-orin-fp16.engine"
    plan = b"\x00serialized engine\xff" * 100
    _write_atomically(engine, plan)
    assert _read_cached(engine) == plan and _sidecar(engine).is_file()
    assert stat.S_IMODE(engine.stat().st_mode) == 0o600
    with engine.open("r+b") as f:  # one byte changed on disk (or by someone else)
        f.seek(7)
        f.write(b"X")
    with caplog.at_level(logging.WARNING):
        assert _read_cached(engine) is None
    assert "not loading it, rebuilding" in caplog.text
    assert not engine.exists() and not _sidecar(engine).exists()
    _write_atomically(engine, plan)
    _sidecar(engine).unlink()  # an engine from before hashes (or a torn write): never trusted
    assert _read_cached(engine) is None and "no recorded SHA-256" in caplog.text
    _write_atomically(engine, plan)
    _write_atomically(engine, plan + b"v2")  # rewritten: the sidecar follows
    assert _read_cached(engine) == plan + b"v2"
    assert _read_cached(tmp_path / "missing.engine") is None


# -- end to end: agents, children, the broker, the logs ------------------------------------------


class Watcher:
    """Everything published under edgekit/v1/lab/#, as the ``watcher`` user sees it."""

    def __init__(self, broker: BrokerConfig) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self.client = broker.client("secrets-watcher")
        self.client.on_connect = lambda c, *a: c.subscribe(f"edgekit/v1/{FLEET}/#", qos=1)
        self.client.on_message = self._on_message
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        try:
            body = json.loads(msg.payload)
        except ValueError:
            return
        with self._lock:
            self.messages.append((msg.topic, body))

    def of(self, device: str, leaf: str) -> list[dict[str, Any]]:
        with self._lock:
            return [b for t, b in self.messages if t == f"edgekit/v1/{FLEET}/{device}/{leaf}"]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait_for(check: Any, timeout: float) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    return None


@pytest.fixture(scope="module")
def installed_root(
    tmp_path_factory: pytest.TempPathFactory,
    x86_bundle: tuple[Path, dict[str, Any]],
    keys: tuple[Path, Path],
    cache_env: dict[str, str],
) -> Path:
    from deploy_bundles import slim_bundle

    work = tmp_path_factory.mktemp("secrets-root")
    bundle = slim_bundle(x86_bundle[0], work / "v1", keys[0])
    root = work / "root"
    r = edgekit(cache_env, "agent", "trust", str(keys[1]), "--root", str(root))
    assert r.returncode == 0, r.stderr
    r = edgekit(cache_env, "agent", "install", str(bundle), "--root", str(root), "--id", "v1",
                "--device", "x86_64-cpu", "--json")  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return root


@pytest.fixture(scope="module")
def camera() -> Iterator[MjpegCamera]:
    rng = np.random.default_rng(3)
    cam = MjpegCamera([rng.integers(0, 255, (96, 128, 3), dtype=np.uint8) for _ in range(4)], fps=10)
    cam.start()
    yield cam
    cam.stop()


def test_no_password_reaches_a_command_line_or_a_log_and_the_children_still_authenticate(
    tmp_path: Path, installed_root: Path, camera: MjpegCamera, cache_env: dict[str, str]
) -> None:
    import shutil

    (tmp_path / "broker").mkdir()
    broker, ca = secure_mosquitto(
        tmp_path / "broker",
        {"cam-8": MQTT_PW, "cam-9": MQTT_PW, "watcher": "watcher-pw"},
        "user watcher\ntopic read edgekit/v1/#\n\npattern readwrite edgekit/v1/+/%u/#\n",
    )
    source = camera.url.replace("http://", f"http://viewer:{CAM_PW}@") + f"?token={TOKEN}&fps=10"
    host = f"127.0.0.1:{broker.port}"
    creds = tmp_path / "credentials"
    creds.mkdir(mode=0o700)
    (creds / "mqtt-password").write_text(MQTT_PW + "\n")
    base = {
        k: v
        for k, v in cache_env.items()
        if k not in ("EDGEKIT_MQTT_PASSWORD", "EDGEKIT_MQTT", "EDGEKIT_SOURCE")
    }
    common = [
        "--fleet",
        FLEET,
        "--profile",
        "x86_64-cpu",
        "--telemetry-interval",
        "0.5",
        "--mqtt-ca",
        str(ca),
    ]
    setups = {
        # As the shipped unit runs it: no secret in its argv at all.
        "cam-8": (
            ["--device-id", "cam-8"],
            {
                "EDGEKIT_MQTT": f"mqtts://cam-8@{host}",
                "CREDENTIALS_DIRECTORY": str(creds),
                "EDGEKIT_SOURCE": source,
            },
        ),
        # Everything on the command line (the old unit's way): warned about, kept from the child and the log.
        "cam-9": (
            ["--device-id", "cam-9", "--mqtt", f"mqtts://cam-9:{MQTT_PW}@{host}", "--source", source],
            {},
        ),
    }
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}
    watcher = Watcher(
        BrokerConfig(
            "127.0.0.1", broker.port, tls=True, username="watcher", password="watcher-pw", ca_file=ca
        )
    )
    try:
        for device, (args, env) in setups.items():
            root = tmp_path / f"root-{device}"
            shutil.copytree(installed_root, root, symlinks=True)
            logs[device] = tmp_path / f"agent-{device}.log"
            procs[device] = subprocess.Popen(
                [*EDGEKIT, "agent", "run", "--root", str(root), *common, *args],
                env={**base, **env, "EDGEKIT_CACHE": str(tmp_path / "cache" / device),
                     "EDGEKIT_STATE": str(tmp_path / "state" / device)},
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=logs[device].open("w"),
            )  # fmt: skip
        for device in setups:  # both children connected with the password they were handed
            assert wait_for(lambda d=device: len(watcher.of(d, "telemetry")) >= 2, 240), logs[
                device
            ].read_text()[-3000:]
        children = {
            d: [c for c in descendants(p.pid) if "edgekit.cli run" in cmdline(c)] for d, p in procs.items()
        }
        for device, kids in children.items():
            assert kids, f"{device}: no pipeline child"
            line = cmdline(kids[0])
            assert f"mqtts://{device}@{host}" in line and "***" not in line, line
            environ = Path(f"/proc/{kids[0]}/environ").read_bytes().split(b"\0")
            assert f"EDGEKIT_MQTT_PASSWORD={MQTT_PW}".encode() in environ  # how it got the password
        # ps, every process: no secret but on the command line cam-9's agent was started with.
        ps = subprocess.run(
            ["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True, check=True
        ).stdout
        for row in ps.splitlines():
            pid, _, args = row.strip().partition(" ")
            if int(pid) != procs["cam-9"].pid:
                assert not any(s in args for s in SECRETS), row
        assert MQTT_PW in cmdline(procs["cam-9"].pid)  # (so the scan above did look at the right thing)
        for device in setups:
            birth = [m for m in watcher.of(device, "status") if m.get("state") == "online"]
            assert birth, watcher.of(device, "status")
            shown = birth[0]["source"]
            assert shown.startswith("http://viewer:***@127.0.0.1") and "token=***" in shown, shown
            assert not any(s in json.dumps(birth[0]) for s in SECRETS)
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
        watcher.close()
        broker.stop()
    texts = {d: p.read_text() for d, p in logs.items()}
    for text in texts.values():
        assert not any(s in text for s in SECRETS), text[-3000:]
        assert "starting the pipeline" in text, text[-3000:]  # the child's command line, logged
    assert "on the command line, where ps" in texts["cam-9"] and f"cam-9:***@{host}" in texts["cam-9"]
    assert "the password or token in the source http://viewer:***@127.0.0.1" in texts["cam-9"]
    assert "on the command line" not in texts["cam-8"]


def test_mosquitto_refuses_a_wrong_password(tmp_path: Path) -> None:
    """The broker above really checks passwords (else the children's telemetry would prove nothing)."""
    broker, ca = secure_mosquitto(tmp_path, {"cam-8": MQTT_PW}, "pattern readwrite edgekit/v1/+/%u/#\n")
    try:
        results: list[Any] = []
        done = threading.Event()
        client = BrokerConfig(
            "127.0.0.1", broker.port, tls=True, username="cam-8", password="wrong", ca_file=ca
        ).client("wrong-pw")
        client.on_connect = lambda c, u, f, reason, p: (results.append(reason), done.set())
        client.connect("127.0.0.1", broker.port)
        client.loop_start()
        done.wait(10)
        client.loop_stop()
        assert results and results[0].is_failure
    finally:
        broker.stop()
