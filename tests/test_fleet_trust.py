"""What a device, or anyone on the network, can do to the fleet server — and that it is not enough.

The collector's MQTT reader against a real Mosquitto (a 65 MiB retained message) and against a
fake broker on a loopback socket (malformed packets, which Mosquitto would never forward); the
device cap; and the real ``edgekit fleet serve`` process: no token off loopback, the token,
the Host check, the SSE cap and the artifact listener.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import signal
import socket
import subprocess
import threading
import time
import tracemalloc
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edgekit.fleet.collector import Collector
from edgekit.fleet.mqtt import FleetSubscriber
from edgekit.fleet.store import FleetStore
from edgekit.protocol.broker import BrokerConfig
from edgekit.testing.mosquitto import Mosquitto, free_port
from edgekit.testing.process import stop_process

from conftest import EDGEKIT, ROOT, edgekit

TOKEN = "s3cret-fleet-token-0123456789abcdef"
ARTIFACT_TOKEN = "d0wnload-token-for-devices-0123456789"


def status(device: str) -> bytes:
    return json.dumps(
        {"schema": "edgekit/v1/status", "device": device, "fleet": "lab", "state": "online"}
    ).encode()


def eventually(check: Callable[[], Any], timeout: float) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    return check()


def publish(port: int, topic: str, payload: bytes, retain: bool = False) -> None:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"dev-{time.monotonic_ns()}")
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        c.publish(topic, payload, qos=1, retain=retain).wait_for_publish(60)
    finally:
        c.disconnect()
        c.loop_stop()


class Ingest:
    """A collector (SQLite in memory) fed by the real subscriber, as ``edgekit fleet serve`` wires them."""

    def __init__(self, url: str, **kw: Any) -> None:
        self.collector = Collector(FleetStore())
        self.topics: list[str] = []

        def handle(topic: str, payload: bytes) -> None:
            self.topics.append(topic)
            self.collector.handle(topic, payload)

        config = BrokerConfig.from_url(url)
        self.sub = FleetSubscriber(config, handle, reject=self.collector.reject, **kw)

    def online(self, device: str) -> bool:
        return (self.collector.store.device("lab", device) or {}).get("state") == "online"


# -- the reader: nothing published stops it ---------------------------------------------------


def test_a_65_mib_retained_message_is_drained_acknowledged_and_counted_and_ingest_goes_on(
    tmp_path: Path,
) -> None:
    # Mosquitto's defaults (message_size_limit / max_packet_size unset) let a 65 MiB message through.
    with Mosquitto(tmp_path) as broker:
        publish(broker.port, "edgekit/v1/lab/cam-big/status", b"x" * (65 * 1024 * 1024), retain=True)
        ingest = Ingest(broker.url, client_id="collector-big")
        ingest.sub.start(wait_s=30)
        try:
            t0 = time.monotonic()
            publish(broker.port, "edgekit/v1/lab/cam-1/status", status("cam-1"))
            assert eventually(lambda: ingest.online("cam-1"), 5), ingest.sub.last_error
            assert time.monotonic() - t0 < 5
            assert ingest.collector.rejected["too-large"] == 1 and ingest.sub.too_large == 1
            assert ingest.sub.connects == 1  # no reconnect loop
            assert "edgekit/v1/lab/cam-big/status" not in ingest.topics  # never handed to the collector
        finally:
            ingest.sub.stop()
        # Acknowledged: a collector coming back gets it once more (retained), drains it, and goes on.
        again = Ingest(broker.url, client_id="collector-big")
        again.sub.start(wait_s=30)
        try:
            publish(broker.port, "edgekit/v1/lab/cam-2/status", status("cam-2"))
            assert eventually(lambda: again.online("cam-2"), 10), again.sub.last_error
            assert again.sub.connects == 1
        finally:
            again.sub.stop()


class FakeBroker:
    """Answers CONNECT and SUBSCRIBE on loopback, then sends connection ``n``'s ``scripts[n]`` bytes."""

    def __init__(self, scripts: list[bytes]) -> None:
        self.scripts = scripts
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            script = self.scripts[min(self.connections, len(self.scripts) - 1)]
            self.connections += 1
            threading.Thread(target=self._talk, args=(conn, script), daemon=True).start()

    @staticmethod
    def _talk(conn: socket.socket, script: bytes) -> None:
        with conn:
            try:
                conn.recv(65536)  # CONNECT
                conn.sendall(b"\x20\x02\x00\x00")
                time.sleep(0.1)
                conn.recv(65536)  # SUBSCRIBE (two topics)
                conn.sendall(b"\x90\x04\x00\x01\x01\x01")
                conn.sendall(script)
                while conn.recv(65536):  # PUBACKs, PINGREQs, until it hangs up
                    pass
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self.server.close()


