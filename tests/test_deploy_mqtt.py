"""Fleet deploys over MQTT: a real Mosquitto, ``edgekit fleet serve --artifacts``, and ``edgekit agent run`` processes.

Three agents (cam-1, cam-2, cam-3 in group "lab"), each with its own state root holding v1
(installed once with ``edgekit agent install``, then copied), each running v1 on a small
synthetic source and reporting telemetry.  The tests run in file order on one fleet:
bad commands, a canary that breaks its SLO, a healthy rollout, a download that resumes.
The first few tests need no processes: the command checks, the artifact routes, the download.
Every command is signed with the test key the agents trust (``signed``; ``edgekit deploy
--sign-key``), and the agents fetch only from the artifact server and one port kept for
``FlakyServer`` (``--artifact-origin``).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from edgekit.testing.mosquitto import Mosquitto, free_port
from edgekit.testing.process import stop_process

from conftest import EDGEKIT, ROOT, edgekit

FLEET = "lab"
DEVICES = ("cam-1", "cam-2", "cam-3")
PROFILE = "x86_64-cpu"
BUDGET_MS = 2000.0


def wait_for(check: Callable[[], Any], timeout: float, every: float = 0.2) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(every)
    return None


# -- bundles ------------------------------------------------------------------------------------


def with_version(
    bundle: Path,
    out: Path,
    version: str,
    private_key: Path,
    budget_ms: float | None = None,
    serial: int | None = None,
) -> Path:
    """A copy of ``bundle`` whose manifest says ``version`` (and ``budget_ms``, ``serial``), signed again with ``private_key``."""
    from edgekit.bundle.keys import key_id, load_private_key, sign
    from edgekit.bundle.manifest import MANIFEST_FILE, SIGNATURE_FILE

    key = load_private_key(private_key)
    shutil.copytree(bundle, out)
    doc = json.loads((out / MANIFEST_FILE).read_text())
    doc["model"]["version"] = version
    if budget_ms is not None:
        doc["device"]["budget_ms"] = budget_ms
    if serial is not None:
        doc["build"]["serial"] = serial
    doc["signature"] = {"key_id": key_id(key.public_key())}
    data = json.dumps(doc, indent=2).encode()
    (out / MANIFEST_FILE).write_bytes(data)
    (out / SIGNATURE_FILE).write_bytes(sign(key, data))
    return out


def version_of(bundle: Path) -> str:
    from edgekit.bundle.manifest import read_manifest

    return read_manifest(bundle).model.version


def two_versions(base: Path, work: Path, private_key: Path) -> tuple[Path, Path]:
    """v1 and v2 of ``base``, signed, with a budget this shared machine always meets (the rollout is tested).

    v2 is the newer release (its serial one above v1's): a device that took v2 refuses v1 again.
    """
    from edgekit.bundle.manifest import read_manifest

    serial = read_manifest(base).build.serial
    v1 = with_version(
        base, work / "enl0-v1", version_of(base), private_key, budget_ms=BUDGET_MS, serial=serial
    )
    v2 = with_version(
        base, work / "enl0-v2", version_of(base) + "-v2", private_key, budget_ms=BUDGET_MS, serial=serial + 1
    )
    return v1, v2


def agent_root(
    root: Path, public_key: Path, env: dict[str, str], installs: Sequence[tuple[Path, str]]
) -> Path:
    """A state root that trusts ``public_key`` with each (bundle, deploy id) installed in turn."""
    r = edgekit(env, "agent", "trust", str(public_key), "--root", str(root))
    assert r.returncode == 0, r.stderr
    for bundle, deploy_id in installs:
        r = edgekit(env, "agent", "install", str(bundle), "--root", str(root), "--id", deploy_id,
                    "--device", PROFILE, "--json")  # fmt: skip
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return root


def signed(body: dict[str, Any], private_key: Path, ttl_s: float = 600.0) -> bytes:
    """``body`` stamped with ``expires_at`` and a fresh ``nonce``, signed as ``edgekit deploy --sign-key`` signs."""
    import base64

    from edgekit.bundle.keys import load_private_key
    from edgekit.protocol.control import new_nonce, signed_bytes

    body = dict(body)
    body.setdefault("expires_at", round(time.time() + ttl_s, 3))
    body.setdefault("nonce", new_nonce())
    body["signature"] = base64.b64encode(load_private_key(private_key).sign(signed_bytes(body))).decode()
    return json.dumps(body).encode()


def pack(bundle: Path, out: Path) -> tuple[Path, str, int]:
    from edgekit.bundle.archive import pack as pack_bundle

    pack_bundle(bundle, out)
    data = out.read_bytes()
    return out, hashlib.sha256(data).hexdigest(), len(data)


# -- an HTTP server that cuts transfers off, on purpose ------------------------------------------


class FlakyServer:
    """Serves one file with Range support; ``cut`` transfers send only half the body, then close."""

    def __init__(self, path: Path, port: int = 0) -> None:
        self.path = path
        self.cut = 0  # how many of the next full-body transfers to cut off
        self.requests: list[dict[str, str | None]] = []
        data = path.read_bytes
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                body = data()
                rng = self.headers.get("Range")
                server.requests.append({"path": self.path, "range": rng})
                start = int(rng.split("=")[1].split("-")[0]) if rng else 0
                self.send_response(206 if rng else 200)
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                if server.cut > 0:
                    server.cut -= 1
                    self.wfile.write(body[start : start + (len(body) - start) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body[start:])

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/{path.name}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# -- cheap checks: no broker, no agent -------------------------------------------------------------


def command(**fields: Any) -> bytes:
    body = {
        "schema": "edgekit/v1/cmd",
        "id": "d-1",
        "action": "deploy",
        "fleet": "lab",
        "device": "cam-1",
        "url": "http://10.0.0.1:8765/artifacts/b.tar.gz",
        "sha256": "a" * 64,
        "size": 1000,
    }
    body.update(fields)
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


@pytest.mark.parametrize(
    ("payload", "said", "answer_to"),
    [
        (b"{not json", "unreadable command", None),
        (b"x" * 20000, "more than the 16384", None),
        (b'{"schema": "edgekit/v1/cmd", "id": "a", "id": "b"}', "appears twice", None),
        (b'{"size": NaN}', "unreadable", None),
        (b"[1, 2]", "not a JSON object", None),
        (b"\xff\xfe", "not UTF-8", None),
        (b"[" * 5000 + b"]" * 5000, "unreadable", None),
        (command(schema="edgekit/v0/cmd"), "schema", "d-1"),
        (command(id="../../etc/passwd"), "deploy id", None),
        (command(id=".."), "deploy id", None),
        (command(id="x" * 65), "deploy id", None),
        (command(device="cam-9"), "is for device 'cam-9'", "d-1"),
        (command(fleet="prod"), "is for fleet 'prod', this device is in 'lab'", "d-1"),
        (command(fleet=...), "names no fleet", "d-1"),
        (command(action="exec"), "unknown action", "d-1"),
        (command(url="file:///etc/shadow"), "not an http(s) URL", "d-1"),
        (command(url="ftp://h/b.tar.gz"), "not an http(s) URL", "d-1"),
        (command(url="http://h/a b"), "spaces or control", "d-1"),
        (command(url=...), "needs the bundle's url", "d-1"),
        (command(sha256="A" * 64), "sha256", "d-1"),
        (command(sha256="a" * 63), "sha256", "d-1"),
        (command(size=True), "size", "d-1"),
        (command(size=-1), "size", "d-1"),
        (command(size="1000"), "size", "d-1"),
        (command(signature="not base64!"), "signature", "d-1"),
        (command(issued_at="yesterday"), "issued_at", "d-1"),
    ],
)
def test_a_command_is_checked_field_by_field_and_answers_to_its_id_when_it_can(
    payload: bytes, said: str, answer_to: str | None
) -> None:
    from edgekit.protocol.control import CommandError, parse_command

    with pytest.raises(CommandError) as caught:
        parse_command(payload, "cam-1", "lab")
    assert said in caught.value.message and caught.value.hint
    assert caught.value.deploy_id == answer_to


def test_good_commands_parse_and_unknown_fields_are_ignored() -> None:
    from edgekit.protocol.control import parse_command, rollback_message

    cmd = parse_command(command(extra={"future": 1}), "cam-1", "lab")
    assert (cmd.id, cmd.action, cmd.size, cmd.url) == (
        "d-1",
        "deploy",
        1000,
        "http://10.0.0.1:8765/artifacts/b.tar.gz",
    )
    rb = rollback_message("d-1-rb", "cam-1", fleet="lab")
    assert parse_command(rb.to_json(), "cam-1", "lab") == rb


def test_the_wire_formats_follow_their_json_schemas() -> None:
    import jsonschema

    from edgekit.protocol.control import deploy_message, result_message

    schemas = ROOT / "edgekit" / "protocol" / "schema"

    def check(name: str, doc: dict[str, Any]) -> None:
        schema = json.loads((schemas / name).read_text())
        jsonschema.Draft202012Validator(schema).validate(doc)

    check(
        "cmd.schema.json",
        deploy_message("d-1", "cam-1", "https://h/a.tar.gz", "b" * 64, 5, 60, fleet="lab").to_dict(),
    )
    check(
        "cmd-result.schema.json", result_message("cam-1", None, "command", final=True, ok=False, reason="x")
    )
    check(
        "cmd-result.schema.json", result_message("cam-1", "d-1", "download", final=False, info={"bytes": 1})
    )


def test_the_artifact_routes_serve_ranges_and_heads_and_refuse_paths_outside(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from edgekit.fleet.artifacts import artifacts_app, name_artifact

    folder = tmp_path / "artifacts"
    folder.mkdir()
    (folder / "b-1.tar.gz").write_bytes(bytes(range(256)) * 40)
    (tmp_path / "secret").write_text("key")
    (folder / "link.tar.gz").symlink_to(tmp_path / "secret")
    (folder / "unnamed.tar.gz").write_bytes(b"not named by a rollout")
    name_artifact(folder, "b-1.tar.gz", "0" * 64, 10240)
    name_artifact(folder, "link.tar.gz", "0" * 64, 3)  # named, but a link: still not served
    client = TestClient(artifacts_app(folder))
    whole = client.get("/b-1.tar.gz")
    assert whole.status_code == 200 and len(whole.content) == 10240
    assert whole.headers["accept-ranges"] == "bytes"
    part = client.get("/b-1.tar.gz", headers={"Range": "bytes=10000-"})
    assert part.status_code == 206 and part.content == whole.content[10000:]
    assert part.headers["content-range"] == "bytes 10000-10239/10240"
    assert client.get("/b-1.tar.gz", headers={"Range": "bytes=20000-"}).status_code == 416
    head = client.head("/b-1.tar.gz")
    assert head.status_code == 200 and head.headers["content-length"] == "10240" and not head.content
    for bad in (
        "/link.tar.gz",
        "/..%2Fsecret",
        "/.hidden",
        "/nope.tar.gz",
        "/unnamed.tar.gz",
        "/.edgekit-named.json",
    ):
        assert client.get(bad).status_code in (400, 404), bad
    assert client.get("/").json() == {"artifacts": [{"name": "b-1.tar.gz", "size": 10240}]}


def test_a_download_cut_off_midway_resumes_with_a_range_request(tmp_path: Path) -> None:
    from edgekit.deploy.download import DownloadError, download, parse_origin

    blob = tmp_path / "b.tar.gz"
    blob.write_bytes(os.urandom(300_000))
    sha = hashlib.sha256(blob.read_bytes()).hexdigest()
    server = FlakyServer(blob)
    origins = [parse_origin(server.url.rsplit("/", 1)[0])]
    try:
        server.cut = 1
        got = download(
            server.url, tmp_path / "incoming", sha256=sha, size=300_000, origins=origins, backoff_s=0.05
        )
        assert got.read_bytes() == blob.read_bytes()
        assert [r["range"] for r in server.requests] == [None, "bytes=150000-"]
        # Always cut off: a failure that says nothing the server said, and nothing of it is kept.
        server.requests.clear()
        server.cut = 99
        with pytest.raises(DownloadError) as failed:
            download(server.url, tmp_path / "in2", sha256=sha, size=300_000, origins=origins, attempts=3,
                     backoff_s=0.05)  # fmt: skip
        assert failed.value.message == "download failed" and "in 3 attempts" in failed.value.detail
        assert not list((tmp_path / "in2").iterdir())
        # The wrong bytes: refused, nothing kept.
        server.cut = 0
        with pytest.raises(DownloadError, match="hash mismatch") as wrong:
            download(server.url, tmp_path / "in3", sha256="0" * 64, size=300_000, origins=origins,
                     backoff_s=0.05)  # fmt: skip
        assert sha not in wrong.value.message and sha in wrong.value.detail
        assert not list((tmp_path / "in3").iterdir())
        with pytest.raises(DownloadError, match="hash mismatch") as short:
            download(server.url, tmp_path / "in4", sha256=sha, size=5, origins=origins, backoff_s=0.05)
        assert "300000" not in short.value.message
        with pytest.raises(DownloadError, match="limit"):
            download(server.url, tmp_path / "in5", sha256=sha, size=300_000, origins=origins, max_bytes=1000)
        # Off the origin list: refused before any connection.
        server.requests.clear()
        with pytest.raises(DownloadError, match="refused: origin not allowed"):
            download(server.url, tmp_path / "in6", sha256=sha, size=300_000, origins=[])
        assert server.requests == []
    finally:
        server.close()


def test_canary_share_and_durations() -> None:
    from edgekit.core.units import parse_seconds
    from edgekit.deploy.members import canary_count, parse_share
    from edgekit.errors import DeployError, EdgekitError

    assert [canary_count(n, 0.1) for n in (0, 1, 3, 10, 11)] == [0, 1, 1, 1, 2]
    assert parse_share("10%") == pytest.approx(0.1) and parse_share("0.25") == 0.25
    assert parse_seconds("2m", "--canary-window") == 120 and parse_seconds("1d", "--keep") == 86400
    for nonsense in ("0s", "-5m", "nan", "soon", ""):
        with pytest.raises(EdgekitError, match="is not a duration"):
            parse_seconds(nonsense, "--canary-window")
    for bad in ("0%", "150%", "lots"):
        with pytest.raises(DeployError):
            parse_share(bad)


def test_the_canary_window_counts_only_the_new_versions_windows_once_each() -> None:
    from edgekit.core.sketch import LatencySketch
    from edgekit.deploy.canary import CanaryWatch
    from edgekit.deploy.link import Telemetry
    from edgekit.protocol.stages import STAGES
    from edgekit.protocol.topics import schema

    def window(session: str, seq: int, values: list[float], missed: int = 0) -> Telemetry:
        sketch = LatencySketch()
        sketch.extend(values)
        latency = sketch.to_dict()
        body = {
            "schema": schema("telemetry"),
            "device": "cam-1",
            "fleet": "lab",
            "session": session,
            "epoch": "e1",
            "seq": seq,
            "window": {
                "start": 1000.0 + seq,
                "end": 1001.0 + seq,
                "frames": len(values),
                "missed": missed,
                "latency_ms": latency,
                "stages_ms": {stage: latency for stage in STAGES},
            },
            "counters": {},
        }
        return Telemetry(session, json.dumps(body).encode())

    births = {
        "old": {"model": {"version": "1"}, "budget_ms": 50},
        "crashed-old": {"model": {"version": "1"}, "budget_ms": 50},
        "new": {"model": {"version": "2"}, "budget_ms": 40},
    }
    messages = [
        window("old", 1, [500.0] * 10),
        window("crashed-old", 2, [500.0] * 10),
        window("new", 3, [10.0] * 99 + [30.0]),
        window("new", 3, [10.0] * 99 + [30.0]),  # the same window again (a replay)
        window("new", 4, [12.0] * 100, missed=1),
    ]
    watch = CanaryWatch("lab")
    h = watch.health("cam-1", births, messages, {"old"}, "2")
    assert (h.sessions, h.frames, h.missed, h.windows, h.budget_ms) == (["new"], 200, 1, 2, 40.0)
    assert h.p95_ms == pytest.approx(12.0, rel=0.02)
    assert watch.judge(h) is None  # 0.5% missed, p95 within 40 ms
    strict = CanaryWatch("lab", slo_p95_ms=11.0)
    h = strict.health("cam-1", births, messages, {"old"}, "2")
    assert "p95" in (strict.judge(h) or "")
    # A window may come before its session's birth is heard: it counts once the birth comes.
    messages.append(window("newer", 5, [10.0] * 10, missed=5))
    h = watch.health("cam-1", births, messages, {"old"}, "2")
    assert (h.frames, h.windows) == (200, 2)
    births["newer"] = {"model": {"version": "2"}, "budget_ms": 40}
    h = watch.health("cam-1", births, messages, {"old"}, "2")
    assert (h.sessions, h.frames, h.missed, h.windows) == (["new", "newer"], 210, 6, 3)
    assert "missed the budget" in (watch.judge(h) or "")


# -- the fleet: broker, artifact server, three agents ----------------------------------------------


class Observer:
    """Records every message of the fleet, in the order the broker delivers them."""

    def __init__(self, url: str) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.messages: list[tuple[float, str, bytes]] = []
        self.lock = threading.Lock()
        self.ready = threading.Event()
        port = int(url.rsplit(":", 1)[1])
        self.client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="test-observer")
        self.client.on_connect = lambda c, *a: c.subscribe(f"edgekit/v1/{FLEET}/#", qos=1)
        self.client.on_subscribe = lambda *a: self.ready.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self.ready.wait(10)

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        with self.lock:
            self.messages.append((time.monotonic(), msg.topic, bytes(msg.payload)))

    def publish(self, device: str, payload: bytes) -> None:
        self.client.publish(f"edgekit/v1/{FLEET}/{device}/cmd", payload, qos=1).wait_for_publish(5)

    def of(self, device: str, leaf: str) -> list[tuple[int, float, dict[str, Any]]]:
        """(position, time, body) of the JSON messages on one device's leaf."""
        want = f"edgekit/v1/{FLEET}/{device}/{leaf}"
        with self.lock:
            rows = list(enumerate(self.messages))
        out = []
        for i, (t, topic, payload) in rows:
            if topic == want and payload:
                try:
                    out.append((i, t, json.loads(payload)))
                except ValueError:
                    out.append((i, t, {"raw": payload}))
        return out

    def finals(self, device: str) -> list[dict[str, Any]]:
        return [body for _, _, body in self.of(device, "cmd/result") if body.get("final")]

    def final(self, device: str, deploy_id: str | None, timeout: float, after: int = 0) -> dict[str, Any]:
        found = wait_for(
            lambda: next((b for b in self.finals(device)[after:] if b.get("id") == deploy_id), None), timeout
        )
        assert found, f"no final result for {deploy_id} from {device}"
        return found

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@dataclass
class Agent:
    device: str
    root: Path
    log: Path
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Agent:
        self.proc = subprocess.Popen(
            self.argv, env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=self.log.open("a")
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def status(self) -> dict[str, Any]:
        from edgekit.deploy.slots import StateRoot

        return StateRoot(self.root).status()

    def record(self, deploy_id: str) -> Path:
        return self.root / "deploys" / f"{deploy_id}.json"


@dataclass
class Fleet:
    broker: Mosquitto
    server: str
    artifacts: Path
    observer: Observer
    agents: dict[str, Agent]
    v1: Path
    v2: Path
    env: dict[str, str]
    work: Path
    keys: tuple[Path, Path]
    flaky_port: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def deploy(self, *args: str) -> tuple[int, dict[str, Any], str]:
        r = edgekit(
            self.env, "deploy", "--fleet", FLEET, "--mqtt", self.broker.url, "--bundle", str(self.v2),
            "--artifacts", str(self.artifacts), "--artifact-url", f"{self.server}/artifacts", "--json",
            "--sign-key", str(self.keys[0]), *args,
        )  # fmt: skip
        lines = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
        assert lines, r.stderr[-3000:]
        return r.returncode, lines[-1], r.stderr


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
    x86_bundle: tuple[Path, dict[str, Any]],
    keys: tuple[Path, Path],
    cache_env: dict[str, str],
) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("fleet")
    # The health gate holds p99 to the bundle's budget; this 2-core machine is shared by other jobs,
    # so the test bundles carry a budget it always meets (what is tested here is the rollout).
    v1, v2 = two_versions(x86_bundle[0], work, keys[0])
    # One state root with v1 installed, copied for each agent: one health gate instead of three.
    template = agent_root(work / "template-root", keys[1], cache_env, [(v1, "v1-base")])
    broker = Mosquitto(work).start()
    artifacts = work / "artifacts"
    artifacts.mkdir()
    port = free_port()
    serve_log = (work / "serve.log").open("w")
    server_proc = subprocess.Popen(
        [*EDGEKIT, "fleet", "serve", "--mqtt", broker.url, "--db", str(work / "fleet.db"), "--port", str(port),
         "--artifacts", str(artifacts)],
        env=cache_env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=serve_log,
    )  # fmt: skip
    server = f"http://127.0.0.1:{port}"
    flaky_port = free_port()  # where the tests' FlakyServer listens: the agents' second origin
    observer = Observer(broker.url)
    agents: dict[str, Agent] = {}
    try:

        def up() -> bool:
            try:
                import urllib.request

                with urllib.request.urlopen(f"{server}/artifacts/", timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return False

        assert wait_for(up, 60), (work / "serve.log").read_text()
        for device in DEVICES:
            root = work / "roots" / device
            # Hard links: an install never rewrites a file in place (it writes the other slot,
            # renames, unlinks), and four copies of an 80 MB bundle would fill /tmp quickly.
            shutil.copytree(template, root, symlinks=True, copy_function=os.link)
            # Each agent's own cache and state: nothing shared between devices.
            env = {
                **cache_env,
                "EDGEKIT_CACHE": str(work / "cache" / device),
                "EDGEKIT_STATE": str(work / "state" / device),
            }
            argv = [*EDGEKIT, "agent", "run", "--root", str(root), "--mqtt", broker.url, "--fleet", FLEET,
                    "--device-id", device, "--group", "lab", "--profile", PROFILE,
                    "--source", "synthetic:96x96@5", "--telemetry-interval", "0.5",
                    "--download-attempts", "2", "--artifact-origin", server,
                    "--artifact-origin", f"http://127.0.0.1:{flaky_port}"]  # fmt: skip
            agents[device] = Agent(device, root, work / f"agent-{device}.log", argv, env).start()
        f = Fleet(broker, server, artifacts, observer, agents, v1, v2, cache_env, work, keys, flaky_port)
        for device in DEVICES:  # every agent online and its pipeline reporting telemetry
            assert wait_for(lambda d=device: f.observer.of(d, "telemetry"), 180), agents[
                device
            ].log.read_text()[-3000:]
            assert any(b.get("state") == "online" for _, _, b in f.observer.of(device, "agent"))
        yield f
    finally:
        for agent in agents.values():
            agent.stop()
        observer.close()
        stop_process(server_proc, grace_s=15, sig=signal.SIGINT)
        broker.stop()


def logs(fleet: Fleet) -> str:
    return "\n".join(f"--- {d}\n{a.log.read_text()[-2500:]}" for d, a in fleet.agents.items())


def test_bad_commands_each_get_a_clear_answer_and_the_agent_stays_up(fleet: Fleet) -> None:
    device, agent = "cam-3", fleet.agents["cam-3"]
    before = agent.status()
    from edgekit.fleet.artifacts import name_artifact

    v1_archive, v1_sha, v1_size = pack(fleet.v1, fleet.artifacts / "enl0-v1.tar.gz")
    name_artifact(fleet.artifacts, v1_archive.name, v1_sha, v1_size)  # served: what a rollout does
    stranger = fleet.work / "stranger"
    from edgekit.bundle.keys import generate_keypair

    other_key, _ = generate_keypair(stranger)
    unknown = with_version(fleet.v1, fleet.work / "enl0-unknown-key", "9.9.9", other_key)
    _, unknown_sha, unknown_size = pack(unknown, fleet.artifacts / "enl0-unknown.tar.gz")
    name_artifact(fleet.artifacts, "enl0-unknown.tar.gz", unknown_sha, unknown_size)
    flaky = FlakyServer(v1_archive, fleet.flaky_port)
    flaky.cut = 99  # every transfer breaks off halfway: a truncated download
    url = f"{fleet.server}/artifacts/enl0-v1.tar.gz"

    def cmd(deploy_id: str, **fields: Any) -> bytes:
        body = {"schema": "edgekit/v1/cmd", "id": deploy_id, "action": "deploy", "fleet": FLEET, "device": device,
                "url": url, "sha256": v1_sha, "size": v1_size} | fields  # fmt: skip
        return signed(body, fleet.keys[0])

    cases: list[tuple[bytes, str | None, str, str]] = [
        (b"{not json", None, "command", "unreadable command"),
        (b"{" + b" " * 20000 + b"}", None, "command", "more than the 16384"),
        (cmd("../../x"), None, "command", "deploy id"),
        (cmd("bad-schema", schema="edgekit/v9/cmd"), "bad-schema", "command", "schema"),
        (cmd("not-mine", device="cam-1"), "not-mine", "command", "is for device 'cam-1'"),
        (cmd("file-url", url="file:///etc/passwd"), "file-url", "command", "not an http(s) URL"),
        (cmd("off-list", url=f"http://127.0.0.1:{free_port()}/b.tar.gz"), "off-list", "download", "origin not allowed"),
        (cmd("not-there", url=f"{fleet.server}/artifacts/nope.tar.gz"), "not-there", "download", "download failed"),
        (cmd("wrong-sha", sha256="0" * 64), "wrong-sha", "download", "hash mismatch"),
        (cmd("truncated", url=flaky.url), "truncated", "download", "download failed"),
        (cmd("unknown-key", url=f"{fleet.server}/artifacts/enl0-unknown.tar.gz", sha256=unknown_sha,
             size=unknown_size), "unknown-key", "signature", ""),
    ]  # fmt: skip
    try:
        for payload, deploy_id, step, said in cases:
            seen = len(fleet.observer.finals(device))
            fleet.observer.publish(device, payload)
            got = fleet.observer.final(device, deploy_id, 120, after=seen)
            assert got["ok"] is False and got["step"] == step, (payload[:80], got)
            assert said in got["reason"] and got["hint"], (payload[:80], got)
            assert agent.alive(), logs(fleet)
    finally:
        flaky.close()
    # A replayed deploy id: the recorded outcome, nothing downloaded or installed again.
    record = agent.record("v1-base")
    stamp, state = record.stat().st_mtime_ns, (agent.root / "state.json").read_bytes()
    incoming = sorted(p.name for p in (agent.root / "incoming").iterdir())
    seen = len(fleet.observer.finals(device))
    fleet.observer.publish(device, cmd("v1-base"))
    got = fleet.observer.final(device, "v1-base", 60, after=seen)
    assert got["ok"] is True and got["replayed"] is True and got["version"] == version_of(fleet.v1)
    assert record.stat().st_mtime_ns == stamp and (agent.root / "state.json").read_bytes() == state
    assert sorted(p.name for p in (agent.root / "incoming").iterdir()) == incoming  # nothing fetched
    steps = [b["step"] for _, _, b in fleet.observer.of(device, "cmd/result") if b.get("id") == "v1-base"]
    assert steps == ["done"]  # no download, no install step
    # Refused bundles left the active slot alone; the agent reports itself online still.
    after = agent.status()
    assert after["active"] == before["active"] and after["version"] == before["version"]
    assert fleet.observer.of(device, "agent")[-1][2]["state"] == "online"
    text = agent.log.read_text()
    assert "refused a command" in text and "Traceback" not in text
    # What went over the wire follows the published schemas.
    import jsonschema

    schemas = ROOT / "edgekit" / "protocol" / "schema"
    for leaf, name in (("cmd/result", "cmd-result"), ("agent", "agent")):
        check = jsonschema.Draft202012Validator(json.loads((schemas / f"{name}.schema.json").read_text()))
        for _, _, body in fleet.observer.of(device, leaf):
            check.validate(body)

    # Away for a moment: the broker keeps the command, the agent answers when it is back.
    assert agent.proc is not None
    agent.proc.kill()
    agent.proc.wait(10)
    assert wait_for(lambda: fleet.observer.of(device, "agent")[-1][2].get("state") == "offline", 60)
    seen = len(fleet.observer.finals(device))
    fleet.observer.publish(device, cmd("while-away", url="gopher://x/y"))  # refused before its signature
    agent.start()
    got = fleet.observer.final(device, "while-away", 120, after=seen)
    assert got["ok"] is False and "not an http(s) URL" in got["reason"]


def test_a_canary_that_breaks_its_slo_is_rolled_back_and_nobody_else_gets_the_bundle(fleet: Fleet) -> None:
    before = {d: a.status() for d, a in fleet.agents.items()}
    rc, report, err = fleet.deploy("--group", "lab", "--canary", "10%", "--canary-window", "3s",
                                   "--slo-p95-ms", "0.001", "--id", "breach-1")  # fmt: skip
    assert rc == 1, err[-3000:]
    assert report["outcome"] == "rolled-back" and report["canaries"] == ["cam-1"], report
    assert report["rest"] == ["cam-2", "cam-3"]
    assert report["results"]["cam-1"]["ok"] is True  # it passed its health gate, then broke the SLO
    health = report["health"]["cam-1"]
    assert health["frames"] > 0 and "p95" in health["breach"], health
    assert report["rolled_back"]["cam-1"]["ok"] is True
    canary = fleet.agents["cam-1"]
    assert canary.status()["version"] == version_of(fleet.v1)
    assert canary.record("breach-1").is_file() and canary.record("breach-1-rb").is_file()
    for device in ("cam-2", "cam-3"):
        agent = fleet.agents[device]
        assert not agent.record("breach-1").exists()
        assert agent.status()["version"] == before[device]["version"]
        assert not [b for _, _, b in fleet.observer.of(device, "cmd") if b.get("id") == "breach-1"]
    # The canary runs v1 again: a new pipeline reports after the rollback.
    assert wait_for(lambda: canary.status()["active"] == before["cam-1"]["active"], 30)


def test_a_wave_rollout_stops_at_a_breaching_wave_through_the_cli(fleet: Fleet) -> None:
    """``--waves`` end to end on real agents: the first wave breaches, is rolled back, nobody else is sent it."""
    before = {d: a.status() for d, a in fleet.agents.items()}
    state = fleet.work / "waves-breach.json"
    rc, report, err = fleet.deploy("--group", "lab", "--waves", "30,100", "--wave-window", "3s",
                                   "--slo-p95-ms", "0.001", "--id", "waves-1", "--state", str(state))  # fmt: skip
    assert rc == 1, err[-3000:]
    assert report["outcome"] == "breached" and report["id"] == "waves-1", report
    waves = report["waves"]
    assert waves["waves"] == [["cam-1"], ["cam-2", "cam-3"]]
    assert waves["gates"][0]["frames"] > 0 and "p95" in waves["gates"][0]["breach"]
    assert list(report["rolled_back"]) == ["cam-1"] and report["rolled_back"]["cam-1"]["ok"] is True
    assert json.loads(state.read_text())["status"] == "breached"
    assert fleet.agents["cam-1"].status()["version"] == before["cam-1"]["version"]
    for device in ("cam-2", "cam-3"):
        assert not [b for _, _, b in fleet.observer.of(device, "cmd") if b.get("id") == "waves-1"]
    assert wait_for(lambda: fleet.agents["cam-1"].status()["active"] == before["cam-1"]["active"], 30)


def test_a_healthy_rollout_goes_to_the_canary_first_then_reaches_every_device(fleet: Fleet) -> None:
    rc, report, err = fleet.deploy(
        "--group", "lab", "--canary", "10%", "--canary-window", "3s", "--id", "good-1"
    )
    assert rc == 0, err[-3000:] + json.dumps(report)[:3000]
    assert report["outcome"] == "deployed" and report["canaries"] == ["cam-1"]
    assert report["health"]["cam-1"]["frames"] > 0 and report["health"]["cam-1"]["breach"] is None
    v2 = version_of(fleet.v2)
    for device, agent in fleet.agents.items():
        assert report["results"][device]["ok"] is True
        assert agent.status()["version"] == v2, device
    obs = fleet.observer
    canary_done = next(
        (i, t) for i, t, b in obs.of("cam-1", "cmd/result") if b.get("id") == "good-1" and b["final"]
    )
    for device in ("cam-2", "cam-3"):
        i, t, _ = next(row for row in obs.of(device, "cmd") if row[2].get("id") == "good-1")
        # Sent only after the canary's result came back and its window was watched.
        assert i > canary_done[0] and t - canary_done[1] >= 3.0, (device, t - canary_done[1])

    # And back: a fleet rollback switches cam-3 to its other slot (v1), no health gate, no download.
    r = edgekit(fleet.env, "deploy", "rollback", "--fleet", FLEET, "--target", "cam-3", "--mqtt",
                fleet.broker.url, "--id", "back-1", "--sign-key", str(fleet.keys[0]), "--json")  # fmt: skip
    back = json.loads(r.stdout.splitlines()[-1])
    assert r.returncode == 0 and back["outcome"] == "done" and back["results"]["cam-3"]["ok"], r.stderr
    assert fleet.agents["cam-3"].status()["version"] == version_of(fleet.v1)
    assert fleet.agents["cam-2"].status()["version"] == v2


def test_an_interrupted_download_resumes_with_a_range_request(fleet: Fleet) -> None:
    device, agent = "cam-2", fleet.agents["cam-2"]
    # v2, the newest release: by now the healthy rollout gave it to cam-2, and the same bundle goes in again.
    archive, sha, size = pack(fleet.v2, fleet.work / "resume" / "enl0-v2.tar.gz")
    flaky = FlakyServer(archive, fleet.flaky_port)
    flaky.cut = 1
    try:
        seen = len(fleet.observer.finals(device))
        body = {"schema": "edgekit/v1/cmd", "id": "resume-1", "action": "deploy", "fleet": FLEET, "device": device,
                "url": flaky.url, "sha256": sha, "size": size}  # fmt: skip
        fleet.observer.publish(device, signed(body, fleet.keys[0]))
        got = fleet.observer.final(device, "resume-1", 300, after=seen)
    finally:
        flaky.close()
    assert got["ok"] is True, got
    assert [r["range"] for r in flaky.requests] == [None, f"bytes={size // 2}-"]
    assert agent.status()["version"] == version_of(fleet.v2)
    steps = [b["step"] for _, _, b in fleet.observer.of(device, "cmd/result") if b.get("id") == "resume-1"]
    assert steps[0] == "received" and "download" in steps and steps[-1] == "done"
