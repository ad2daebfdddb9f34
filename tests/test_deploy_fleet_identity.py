"""A device id is unique only within its fleet: real Mosquitto, real ``edgekit agent run`` processes.

Agents named ``cam-N`` in two fleets, ``lab`` and ``prod``, on empty state roots that trust the
test key (no bundle is needed: what is tested is whether an agent takes a command at all, seen
by the step its answer stops at and by whether it fetched anything).  The agents' one
``--artifact-origin`` is a loopback server that records every request.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_deploy_mqtt import Agent, signed, wait_for
from test_deploy_trust import Recorder

from edgekit.testing.mosquitto import Mosquitto

from conftest import EDGEKIT, edgekit


class Watcher:
    """Every message under ``edgekit/v1/#``, both fleets, in the order the broker delivers them."""

    def __init__(self, port: int) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.messages: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()
        ready = threading.Event()
        self.client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="test-watcher")
        self.client.on_connect = lambda c, *a: c.subscribe("edgekit/v1/#", qos=1)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert ready.wait(10)

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        with self.lock:
            self.messages.append((msg.topic, bytes(msg.payload)))

    def publish(self, fleet: str, device: str, payload: bytes) -> None:
        self.client.publish(f"edgekit/v1/{fleet}/{device}/cmd", payload, qos=1).wait_for_publish(5)

    def of(self, fleet: str, device: str, leaf: str) -> list[dict[str, Any]]:
        want = f"edgekit/v1/{fleet}/{device}/{leaf}"
        with self.lock:
            rows = list(self.messages)
        return [json.loads(p) for t, p in rows if t == want and p]

    def answers(self, deploy_id: str) -> list[tuple[str, dict[str, Any]]]:
        """(topic, body) of every final result, on any fleet's topics, about ``deploy_id``."""
        with self.lock:
            rows = list(self.messages)
        out = []
        for topic, payload in rows:
            if topic.endswith("/cmd/result") and payload:
                body = json.loads(payload)
                if body.get("id") == deploy_id and body.get("final"):
                    out.append((topic, body))
        return out

    def online(self, fleet: str, device: str) -> bool:
        states = [b.get("state") for b in self.of(fleet, device, "agent")]
        return bool(states) and states[-1] == "online"

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@dataclass
class Site:
    broker: Mosquitto
    watcher: Watcher
    origin: Recorder
    keys: tuple[Path, Path]
    env: dict[str, str]
    work: Path
    agents: list[Agent]

    def agent(self, fleet: str, device: str, *extra: str, origin: str | None = None) -> Agent:
        """An ``edgekit agent run`` for ``fleet``/``device`` on its own (empty) state root, started."""
        root = self.work / "roots" / fleet / device
        if not root.exists():
            r = edgekit(self.env, "agent", "trust", str(self.keys[1]), "--root", str(root))
            assert r.returncode == 0, r.stderr
        argv = [*EDGEKIT, "agent", "run", "--root", str(root), "--mqtt", self.broker.url, "--fleet", fleet,
                "--device-id", device, "--download-attempts", "1", "--artifact-origin", origin or self.origin.origin, *extra]  # fmt: skip
        env = {**self.env, "EDGEKIT_STATE": str(self.work / "state" / fleet / device)}
        log = self.work / f"agent-{fleet}-{device}.log"
        agent = Agent(device, root, log, argv, env).start()
        self.agents.append(agent)
        return agent

    def command(self, fleet: str | None, device: str, deploy_id: str, **fields: Any) -> bytes:
        body: dict[str, Any] = {
            "schema": "edgekit/v1/cmd",
            "id": deploy_id,
            "action": "deploy",
            "device": device,
        }
        body |= {
            "url": f"{self.origin.origin}/artifacts/{deploy_id}.tar.gz",
            "sha256": "5" * 64,
            "size": 1000,
        }
        if fleet is not None:
            body["fleet"] = fleet
        return signed(body | fields, self.keys[0])


@pytest.fixture()
def site(tmp_path: Path, keys: tuple[Path, Path], cache_env: dict[str, str]) -> Iterator[Site]:
    broker = Mosquitto(tmp_path).start()
    watcher = Watcher(int(broker.url.rsplit(":", 1)[1]))
    origin = Recorder({})  # answers 404 to everything, records what was asked
    s = Site(broker, watcher, origin, keys, cache_env, tmp_path, [])
    try:
        yield s
    finally:
        for agent in s.agents:
            agent.stop()
        watcher.close()
        origin.close()
        broker.stop()


def connects(agent: Agent) -> int:
    return agent.log.read_text().count("agent: connected to")


