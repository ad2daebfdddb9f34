"""Who may command an agent, and what it will fetch: a real Mosquitto, real ``edgekit agent run`` processes.

Two agents without pipelines (trust-1 for the checks of a command, trust-2 for the rollback
limit), each on a state root holding two complete slots (v1 and v2, installed once with
``edgekit agent install`` into a template, then copied).  Bundles come from an artifact
server on loopback, the agents' one ``--artifact-origin``; a second loopback server plays
an internal service no command may reach.  Every command here is published raw, as an
attacker on the broker would.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_deploy_mqtt import (
    FLEET,
    PROFILE,
    Agent,
    Observer,
    agent_root,
    pack,
    signed,
    two_versions,
    version_of,
    wait_for,
)

from edgekit.testing.mosquitto import Mosquitto

from conftest import EDGEKIT

DEVICES = ("trust-1", "trust-2")
SECRET = b"internal: db password hunter2\n" * 100


class Recorder:
    """A loopback HTTP server that records each request; ``routes`` maps a path to (status, headers, body)."""

    def __init__(self, routes: dict[str, tuple[int, dict[str, str], bytes]]) -> None:
        self.routes = routes
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.requests.append(self.path)
                status, headers, body = server.routes.get(self.path, (404, {}, b"no such thing"))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass
class Site:
    broker: Mosquitto
    observer: Observer
    agents: dict[str, Agent]
    artifacts: Recorder  # the allowed origin
    internal: Recorder  # off the list
    keys: tuple[Path, Path]
    work: Path
    v1: str
    v2: str
    sha: str  # v1's archive, served at /artifacts/enl0-v1.tar.gz
    size: int

    def send(
        self, device: str, payload: bytes, deploy_id: str | None, timeout: float = 120
    ) -> dict[str, Any]:
        seen = len(self.observer.finals(device))
        self.observer.publish(device, payload)
        return self.observer.final(device, deploy_id, timeout, after=seen)

    def results(self, device: str, deploy_id: str) -> list[dict[str, Any]]:
        return [b for _, _, b in self.observer.of(device, "cmd/result") if b.get("id") == deploy_id]


def body(deploy_id: str, device: str, action: str = "rollback", **fields: Any) -> dict[str, Any]:
    return {
        "schema": "edgekit/v1/cmd",
        "id": deploy_id,
        "action": action,
        "fleet": FLEET,
        "device": device,
    } | fields


@pytest.fixture(scope="module")
def site(
    tmp_path_factory: pytest.TempPathFactory,
    x86_bundle: tuple[Path, dict[str, Any]],
    keys: tuple[Path, Path],
    cache_env: dict[str, str],
) -> Iterator[Site]:
    work = tmp_path_factory.mktemp("trust")
    v1, v2 = two_versions(x86_bundle[0], work, keys[0])
    # Two complete slots, v2 active.
    template = agent_root(work / "template-root", keys[1], cache_env, [(v1, "base-v1"), (v2, "base-v2")])
    _, sha, size = pack(v1, work / "enl0-v1.tar.gz")
    artifacts = Recorder(
        {
            "/artifacts/enl0-v1.tar.gz": (200, {}, (work / "enl0-v1.tar.gz").read_bytes()),
            "/artifacts/short.tar.gz": (200, {}, (work / "enl0-v1.tar.gz").read_bytes()[: size // 3]),
        }
    )
    internal = Recorder({"/secret": (200, {}, SECRET)})
    artifacts.routes["/artifacts/redirect.tar.gz"] = (302, {"Location": f"{internal.origin}/secret"}, b"")
    broker = Mosquitto(work).start()
    observer = Observer(broker.url)
    agents: dict[str, Agent] = {}
    try:
        for device in DEVICES:
            root = work / "roots" / device
            shutil.copytree(template, root, symlinks=True, copy_function=os.link)
            env = {**cache_env, "EDGEKIT_STATE": str(work / "state" / device)}
            argv = [*EDGEKIT, "agent", "run", "--root", str(root), "--mqtt", broker.url, "--fleet", FLEET,
                    "--device-id", device, "--profile", PROFILE, "--download-attempts", "2",
                    "--artifact-origin", artifacts.origin]  # fmt: skip
            agents[device] = Agent(device, root, work / f"agent-{device}.log", argv, env).start()
        for device in DEVICES:
            assert wait_for(
                lambda d=device: any(b.get("state") == "online" for _, _, b in observer.of(d, "agent")), 60
            ), agents[device].log.read_text()[-3000:]
        yield Site(
            broker,
            observer,
            agents,
            artifacts,
            internal,
            keys,
            work,
            version_of(v1),
            version_of(v2),
            sha,
            size,
        )
    finally:
        for agent in agents.values():
            agent.stop()
        observer.close()
        artifacts.close()
        internal.close()
        broker.stop()


def _said(results: list[dict[str, Any]]) -> str:
    """What results say in words (not their time stamps): reason, hint, step, info, health."""
    return json.dumps([{k: r.get(k) for k in ("reason", "hint", "step", "info", "health")} for r in results])


def test_a_deploy_off_the_origin_list_is_refused_before_any_connection_and_says_nothing_of_it(
    site: Site,
) -> None:
    import hashlib

    device, key = "trust-1", site.keys[0]
    secret_sha = hashlib.sha256(SECRET).hexdigest()
    for deploy_id, url in (
        ("ssrf-loopback", f"{site.internal.origin}/secret"),
        ("ssrf-link-local", "http://169.254.169.254/latest/meta-data/"),
        ("ssrf-redirect", f"{site.artifacts.origin}/artifacts/redirect.tar.gz"),
    ):
        cmd = body(deploy_id, device, "deploy", url=url, sha256="0" * 64, size=len(SECRET))
        got = site.send(device, signed(cmd, key), deploy_id)
        assert got["ok"] is False and got["step"] == "download", got
        assert got["reason"] == "refused: origin not allowed", got
        results = site.results(device, deploy_id)
        assert not [r for r in results if r.get("step") == "download" and not r["final"]], results
        said = _said(results)
        assert not [s for s in (secret_sha, "hunter2", "HTTP", "302", "200", str(len(SECRET))) if s in said]
    assert site.internal.requests == [], "the agent connected to a server off its list"
    assert site.artifacts.requests == ["/artifacts/redirect.tar.gz"]  # the redirect itself was not followed


def test_a_failed_download_says_only_that_and_keeps_nothing(site: Site) -> None:
    device, key, agent = "trust-1", site.keys[0], site.agents["trust-1"]
    size = site.size
    for deploy_id, path, sha, said in (
        ("gone", "/artifacts/nope.tar.gz", "1" * 64, "download failed"),
        ("cut-short", "/artifacts/short.tar.gz", "2" * 64, "hash mismatch"),
        ("other-bytes", "/artifacts/enl0-v1.tar.gz", "3" * 64, "hash mismatch"),
    ):
        cmd = body(deploy_id, device, "deploy", url=site.artifacts.origin + path, sha256=sha, size=size)
        got = site.send(device, signed(cmd, key), deploy_id)
        assert got["ok"] is False and got["reason"] == said, got
        words = _said(site.results(device, deploy_id))
        assert "404" not in words and str(size // 3) not in words and site.sha not in words, words
        incoming = agent.root / "incoming"
        assert not incoming.exists() or not [p.name for p in incoming.iterdir()], list(incoming.iterdir())


def test_commands_must_be_signed_by_a_trusted_key_unexpired_and_new(site: Site) -> None:
    from edgekit.bundle.keys import generate_keypair

    device, key, agent = "trust-1", site.keys[0], site.agents["trust-1"]
    active = agent.status()["active"]
    # Unsigned: refused, nothing switched.
    got = site.send(device, json.dumps(body("unsigned-rb", device)).encode(), "unsigned-rb")
    assert got["ok"] is False and got["step"] == "command" and "not signed" in got["reason"], got
    # Signed by a key this device does not trust.
    stranger, _ = generate_keypair(site.work / "stranger")
    got = site.send(device, signed(body("forged-rb", device), stranger), "forged-rb")
    assert got["ok"] is False and "not from a trusted key" in got["reason"], got
    # Signed, then changed on the way.
    tampered = json.loads(signed(body("tampered-rb", device), key))
    tampered["id"] = "tampered-rb2"
    got = site.send(device, json.dumps(tampered).encode(), "tampered-rb2")
    assert got["ok"] is False and "not from a trusted key" in got["reason"], got
    # Expired.
    got = site.send(device, signed(body("old-rb", device, expires_at=time.time() - 5), key), "old-rb")
    assert got["ok"] is False and "expired" in got["reason"], got
    assert agent.status()["active"] == active
    # Signed by the trusted key: taken, the slot switches.
    good = signed(body("signed-rb", device), key)
    got = site.send(device, good, "signed-rb")
    assert got["ok"] is True and got["version"] == site.v1, got
    switched = agent.status()["active"]
    assert switched != active
    # The same bytes again: its recorded outcome, nothing done again.
    got = site.send(device, good, "signed-rb")
    assert got["ok"] is True and got["replayed"] is True
    assert agent.status()["active"] == switched
    # A signed command that was refused (no record): replayed, it is refused as a replay.
    cmd = body("bad-hash", device, "deploy", url=f"{site.artifacts.origin}/artifacts/enl0-v1.tar.gz",
               sha256="4" * 64, size=site.size)  # fmt: skip
    once = signed(cmd, key)
    assert site.send(device, once, "bad-hash")["reason"] == "hash mismatch"
    fetched = len(site.artifacts.requests)
    got = site.send(device, once, "bad-hash")
    assert got["ok"] is False and "replay" in got["reason"], got
    assert len(site.artifacts.requests) == fetched  # nothing fetched for the replay
    text = agent.log.read_text()
    assert "Traceback" not in text and agent.alive()
    nonces = json.loads((agent.root / "command-nonces.json").read_text())["nonces"]
    assert json.loads(once)["nonce"] in nonces


def test_rollbacks_are_limited_and_the_active_slot_stops_flipping(site: Site) -> None:
    device, key, agent = "trust-2", site.keys[0], site.agents["trust-2"]
    actives = [agent.status()["active"]]
    answers = []
    for n in range(6):
        got = site.send(device, signed(body(f"flip-{n}", device), key), f"flip-{n}")
        answers.append(got)
        actives.append(agent.status()["active"])
    assert [a["ok"] for a in answers] == [True, True, True, False, False, False], answers
    for refused in answers[3:]:
        assert refused["step"] == "command" and "more than 3 rollbacks" in refused["reason"], refused
        assert refused["hint"]
    assert actives[0] != actives[1] != actives[2] != actives[3]  # three switches ...
    assert actives[3] == actives[4] == actives[5] == actives[6]  # ... then none
    assert agent.alive()


def test_the_command_queue_is_bounded_and_counts_what_it_drops(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from edgekit.deploy.agent import Agent as DeployAgent
    from edgekit.deploy.agent import AgentConfig
    from edgekit.deploy.slots import StateRoot
    from edgekit.protocol.broker import BrokerConfig

    url = "mqtt://127.0.0.1:1"
    agent = DeployAgent(
        StateRoot(tmp_path / "root"),
        BrokerConfig.from_url(url),
        AgentConfig(url, FLEET, "cam-q", queue_size=4),
    )
    acked: list[int] = []
    client = SimpleNamespace(ack=lambda mid, qos: acked.append(mid))
    for n in range(10):  # never handled: no worker runs
        msg = SimpleNamespace(topic=agent.cmd_topic, payload=b'{"n": %d}' % n, mid=n, qos=1)
        agent._on_message(client, None, msg)
    assert agent._queue.qsize() == 4 and agent.dropped == 6
    assert acked == [4, 5, 6, 7, 8, 9]  # dropped for good: the broker does not send them again
    assert json.loads(agent._status_payload("offline"))["state"] == "offline"


def test_over_mqtt_5_the_broker_is_told_the_biggest_packet_the_agent_takes() -> None:
    from edgekit.deploy.agent_wire import MAX_PACKET_BYTES, connect_kwargs
    from edgekit.protocol.control import MAX_COMMAND_BYTES

    kwargs = connect_kwargs("5", 3600)
    assert kwargs["properties"].MaximumPacketSize == MAX_PACKET_BYTES < MAX_COMMAND_BYTES + 2048
    assert kwargs["clean_start"] is False and connect_kwargs("3.1.1", 3600) == {}


def test_a_command_cut_short_by_a_restart_runs_again_and_a_settled_one_is_a_replay(tmp_path: Path) -> None:
    """The broker redelivers a command the agent died in the middle of: that is not a replay."""
    from edgekit.deploy.command_trust import CommandGuard, CommandRefused
    from edgekit.protocol.control_messages import Command

    def command(nonce: str, deploy_id: str) -> Command:
        return Command.model_validate(
            body(deploy_id, "cam-r", nonce=nonce, expires_at=time.time() + 600, signature="x" * 88)
        )

    first = CommandGuard(tmp_path, lambda: [])
    cmd = command("n" * 32, "rb-1")
    first.take_nonce(cmd)  # ... and the agent is killed before it answers
    after_restart = CommandGuard(tmp_path, lambda: [])
    after_restart.take_nonce(cmd)  # the redelivered command runs again
    with pytest.raises(CommandRefused, match="replay"):  # another id under the same nonce: no
        after_restart.take_nonce(command("n" * 32, "rb-2"))
    after_restart.settle(cmd)  # answered now
    with pytest.raises(CommandRefused, match="replay"):
        CommandGuard(tmp_path, lambda: []).take_nonce(cmd)
