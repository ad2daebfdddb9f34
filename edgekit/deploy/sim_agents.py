"""A simulated fleet of agents: thousands of them, one process, one epoll loop, the real command path.

Each simulated agent is a ``CommandHandling`` (``edgekit.deploy.agent_commands``), as the real
agent is: a command on its ``cmd`` topic is parsed, its signature and expiry checked by a
``CommandGuard`` on the agent's own nonce file, a deploy id handled before answered with its
recorded outcome, a replayed nonce refused, rollbacks limited, and the final result published
on ``cmd/result``.  Only the download and install are simulated: a deploy "installs" after
``install_s`` (the artifact's SHA-256 says which version it is, from ``versions``; an unknown one
fails at ``download``), a rollback switches back to the version before.

After a switch the device "restarts its pipeline": a new session says its status birth (the
version's model and the budget) and sends a telemetry window every ``interval_s``, made by the
telemetry simulator's real publisher (``edgekit.telemetry.simulate.SimDevice``) at the latency
of its version: ``SimVersion.latency`` times the kind's typical latency, so one version can be
made to breach the SLO.  The retained ``agent`` message says what is active (its deploy id too:
a restarted rollout reads it).

Like ``edgekit.telemetry.simulate_fleet``: paho without its network thread, every socket in one
selector; a command waits in the loop's schedule for its install time rather than in a thread.
"""

from __future__ import annotations

import heapq
import json
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.deploy.agent_commands import CommandHandling
from edgekit.deploy.agent_wire import agent_client_id, status_payload
from edgekit.deploy.command_trust import CommandGuard
from edgekit.errors import EdgekitError
from edgekit.protocol.broker import BrokerConfig
from edgekit.protocol.control import Command
from edgekit.protocol.paho_loop import PahoLoop
from edgekit.protocol.topics import topic
from edgekit.telemetry.simulate import KINDS, SimDevice, SimOptions
from edgekit.telemetry.simulate_fleet import FD_SPARE, TEMPLATES, raise_fd_limit

CONNECTS_PER_S = 500.0


@dataclass(frozen=True)
class SimVersion:
    """A version a simulated agent can run: its name and its latency as a multiple of the kind's typical one.

    ``slow_every``: on every n-th device (index n-1, 2n-1, ...) from index ``slow_from`` on it
    runs at ``slow_latency`` instead, as a version that is slow only on some hardware would: the
    first wave (the first devices by name) can hold while a later one breaches.
    """

    version: str
    latency: float = 1.0
    slow_latency: float = 1.0
    slow_every: int = 0
    slow_from: int = 0

    def latency_on(self, index: int) -> float:
        if self.slow_every and index >= self.slow_from and index % self.slow_every == self.slow_every - 1:
            return self.slow_latency
        return self.latency


class _VersionDevice(SimDevice):
    """The telemetry simulator's device, running ``version`` at a fixed multiple of its typical latency."""

    def __init__(
        self, kind: int, opts: SimOptions, broker: BrokerConfig, tmp: Path, version: str, latency: float
    ) -> None:
        self._version, self._latency = version, latency
        super().__init__(kind, opts, broker, tmp, time.time())
        self.creeps = False

    def birth(self) -> dict[str, Any]:
        body = super().birth()
        body["model"]["version"] = self._version
        return body

    def median_ms(self, now: float) -> float:
        return self.kind.typical_ms * self._latency


class _Windows:
    """Per version: a few real windows and the status birth, made once; a device stamps its identity on them."""

    def __init__(self, fleet: str, kind: int, interval_s: float, versions: Sequence[SimVersion]) -> None:
        opts = SimOptions(mqtt="mqtt://127.0.0.1:1", fleet=fleet, devices=len(KINDS), interval=interval_s)
        self.windows: dict[tuple[str, float], list[dict[str, Any]]] = {}
        self.births: dict[str, dict[str, Any]] = {}
        with tempfile.TemporaryDirectory(prefix="sim-agents-") as tmp:
            for v in versions:
                for latency in {v.latency, v.slow_latency}:
                    d = _VersionDevice(
                        kind, opts, BrokerConfig.from_url(opts.mqtt), Path(tmp), v.version, latency
                    )
                    pub = d.publisher
                    now = time.time()
                    self.windows[v.version, latency] = [
                        pub._payload(d.window_of(interval_s, now), seq=0) for _ in range(TEMPLATES)
                    ]
                    self.births[v.version] = json.loads(pub._status("online"))
                    pub.spool.close()