def mqtt_publish(topic: str, payload: bytes) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic.encode() + payload
    assert len(body) < 128
    return bytes([0x30, len(body)]) + body


GOOD = mqtt_publish("edgekit/v1/lab/cam-ok/status", status("cam-ok"))


@pytest.mark.parametrize(
    "bad",
    [
        b"\x30\x00",  # a PUBLISH with no room for its topic length
        b"\x30\x01\x00",
        b"\x32\x03\x00\x05ab",  # a topic longer than the packet
        b"\x30\xff\xff\xff\xff\x01",  # a five-byte remaining length
        b"\x90\xff\xff\xff\x7f",  # a 256 MiB SUBACK
    ],
    ids=["30-00", "30-01", "topic-overflow", "length-5-bytes", "huge-suback"],
)
def test_a_malformed_packet_ends_the_connection_and_the_next_message_is_ingested(bad: bytes) -> None:
    fake = FakeBroker([bad, GOOD])
    ingest = Ingest(f"mqtt://127.0.0.1:{fake.port}", client_id="collector-fake")
    try:
        ingest.sub.start(wait_s=5)
        assert eventually(lambda: ingest.online("cam-ok"), 5), ingest.sub.last_error
        assert ingest.sub.malformed == 1 and fake.connections == 2
        assert ingest.sub._thread.is_alive()
    finally:
        ingest.sub.stop()
        fake.close()


def test_an_oversized_publish_split_across_reads_is_drained_unbuffered_and_what_follows_is_read() -> None:
    big = b"y" * (16 * 1024 * 1024)
    topic = b"edgekit/v1/lab/cam-x/telemetry"
    body = len(topic).to_bytes(2, "big") + topic + b"\x00\x07" + big  # QoS 1, packet id 7
    n, length = len(body), bytearray()
    while True:
        byte, n = n % 128, n // 128
        length.append(byte | (0x80 if n else 0))
        if not n:
            break
    script = bytes([0x32]) + bytes(length) + body + GOOD
    del big, body
    fake = FakeBroker([script])
    ingest = Ingest(f"mqtt://127.0.0.1:{fake.port}", client_id="collector-fake")
    tracemalloc.start()
    try:
        ingest.sub.start(wait_s=5)
        assert eventually(lambda: ingest.online("cam-ok"), 5), ingest.sub.last_error
        peak = tracemalloc.get_traced_memory()[1]
        assert peak < 4 * 1024 * 1024, f"{peak} bytes: the 16 MiB message was buffered"
        assert ingest.collector.rejected["too-large"] == 1 and ingest.sub.too_large == 1
        assert ingest.sub.connects == 1 and ingest.topics == ["edgekit/v1/lab/cam-ok/status"]
    finally:
        tracemalloc.stop()
        ingest.sub.stop()
        fake.close()


def test_the_reader_restarts_itself_after_an_unexpected_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeBroker([GOOD])
    ingest = Ingest(f"mqtt://127.0.0.1:{fake.port}", client_id="collector-fake")
    real, calls = FleetSubscriber._frames, [0]

    def flaky(self: FleetSubscriber, buf: bytearray, acks: list[bytes]) -> int:
        if b"cam-ok" in buf:  # the first PUBLISH read
            calls[0] += 1
            if calls[0] == 1:
                raise RuntimeError("a bug")
        return real(self, buf, acks)

    monkeypatch.setattr(FleetSubscriber, "_frames", flaky)
    try:
        ingest.sub.start(wait_s=5)
        assert eventually(lambda: ingest.online("cam-ok"), 5), ingest.sub.last_error
        assert ingest.sub.restarts == 1 and ingest.sub._thread.is_alive()
        assert ingest.sub.stats()["restarts"] == 1
    finally:
        ingest.sub.stop()
        fake.close()


def test_devices_beyond_the_cap_are_rejected_and_counted() -> None:
    c = Collector(FleetStore(), max_devices=2)
    for d in ("a", "b"):
        assert c.handle(f"edgekit/v1/lab/{d}/status", status(d)) == "status"
    assert c.handle("edgekit/v1/lab/c/status", status("c")) == "rejected:too-many-devices"
    assert c.handle("edgekit/v1/lab/a/status", status("a")) == "status"  # known ones go on
    assert c.stats()["rejected"] == {"too-many-devices": 1}
    assert c.stats()["devices"] == {"tracked": 2, "max": 2, "fleets": 1}
    # A restarted collector counts what the store already has.
    assert (
        Collector(c.store, max_devices=2)
        .handle("edgekit/v1/lab/d/status", status("d"))
        .startswith("rejected")
    )


# -- the server: who may read it ------------------------------------------------------------


def no_token_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in ("EDGEKIT_FLEET_TOKEN", "EDGEKIT_ARTIFACT_TOKEN")}


