"""``FleetLink``: the rollout's MQTT client, and what it has heard of the fleet.

It keeps, under one lock: the retained agent messages (the members), the final results of
commands, the status births of pipeline sessions, and the raw telemetry of the devices it
watches (the canaries; ``edgekit.deploy.canary`` reads it through the fleet collector).
Readers take copies through its methods.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from edgekit.core.names import safe_name
from edgekit.errors import DeployError
from edgekit.protocol.control import Command, loads_strict, parse_agent_status, parse_result
from edgekit.protocol.topics import topic

DISCOVER_QUIET_S = 0.5  # retained messages arrive in a burst after the SUBACK
DISCOVER_MAX_S = 5.0
MAX_TELEMETRY_BYTES = 256 * 1024


class Telemetry(NamedTuple):
    """A telemetry message of a watched device as it came: its session (to tell versions apart) and bytes."""

    session: str
    payload: bytes


class FleetLink:
    """The rollout's MQTT client: agents, results, status births and canary telemetry, kept under one lock."""

    def __init__(self, broker_url: str, fleet: str) -> None:
        from edgekit.protocol.broker import BrokerConfig

        self.broker = BrokerConfig.from_url(broker_url)
        self.fleet = fleet
        self.agents: dict[str, dict[str, Any]] = {}
        self.finals: dict[tuple[str, str], dict[str, Any]] = {}
        self.finals_at: dict[tuple[str, str], float] = {}
        # device -> session -> (first seen, status body)
        self.sessions: dict[str, dict[str, tuple[float, dict[str, Any]]]] = {}
        self.telemetry: dict[str, list[Telemetry]] = {}  # device -> messages in arrival order
        self.watched: set[str] = set()
        self.on_progress: Callable[[dict[str, Any]], None] | None = None
        # topic -> callback(payload), on the network thread: a wave rollout's control topic
        self.listeners: dict[str, Callable[[bytes], None]] = {}
        self.last_message_at = 0.0
        self._cond = threading.Condition()
        self._subscribed = threading.Event()
        self._error = ""
        self._client = self._make_client()

    def _make_client(self) -> Any:
        # A clean session: the rollout's own queue is not worth keeping.
        client = self.broker.client(f"edgekit-deploy-{uuid.uuid4().hex[:10]}", clean_session=True)
        client.on_connect = self._on_connect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        return client

    def _topics(self) -> list[tuple[str, int]]:
        f = self.fleet
        return (
            [(topic(f, "+", leaf), 1) for leaf in ("agent", "cmd/result", "status")]
            + [(topic(f, d, "telemetry"), 1) for d in sorted(self.watched)]
            + [(t, 1) for t in sorted(self.listeners)]
        )

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self._error = f"{self.broker.describe()} refused the connection: {reason}"
            return
        client.subscribe(self._topics())

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, reasons: Any, properties: Any) -> None:
        if any(getattr(r, "is_failure", False) for r in reasons):
            self._error = "the broker refused a subscription (its ACL?)"
        self._subscribed.set()

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        listener = self.listeners.get(msg.topic)
        if listener is not None:
            listener(bytes(msg.payload))
            return
        parts = msg.topic.split("/")
        if len(parts) < 5 or parts[2] != self.fleet or not safe_name(parts[3]):
            return
        device, leaf = parts[3], "/".join(parts[4:])
        now = time.monotonic()
        payload = bytes(msg.payload)
        progress = None
        with self._cond:
            self.last_message_at = now
            if leaf == "agent":
                body = parse_agent_status(payload)
                if body is None:
                    self.agents.pop(device, None)  # cleared (empty retained message) or unreadable
                elif body["device"] == device:
                    self.agents[device] = body
            elif leaf == "cmd/result":
                body = parse_result(payload)
                if body is not None and body["device"] == device and body["id"] is not None:
                    if body["final"]:
                        key = (device, str(body["id"]))
                        self.finals.setdefault(key, body)
                        self.finals_at.setdefault(key, now)
                    else:
                        progress = body
            elif leaf == "status":
                body = _json_object(payload)
                session = body.get("session") if body else None
                if body and body.get("state") == "online" and isinstance(session, str):
                    self.sessions.setdefault(device, {}).setdefault(session, (now, body))
            elif leaf == "telemetry" and device in self.watched and len(payload) <= MAX_TELEMETRY_BYTES:
                # Only the session is read here: the fleet collector checks the rest (edgekit.deploy.canary).
                body = _json_object(payload)
                session = body.get("session") if body else None
                if isinstance(session, str):
                    self.telemetry.setdefault(device, []).append(Telemetry(session, payload))
            self._cond.notify_all()
        if progress is not None and self.on_progress is not None:
            self.on_progress(progress)

    def connect(self, timeout_s: float = 15.0) -> FleetLink:
        """Connect, subscribe, and wait for the retained agent messages to arrive."""
        b = self.broker
        try:
            self._client.connect_async(b.host, b.port, keepalive=b.keepalive_s)
        except (OSError, ValueError) as err:
            raise DeployError(f"cannot reach {b.describe()}: {err}", "check the --mqtt URL") from err
        self._client.loop_start()
        if not self._subscribed.wait(timeout_s) or self._error:
            self.close()
            raise DeployError(
                f"no subscription on {b.describe()} within {timeout_s:g} s: {self._error or 'no answer'}",
                "check that the broker runs and that --mqtt (user, password, ACL) is right",
            )
        # Retained messages come right after the SUBACK: wait until they stop.
        start = time.monotonic()
        while time.monotonic() - start < DISCOVER_MAX_S:
            time.sleep(0.1)
            with self._cond:
                quiet = time.monotonic() - max(self.last_message_at, start)
            if quiet >= DISCOVER_QUIET_S:
                break
        return self

    def watch(self, devices: Iterable[str]) -> None:
        """Also receive the telemetry of ``devices``."""
        new = [d for d in devices if d not in self.watched]
        with self._cond:
            self.watched.update(new)
        if new:
            self._client.subscribe([(topic(self.fleet, d, "telemetry"), 1) for d in new])

    def listen(self, topic_: str, callback: Callable[[bytes], None]) -> None:
        """Call ``callback(payload)`` (on paho's thread) for each message on ``topic_``, retained ones too."""
        self.listeners[topic_] = callback
        self._client.subscribe(topic_, qos=1)

    def publish(self, topic_: str, payload: bytes, retain: bool = False) -> None:
        """Publish ``payload`` at QoS 1 and wait (up to 10 s) for the broker to take it."""
        info = self._client.publish(topic_, payload, qos=1, retain=retain)
        with contextlib.suppress(RuntimeError, ValueError):
            info.wait_for_publish(10.0)

    def send(self, command: Command) -> None:
        """Publish ``command`` to its device (QoS 1; waits for the broker's PUBACK)."""
        info = self._client.publish(topic(self.fleet, command.device, "cmd"), command.to_json(), qos=1)
        try:
            info.wait_for_publish(10.0)
        except (RuntimeError, ValueError) as err:
            raise DeployError(
                f"could not publish the command for {command.device}: {err}", "check the broker connection"
            ) from err

    def send_many(self, commands: Sequence[Command]) -> None:
        """Publish ``commands`` (QoS 1), then wait for their PUBACKs: a wave's batch in one round trip."""
        infos = [
            (c, self._client.publish(topic(self.fleet, c.device, "cmd"), c.to_json(), qos=1))
            for c in commands
        ]
        for command, info in infos:
            try:
                info.wait_for_publish(10.0)
            except (RuntimeError, ValueError) as err:
                raise DeployError(
                    f"could not publish the command for {command.device}: {err}",
                    "check the broker connection",
                ) from err

    def wait_finals(
        self, keys: Sequence[tuple[str, str]], timeout_s: float
    ) -> dict[tuple[str, str], dict[str, Any]]:
        """Wait up to ``timeout_s`` for the final results of ``(device, id)``; returns those that came."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not all(k in self.finals for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 1.0))
            return {k: self.finals[k] for k in keys if k in self.finals}

    def snapshot_agents(self) -> dict[str, dict[str, Any]]:
        """device -> its retained agent message, as heard so far."""
        with self._cond:
            return dict(self.agents)

    def snapshot_sessions(self, device: str) -> set[str]:
        """The pipeline sessions of ``device`` whose status birth has been heard."""
        with self._cond:
            return set(self.sessions.get(device, {}))

    def births(self, device: str) -> dict[str, dict[str, Any]]:
        """session -> its status birth (the first heard), in the order they came."""
        with self._cond:
            return {session: body for session, (_, body) in self.sessions.get(device, {}).items()}

    def telemetry_of(self, device: str) -> list[Telemetry]:
        """The telemetry messages of a watched ``device`` so far, in arrival order (the list only grows)."""
        with self._cond:
            return list(self.telemetry.get(device, []))

    def telemetry_since(self, device: str, start: int) -> list[Telemetry]:
        """The telemetry messages of a watched ``device`` from index ``start`` on (a thousand devices' lists are long)."""
        with self._cond:
            return self.telemetry.get(device, [])[start:]

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def _json_object(payload: bytes) -> dict[str, Any] | None:
    try:
        body = loads_strict(payload, limit=MAX_TELEMETRY_BYTES)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None