class SimAgent(CommandHandling):
    """One simulated agent: the real command path, a simulated install, telemetry of the active version."""

    def __init__(self, fleet: AgentFleet, index: int, name: str, state_dir: Path) -> None:
        self.sim = fleet
        self.index = index
        self.device_id, self.fleet = name, fleet.fleet
        self.cmd_topic = topic(self.fleet, name, "cmd")
        self.result_topic = topic(self.fleet, name, "cmd/result")
        self.agent_topic = topic(self.fleet, name, "agent")
        self.telemetry_topic = topic(self.fleet, name, "telemetry")
        self.status_topic = topic(self.fleet, name, "status")
        state_dir.mkdir(parents=True, exist_ok=True)
        self.guard = CommandGuard(state_dir, lambda: fleet.trusted_keys, allow_unsigned=fleet.allow_unsigned)
        self.handled = self.refused = 0
        self.busy: str | None = None
        self.history: list[tuple[SimVersion, str | None]] = [(fleet.base, None)]  # (version, deploy id)
        self.records: dict[str, dict[str, Any]] = {}
        self.received: list[tuple[str, str]] = []  # (action, id) of every command that came, in order
        self.session = uuid.uuid4().hex[:12]
        self.epoch = uuid.uuid4().hex[:16]
        self.seq = 0
        self.client: Any = None
        self.online = False
        self.free_at = 0.0  # one command at a time, as the real agent's worker

    # -- CommandHandling --------------------------------------------------------------------------

    def _publish(self, topic_: str, body: dict[str, Any], retain: bool = False) -> None:
        if self.client is not None:
            self.client.publish(topic_, self.sim.dumps(body), qos=1, retain=retain)

    def publish_status(self) -> None:
        if self.client is None:
            return
        payload = status_payload(
            "online", self.device_id, self.fleet, self.sim.group, KINDS[self.sim.kind].profile,
            {"session": self.session, "pipeline": "running", "busy": self.busy, "dropped": 0},
            self._root_status,
        )  # fmt: skip
        self.client.publish(self.agent_topic, payload, qos=1, retain=True)

    def _root_status(self) -> dict[str, Any]:
        version, deploy_id = self.history[-1]
        return {"active": "a" if len(self.history) % 2 else "b", "model": "sim", "version": version.version,
                "deploy_id": deploy_id}  # fmt: skip

    def _recorded(self, deploy_id: str) -> dict[str, Any] | None:
        return self.records.get(deploy_id)

    def _run_command(self, cmd: Command) -> dict[str, Any]:
        self._progress(cmd, "received", {})
        if cmd.action == "rollback":
            if len(self.history) < 2:
                return self._done(cmd, False, "switch", "no previous version to go back to")
            self.history.pop()
            return self._done(cmd, True, "done", "")
        v = self.sim.versions.get(str(cmd.sha256))
        if v is None:
            return self._done(cmd, False, "download", "the simulation knows no artifact with this SHA-256")
        self.history.append((v, cmd.id))
        return self._done(cmd, True, "done", "")

    def _done(self, cmd: Command, ok: bool, step: str, reason: str) -> dict[str, Any]:
        version = self.version
        self.records[cmd.id] = {"ok": ok, "step": step, "reason": reason, "version": version}
        if ok:  # the pipeline restarts on the active version: a new session, a new birth
            self.session = uuid.uuid4().hex[:12]
            self.seq = 0
            self.sim.birth(self)
        return self._final(cmd.id, cmd.action, step, ok=ok, reason=reason, version=version)

    @property
    def version(self) -> str:
        return self.history[-1][0].version

    @property
    def latency(self) -> float:
        return self.history[-1][0].latency_on(self.index)