def test_two_agents_with_one_device_id_in_two_fleets_stay_connected(site: Site) -> None:
    lab, prod = site.agent("lab", "cam-1"), site.agent("prod", "cam-1")
    assert wait_for(
        lambda: site.watcher.online("lab", "cam-1") and site.watcher.online("prod", "cam-1"), 60
    ), lab.log.read_text()[-2000:] + prod.log.read_text()[-2000:]
    time.sleep(8.0)  # on main they took each other's client id: 30 disconnects in 30 s
    for agent in (lab, prod):
        text = agent.log.read_text()
        assert connects(agent) == 1 and "agent: lost" not in text, text[-3000:]
        assert agent.alive()
    # Each says online once, and no Will said it went away.
    for fleet in ("lab", "prod"):
        states = [b["state"] for b in site.watcher.of(fleet, "cam-1", "agent")]
        assert states.count("offline") == 0 and states.count("online") >= 1, (fleet, states)


def test_a_command_for_the_lab_device_is_not_taken_by_the_prod_device_of_the_same_id(site: Site) -> None:
    # The lab agent had a session (its subscription, kept by the broker) and is away now.
    lab = site.agent("lab", "cam-2")
    assert wait_for(lambda: site.watcher.online("lab", "cam-2"), 60), lab.log.read_text()[-2000:]
    lab.stop()
    assert wait_for(lambda: site.watcher.of("lab", "cam-2", "agent")[-1]["state"] == "offline", 30)
    prod = site.agent("prod", "cam-2")
    assert wait_for(lambda: site.watcher.online("prod", "cam-2"), 60), prod.log.read_text()[-2000:]
    site.watcher.publish("lab", "cam-2", site.command("lab", "cam-2", "for-lab"))
    time.sleep(5.0)
    assert site.watcher.answers("for-lab") == [], "an agent answered a command sent to lab while lab was away"
    assert site.origin.requests == [], "the prod agent fetched what a lab command named"
    assert "for-lab" not in prod.log.read_text()
    # The broker kept it for lab: the lab agent takes it when it is back (it reaches the download).
    site.agent("lab", "cam-2")
    got = wait_for(lambda: site.watcher.answers("for-lab"), 60)
    assert got, "the lab agent never answered its own command"
    assert [t for t, _ in got] == ["edgekit/v1/lab/cam-2/cmd/result"], got
    assert got[0][1]["step"] == "download", got
    assert site.origin.requests == ["/artifacts/for-lab.tar.gz"]


def test_a_deploy_signed_for_lab_is_refused_by_prod_and_one_without_a_fleet_too(site: Site) -> None:
    prod = site.agent("prod", "cam-3")
    assert wait_for(lambda: site.watcher.online("prod", "cam-3"), 60), prod.log.read_text()[-2000:]

    def answer(deploy_id: str) -> dict[str, Any]:
        got: list[tuple[str, dict[str, Any]]] = wait_for(lambda: site.watcher.answers(deploy_id), 60)
        assert got, f"no answer to {deploy_id}: " + prod.log.read_text()[-2000:]
        assert [t for t, _ in got] == ["edgekit/v1/prod/cam-3/cmd/result"], got
        return got[0][1]

    # Signed for lab/cam-3, replayed onto prod/cam-3: the signature is good, the fleet is not this one.
    site.watcher.publish("prod", "cam-3", site.command("lab", "cam-3", "signed-for-lab"))
    got = answer("signed-for-lab")
    assert got["ok"] is False and got["step"] == "command", got
    assert "for fleet 'lab', this device is in 'prod'" in got["reason"] and got["hint"], got
    # The fleet changed on the way: the signature no longer holds.
    forged = json.loads(site.command("lab", "cam-3", "refleeted"))
    forged["fleet"] = "prod"
    site.watcher.publish("prod", "cam-3", json.dumps(forged).encode())
    got = answer("refleeted")
    assert got["ok"] is False and "not from a trusted key" in got["reason"], got
    # Signed before commands named their fleet: refused, and the log says why.
    site.watcher.publish("prod", "cam-3", site.command(None, "cam-3", "no-fleet"))
    got = answer("no-fleet")
    assert got["ok"] is False and got["step"] == "command" and "names no fleet" in got["reason"], got
    assert "upgrade edgekit" in got["hint"]
    assert site.origin.requests == [], "a refused command made the agent fetch"
    text = prod.log.read_text()
    assert "refused a command" in text and "names no fleet" in text and "Traceback" not in text
    # Its own fleet's command is taken (it goes as far as the download).
    site.watcher.publish("prod", "cam-3", site.command("prod", "cam-3", "signed-for-prod"))
    got = answer("signed-for-prod")
    assert got["step"] == "download", got
    assert site.origin.requests == ["/artifacts/signed-for-prod.tar.gz"]
    assert prod.alive()