def test_serving_off_loopback_without_a_token_is_refused_with_a_hint(
    tmp_path: Path, cache_env: dict[str, str]
) -> None:
    env = no_token_env(cache_env)
    r = edgekit(env, "fleet", "serve", "--host", "0.0.0.0", "--db", str(tmp_path / "f.db"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "error:" in r.stderr and "hint:" in r.stderr and "--token-file" in r.stderr
    loose = tmp_path / "loose.token"
    loose.write_text(TOKEN)
    loose.chmod(0o644)
    r = edgekit(env, "fleet", "serve", "--host", "0.0.0.0", "--token-file", str(loose))
    assert r.returncode == 2 and "chmod 600" in r.stderr
    short = tmp_path / "short.token"
    short.write_text("abc")
    short.chmod(0o600)
    r = edgekit(env, "fleet", "serve", "--host", "0.0.0.0", "--token-file", str(short))
    assert r.returncode == 2 and "hint:" in r.stderr and "token_urlsafe" in r.stderr


def request(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """``(status, headers, body)``; redirects are not followed."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kw: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def start_server(tmp_path: Path, env: dict[str, str], broker: Mosquitto, *args: str) -> Iterator[str]:
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    proc = subprocess.Popen(
        [*EDGEKIT, "fleet", "serve", "--mqtt", broker.url, "--db", str(tmp_path / f"{port}.db"),
         "--port", str(port), *args],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log.open("w"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        assert eventually(lambda: _up(url) or proc.poll() is not None, 60) and proc.poll() is None, (
            log.read_text()
        )
        yield url
    finally:
        stop_process(proc, grace_s=15, sig=signal.SIGINT)


def _up(url: str) -> bool:
    try:
        return request(f"{url}/healthz")[0] == 200
    except OSError:
        return False


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    folder = tmp_path / "broker"
    folder.mkdir()
    with Mosquitto(folder) as b:
        yield b


ARTIFACTS_PORT = free_port()


def secret_file(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def guarded(
    tmp_path: Path, broker: Mosquitto, cache_env: dict[str, str], keys: tuple[Path, Path]
) -> Iterator[str]:
    from edgekit.fleet.artifacts import name_artifact

    token = secret_file(tmp_path / "fleet.token", TOKEN)
    download_token = secret_file(tmp_path / "artifact.token", ARTIFACT_TOKEN)
    folder = tmp_path / "artifacts"
    folder.mkdir()
    (folder / "b.tar.gz").write_bytes(b"bundle bytes")
    name_artifact(folder, "b.tar.gz", hashlib.sha256(b"bundle bytes").hexdigest(), 12)  # what a rollout does
    # What an operator keeps beside the bundles (the review fetched both off the artifact port).
    secret_file(folder / "fleet.token", TOKEN)
    secret_file(folder / "builder.pem", keys[0].read_text())
    (folder / "stray.tar.gz").write_bytes(b"never named by a rollout")
    yield from start_server(
        tmp_path, no_token_env(cache_env), broker,
        "--host", "0.0.0.0", "--token-file", str(token), "--allowed-host", "fleet.local",
        "--max-streams", "2", "--artifacts", str(folder),
        "--artifacts-port", str(ARTIFACTS_PORT), "--artifact-token-file", str(download_token),
    )  # fmt: skip


def test_with_a_token_every_request_needs_it(guarded: str) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for path in ("/api/fleet", "/metrics", "/api/events", "/", "/static/app.js", "/api/device/lab/x"):
        code, headers, _ = request(guarded + path)
        assert code == 401 and headers["www-authenticate"].startswith("Bearer"), path
    assert request(guarded + "/api/fleet", {"Authorization": "Bearer wrong-token-0123456789"})[0] == 401
    assert request(guarded + "/api/fleet", {"Authorization": f"Basic {TOKEN}"})[0] == 401
    assert request(guarded + "/api/fleet", bearer)[0] == 200
    code, _, text = request(guarded + "/metrics", bearer)
    assert code == 200 and b"edgekit_collector_link_events_total" in text
    assert b'edgekit_collector_devices{which="max"} 10000' in text
    assert request(guarded + "/healthz")[0] == 200  # a probe needs no token
    # The browser: /?token= once, then an HttpOnly cookie, and the token leaves the address bar.
    assert request(guarded + "/?token=wrong-token-0123456789")[0] == 401
    code, headers, _ = request(f"{guarded}/?token={TOKEN}")
    assert code == 303 and headers["location"] == "/"
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    jar = {"Cookie": cookie.split(";")[0]}
    assert request(guarded + "/", jar)[0] == 200 and request(guarded + "/api/fleet", jar)[0] == 200
    assert request(guarded + "/api/fleet", {"Cookie": "edgekit_fleet=" + "0" * 64})[0] == 401


def test_a_foreign_host_header_is_refused(guarded: str) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert request(guarded + "/api/fleet", {**bearer, "Host": "attacker.example"})[0] == 400
    assert request(guarded + "/healthz", {"Host": "attacker.example:8765"})[0] == 400
    assert request(guarded + "/api/fleet", {**bearer, "Host": "fleet.local:8765"})[0] == 200


def test_live_streams_are_capped(guarded: str) -> None:
    port = int(guarded.rsplit(":", 1)[1])

    def open_stream() -> tuple[http.client.HTTPConnection, int]:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/api/events", headers={"Authorization": f"Bearer {TOKEN}"})
        return c, c.getresponse().status

    first, second = open_stream(), open_stream()
    try:
        assert first[1] == second[1] == 200
        third = open_stream()
        assert third[1] == 503
        third[0].close()
        first[0].close()  # a client leaving frees its place
        assert eventually(lambda: open_stream()[1] == 200, 10)
    finally:
        first[0].close()
        second[0].close()


def test_the_artifact_port_serves_what_a_rollout_named_to_the_download_token_and_the_hosts(
    guarded: str,
) -> None:
    bundles = f"http://127.0.0.1:{ARTIFACTS_PORT}/artifacts"
    device = {"Authorization": f"Bearer {ARTIFACT_TOKEN}"}
    # No token, a wrong one, the dashboard's: refused, whatever is asked for.
    for headers in (
        {},
        {"Authorization": "Bearer wrong-token-0123456789"},
        {"Authorization": f"Bearer {TOKEN}"},
    ):
        for name in ("b.tar.gz", "fleet.token", "builder.pem", ""):
            code, _, body = request(f"{bundles}/{name}", headers)
            assert code == 401 and b"bundle bytes" not in body and TOKEN.encode() not in body, (headers, name)
    # The token, but a Host the server does not answer to (DNS rebinding): refused.
    for host in ("attacker.example", f"attacker.example:{ARTIFACTS_PORT}"):
        assert request(f"{bundles}/b.tar.gz", {**device, "Host": host})[0] == 400
    # The token and a good Host: what no rollout named is not there, the secrets least of all.
    for name in ("fleet.token", "builder.pem", "stray.tar.gz", ".edgekit-named.json", "..%2Ffleet.token"):
        code, _, body = request(f"{bundles}/{name}", device)
        assert code in (400, 404) and TOKEN.encode() not in body and b"PRIVATE" not in body, (name, code)
    code, _, body = request(f"{bundles}/b.tar.gz", device)
    assert code == 200 and body == b"bundle bytes"
    assert request(f"{bundles}/b.tar.gz", {**device, "Host": f"fleet.local:{ARTIFACTS_PORT}"})[0] == 200
    code, _, body = request(f"{bundles}/", device)
    assert code == 200 and json.loads(body) == {"artifacts": [{"name": "b.tar.gz", "size": 12}]}
    assert request(f"http://127.0.0.1:{ARTIFACTS_PORT}/api/fleet", device)[0] == 404  # nothing else there
    assert request(guarded + "/artifacts/b.tar.gz")[0] == 401  # not on the dashboard's port


def test_the_loopback_default_needs_no_token_but_checks_the_host(
    tmp_path: Path, broker: Mosquitto, cache_env: dict[str, str]
) -> None:
    for url in start_server(tmp_path, no_token_env(cache_env), broker):
        assert request(url + "/api/fleet")[0] == 200
        assert request(url + "/api/fleet", {"Host": "rebound.attacker.example"})[0] == 400  # DNS rebinding
        assert request(url + "/api/fleet", {"Host": "localhost:1"})[0] == 200


def test_artifacts_with_a_token_need_their_own_port(tmp_path: Path, cache_env: dict[str, str]) -> None:
    env = {**no_token_env(cache_env), "EDGEKIT_FLEET_TOKEN": TOKEN}
    r = edgekit(env, "fleet", "serve", "--artifacts", str(tmp_path), "--db", str(tmp_path / "f.db"))
    assert r.returncode == 2 and "--artifacts-port" in r.stderr


def test_the_artifact_port_off_loopback_needs_a_token_of_its_own(
    tmp_path: Path, cache_env: dict[str, str]
) -> None:
    token = secret_file(tmp_path / "fleet.token", TOKEN)
    serve = ["fleet", "serve", "--host", "0.0.0.0", "--token-file", str(token), "--artifacts", str(tmp_path),
             "--artifacts-port", str(free_port()), "--db", str(tmp_path / "f.db")]  # fmt: skip
    r = edgekit(no_token_env(cache_env), *serve)
    assert r.returncode == 2 and "--artifact-token-file" in r.stderr, r.stderr
    r = edgekit(no_token_env(cache_env), *serve, "--artifact-token-file", str(token))
    assert r.returncode == 2 and "dashboard's token" in r.stderr, r.stderr