@dataclass
class AgentFleet:
    """Many ``SimAgent`` on one broker, driven from one thread (``run``); ``stop`` ends it."""

    broker: BrokerConfig
    fleet: str
    devices: int
    versions: dict[str, SimVersion]  # artifact SHA-256 -> what installing it runs
    base: SimVersion = SimVersion("1.0")
    trusted_keys: Sequence[Path] = ()
    allow_unsigned: bool = False
    prefix: str = "agent"
    group: str | None = None
    kind: int = 0  # which of the simulator's kinds of device (edgekit.telemetry.simulate.KINDS)
    install_s: float = 0.5
    interval_s: float = 1.0
    state_dir: Path | None = None
    agents: list[SimAgent] = field(default_factory=list)

    def __post_init__(self) -> None:
        import orjson

        self.dumps = orjson.dumps
        self.loop = PahoLoop()
        self._heap: list[tuple[float, int, int, str, bytes]] = []
        self._n = 0
        self._stop = threading.Event()
        self.ready = threading.Event()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if self.state_dir is None:
            shm = Path("/dev/shm")
            self._tmp = tempfile.TemporaryDirectory(
                prefix="sim-agents-", dir=shm if shm.is_dir() else None
            )  # the nonce files: written on each command
            self.state_dir = Path(self._tmp.name)
        self.templates = _Windows(
            self.fleet, self.kind, self.interval_s, [self.base, *self.versions.values()]
        )
        width = max(4, len(str(self.devices)))
        self.agents = [
            SimAgent(self, i, f"{self.prefix}-{i + 1:0{width}d}", self.state_dir / f"{i + 1:0{width}d}")
            for i in range(self.devices)
        ]

    # -- what the devices say ----------------------------------------------------------------------

    def birth(self, a: SimAgent) -> None:
        body = self.templates.births[a.version] | {
            "device": a.device_id,
            "session": a.session,
            "ts": round(time.time(), 3),
        }
        if a.client is not None:
            a.client.publish(a.status_topic, self.dumps(body), qos=1, retain=True)

    def window(self, a: SimAgent) -> None:
        tpl = self.templates.windows[a.version, a.latency][(a.seq + a.index) % TEMPLATES]  # devices differ
        now = time.time()
        body = tpl | {
            "device": a.device_id,
            "session": a.session,
            "epoch": a.epoch,
            "seq": a.seq,
            "sent_at": round(now, 3),
            "window": tpl["window"] | {"start": round(now - self.interval_s, 3), "end": round(now, 3)},
        }
        a.seq += 1
        a.client.publish(a.telemetry_topic, self.dumps(body), qos=1)

    # -- the links -----------------------------------------------------------------------------

    def _connect(self, a: SimAgent) -> None:
        client = self.broker.client(agent_client_id(self.fleet, a.device_id), clean_session=True)
        client.user_data_set(a)
        client.max_inflight_messages_set(1000)
        client.will_set(a.agent_topic, status_payload(
            "offline", a.device_id, self.fleet, self.group, KINDS[self.kind].profile, None, dict
        ), qos=1, retain=True)  # fmt: skip
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        self.loop.attach(client)
        a.client = client
        client.connect(self.broker.host, self.broker.port, keepalive=self.broker.keepalive_s)

    def _on_connect(self, client: Any, a: SimAgent, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            return
        a.online = True
        client.subscribe(a.cmd_topic, qos=1)
        a.publish_status()
        self.birth(a)

    def _on_disconnect(self, client: Any, a: SimAgent, flags: Any, reason: Any, properties: Any) -> None:
        a.online = False
        if not self._stop.is_set():
            self._at(time.monotonic() + 1.0, a.index, "connect")

    def _on_message(self, client: Any, a: SimAgent, msg: Any) -> None:
        if msg.topic != a.cmd_topic:
            return
        # One at a time, each taking the install's time: the command is handled when it is done.
        now = time.monotonic()
        a.free_at = max(now, a.free_at) + self.install_s
        self._at(a.free_at, a.index, "command", bytes(msg.payload))

    # -- the loop ------------------------------------------------------------------------------

    def _at(self, t: float, index: int, what: str, payload: bytes = b"") -> None:
        self._n += 1
        heapq.heappush(self._heap, (t, self._n, index, what, payload))

    def _due(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            t, _, i, what, payload = heapq.heappop(self._heap)
            a = self.agents[i]
            if what == "connect":
                if not a.online and not self._stop.is_set():
                    self._connect(a)
            elif what == "command":
                cmd = _peek(payload)
                a.received.append(cmd)
                a.handle(payload)
            elif what == "window":
                if a.online:
                    self.window(a)
                self._at(t + self.interval_s, i, "window")

    def _step(self, timeout: float) -> None:
        self.loop.step(timeout)

    def run(self, connect_timeout_s: float = 60.0) -> None:
        """Connect every agent (at a steady pace), then serve until ``stop()``; say offline at the end."""
        raise_fd_limit(self.devices + FD_SPARE)
        start = time.monotonic()
        for a in self.agents:
            self._connect(a)
            self._step(0)
            while time.monotonic() - start < (a.index + 1) / CONNECTS_PER_S:
                self._step(0.001)
        while sum(a.online for a in self.agents) < self.devices:
            if time.monotonic() - start > connect_timeout_s:
                raise EdgekitError(
                    f"only {sum(a.online for a in self.agents)} of {self.devices} simulated agents connected",
                    "is the broker up, and may it take this many connections?",
                )
            self._step(0.01)
        t0 = time.monotonic()
        for a in self.agents:  # windows spread evenly over the interval
            self._at(t0 + self.interval_s * (a.index + 1) / self.devices, a.index, "window")
        self.ready.set()
        last_ping = t0
        while not self._stop.is_set():
            now = time.monotonic()
            self._due(now)
            if now - last_ping >= 1.0:
                last_ping = now
                for a in self.agents:
                    if a.client is not None:
                        a.client.loop_misc()
            wait = min(0.05, max(0.0, self._heap[0][0] - time.monotonic())) if self._heap else 0.05
            self._step(wait)
        for a in self.agents:
            if a.client is not None:
                a.client.disconnect()
        end = time.monotonic() + 5.0
        while self.loop.watching() and time.monotonic() < end:
            self._step(0.01)
        if self._tmp is not None:
            self._tmp.cleanup()

    def stop(self) -> None:
        self._stop.set()

    def commands(self) -> dict[str, list[tuple[str, str]]]:
        """device -> the (action, id) of each command it was sent, in order (a copy)."""
        return {a.device_id: list(a.received) for a in self.agents}

    def active(self) -> dict[str, str]:
        """device -> the version it runs."""
        return {a.device_id: a.version for a in self.agents}


def _peek(payload: bytes) -> tuple[str, str]:
    """The (action, id) a command payload says, for the record of who was sent what (not trusted)."""
    try:
        body = json.loads(payload)
    except ValueError:
        return ("?", "?")
    if not isinstance(body, dict):
        return ("?", "?")
    return (str(body.get("action")), str(body.get("id")))
