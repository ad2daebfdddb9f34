"""``edgekit deploy --fleet F``: a canary rollout of one bundle to a fleet's agents over MQTT.

::

    1. the archive goes into the folder ``edgekit fleet serve --artifacts DIR`` hosts
       (its URL, SHA-256, size and signature go into each command)
    2. members: the retained ``edgekit/v1/<fleet>/+/agent`` messages (online ones; --group or --target)
    3. canaries: ceil(share x members), the first by name (a repeatable choice), get the
       deploy command; their final results are awaited (a failed health gate fails the rollout)
    4. their live telemetry is watched for the canary window, from the first window the
       *new* pipeline reports (a status birth that is new since the command, of the new
       version): the merged latency sketch's p95 must stay within --slo-p95-ms (default:
       the budget the device reports) and the miss rate within 1%
    5. a breach, a failure or no telemetry: rollback commands to the canaries that switched,
       stop, exit 1 — the rest never get the command; otherwise the rest get it, and their
       results are awaited

Percentiles are never averaged: every window's ``LatencySketch`` is merged, and p95 is
read from the merge.  Telemetry windows are de-duplicated on ``(session, seq)``.
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit._core.names import safe_name
from edgekit._core.sketch import LatencySketch
from edgekit._core.units import parse_seconds
from edgekit.errors import DeployError
from edgekit.fleet.artifacts import safe_artifact_name
from edgekit.protocol.control import (
    Command,
    deploy_message,
    loads_strict,
    new_deploy_id,
    parse_agent_status,
    parse_result,
    rollback_message,
    safe_deploy_id,
)
from edgekit.protocol.topics import topic

Event = Callable[[str, dict[str, Any]], None]
"""``on_event(kind, info)``: ``members``, ``send``, ``progress``, ``result``, ``watch``, ``verdict``, ``done``."""

DEFAULT_MISS_RATE = 0.01
DEFAULT_TIMEOUT_S = 900.0
DISCOVER_QUIET_S = 0.5  # retained messages arrive in a burst after the SUBACK
DISCOVER_MAX_S = 5.0
MAX_TELEMETRY_BYTES = 256 * 1024


@dataclass(frozen=True)
class Artifact:
    """A bundle archive placed where the artifact server serves it."""

    name: str
    path: Path
    url: str
    sha256: str
    size: int
    model: str
    version: str
    signature: str | None


@dataclass
class Member:
    """A fleet device as its retained agent message describes it."""

    device: str
    state: str
    group: str | None
    active_version: str | None
    pipeline: str | None
    profile: str | None


@dataclass
class Health:
    """What the canary window saw of one device's new pipeline."""

    device: str
    frames: int = 0
    missed: int = 0
    windows: int = 0
    p95_ms: float | None = None
    budget_ms: float | None = None
    limit_ms: float | None = None
    sessions: list[str] = field(default_factory=list)
    breach: str | None = None

    @property
    def miss_rate(self) -> float:
        return self.missed / self.frames if self.frames else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "frames": self.frames,
            "missed": self.missed,
            "miss_rate": round(self.miss_rate, 5),
            "windows": self.windows,
            "p95_ms": None if self.p95_ms is None else round(self.p95_ms, 3),
            "budget_ms": self.budget_ms,
            "limit_ms": self.limit_ms,
            "breach": self.breach,
        }


@dataclass
class RolloutReport:
    """What happened: who got what, each final result, the canaries' health, and the outcome."""

    action: str
    fleet: str
    deploy_id: str
    # deployed | done (a fleet rollback that worked) | canary-failed | rolled-back | partial | failed
    outcome: str = "pending"
    artifact: dict[str, Any] | None = None
    members: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    canaries: list[str] = field(default_factory=list)
    rest: list[str] = field(default_factory=list)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    health: dict[str, dict[str, Any]] = field(default_factory=dict)
    rolled_back: dict[str, dict[str, Any]] = field(default_factory=dict)
    reason: str = ""
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None

    @property
    def ok(self) -> bool:
        return self.outcome in ("deployed", "done")

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "fleet": self.fleet,
            "id": self.deploy_id,
            "ok": self.ok,
            "outcome": self.outcome,
            "reason": self.reason,
            "artifact": self.artifact,
            "members": self.members,
            "skipped": self.skipped,
            "canaries": self.canaries,
            "rest": self.rest,
            "results": self.results,
            "health": self.health,
            "rolled_back": self.rolled_back,
            "started_at": round(self.started_at, 3),
            "ended_at": None if self.ended_at is None else round(self.ended_at, 3),
        }


# -- the artifact ------------------------------------------------------------------------------


def publish_artifact(bundle: Path, directory: Path, base_url: str) -> Artifact:
    """Put ``bundle`` (folder or .tar.gz) into ``directory`` as ``<model>-<version>-<sha12>.tar.gz``."""
    from edgekit._core.io import sha256_file
    from edgekit.bundle.archive import is_archive_name, open_bundle, pack
    from edgekit.bundle.manifest import SIGNATURE_FILE, read_manifest

    if not directory.is_dir():
        raise DeployError(
            f"--artifacts {directory} is not a folder",
            "give the folder `edgekit fleet serve --artifacts DIR` serves",
        )
    if not base_url.lower().startswith(("http://", "https://")):
        raise DeployError(
            f"--artifact-url {base_url!r} is not an http(s) URL",
            "the URL devices reach the artifact folder at, e.g. http://server:8765/artifacts",
        )
    with open_bundle(bundle) as folder:
        manifest = read_manifest(folder)
        sig_file = folder / SIGNATURE_FILE
        # manifest.sig is base64 text already; the agent verifies the bundle itself, this is for the record.
        signature = sig_file.read_bytes().strip().decode("ascii", "replace") if sig_file.is_file() else None
        if signature is not None and not re.fullmatch(r"[A-Za-z0-9+/=_-]{1,4096}", signature):
            signature = (
                None  # not what edgekit writes: leave it out rather than have agents refuse the command
            )
    with tempfile.TemporaryDirectory(prefix=".edgekit-artifact-", dir=directory) as tmp:
        staged = Path(tmp) / "bundle.tar.gz"
        if bundle.is_dir():
            pack(bundle, staged)
        elif is_archive_name(bundle):
            shutil.copyfile(bundle, staged)
        else:
            raise DeployError(f"{bundle} is not a bundle folder or .tar.gz", "pass what edgekit build wrote")
        sha = sha256_file(staged)
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{manifest.model.name}-{manifest.model.version}").strip(".-")
        name = f"{stem[:80] or 'bundle'}-{sha[:12]}.tar.gz"
        assert safe_artifact_name(name), name
        target = directory / name
        staged.replace(target)  # same folder: atomic, so the server never serves half a file
    size = target.stat().st_size
    url = f"{base_url.rstrip('/')}/{name}"
    return Artifact(name, target, url, sha, size, manifest.model.name, manifest.model.version, signature)


def check_served(artifact: Artifact, timeout_s: float = 10.0) -> str | None:
    """HEAD the artifact's URL from here: None when it is served with the right size, else why not."""
    request = urllib.request.Request(artifact.url, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            length = response.headers.get("Content-Length")
    except urllib.error.HTTPError as err:
        return f"{artifact.url} answered HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        return f"{artifact.url} is not reachable from here: {getattr(err, 'reason', err)}"
    if length is not None and length.isdigit() and int(length) != artifact.size:
        return f"{artifact.url} is {length} bytes, the archive {artifact.size}"
    return None


# -- parsing the command line's values ----------------------------------------------------------


def parse_share(text: str) -> float:
    """``10%`` or ``0.1`` -> 0.1 (a share in (0, 1])."""
    t = text.strip()
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise DeployError(f"--canary {text!r} is not a share of the fleet", "write e.g. 10% or 0.25")
    return value


def canary_count(members: int, share: float) -> int:
    """ceil(share x members), at least one when there is anyone."""
    return min(members, max(1, math.ceil(share * members - 1e-9))) if members else 0


def rollback_id(deploy_id: str) -> str:
    """The id of the rollback that undoes ``deploy_id`` (``<id>-rb``, kept within 64 characters)."""
    return f"{deploy_id[:61]}-rb"


# -- the MQTT side --------------------------------------------------------------------------------


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
        self.telemetry: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        self.watched: set[str] = set()
        self.on_progress: Callable[[dict[str, Any]], None] | None = None
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
        return [(topic(f, "+", leaf), 1) for leaf in ("agent", "cmd/result", "status")] + [
            (topic(f, d, "telemetry"), 1) for d in sorted(self.watched)
        ]

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
                body = _json_object(payload)
                if body and body.get("device") == device:
                    self.telemetry.setdefault(device, []).append((now, body))
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

    def send(self, command: Command) -> None:
        """Publish ``command`` to its device (QoS 1; waits for the broker's PUBACK)."""
        info = self._client.publish(topic(self.fleet, command.device, "cmd"), command.to_json(), qos=1)
        try:
            info.wait_for_publish(10.0)
        except (RuntimeError, ValueError) as err:
            raise DeployError(
                f"could not publish the command for {command.device}: {err}", "check the broker connection"
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

    def snapshot_sessions(self, device: str) -> set[str]:
        with self._cond:
            return set(self.sessions.get(device, {}))

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def _json_object(payload: bytes) -> dict[str, Any] | None:
    try:
        body = loads_strict(payload, limit=MAX_TELEMETRY_BYTES)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _member(device: str, body: dict[str, Any]) -> Member:
    active = body.get("active") if isinstance(body.get("active"), dict) else {}
    version = active.get("version") if isinstance(active, dict) else None
    return Member(
        device,
        str(body.get("state")),
        body.get("group") if isinstance(body.get("group"), str) else None,
        version if isinstance(version, str) else None,
        body.get("pipeline") if isinstance(body.get("pipeline"), str) else None,
        body.get("profile") if isinstance(body.get("profile"), str) else None,
    )


def choose_members(
    agents: dict[str, dict[str, Any]], targets: Sequence[str], group: str | None
) -> tuple[list[Member], dict[str, str]]:
    """The devices to deploy to, by name, and those left out with why (offline, unknown)."""
    skipped: dict[str, str] = {}
    chosen: list[Member] = []
    if targets:
        for device in sorted(set(targets)):
            body = agents.get(device)
            if body is None:
                skipped[device] = "no agent with this id has reported to the broker"
                continue
            m = _member(device, body)
            if m.state != "online":
                skipped[device] = "its agent is offline"
            else:
                chosen.append(m)
        return chosen, skipped
    for device in sorted(agents):
        m = _member(device, agents[device])
        if m.group != group:
            continue
        if m.state != "online":
            skipped[device] = "its agent is offline"
        else:
            chosen.append(m)
    return chosen, skipped


# -- the rollout ----------------------------------------------------------------------------------


@dataclass
class RolloutOptions:
    """What to roll out where, and the canary's rules."""

    fleet: str
    mqtt: str
    targets: Sequence[str] = ()
    group: str | None = None
    bundle: Path | None = None
    artifacts: Path | None = None
    artifact_url: str | None = None
    deploy_id: str | None = None
    canary_share: float | None = None
    canary_window_s: float = 60.0
    slo_p95_ms: float | None = None
    slo_miss_rate: float = DEFAULT_MISS_RATE
    timeout_s: float = DEFAULT_TIMEOUT_S
    startup_grace_s: float = 120.0


class Rollout:
    """One fleet deploy (``deploy()``) or rollback (``rollback()``); ``report`` says what happened."""

    def __init__(self, options: RolloutOptions, on_event: Event | None = None) -> None:
        o = options
        if not safe_name(o.fleet):
            raise DeployError(f"fleet {o.fleet!r} is not a safe name", "1-128 of A-Z a-z 0-9 . _ -")
        for device in o.targets:
            if not safe_name(device):
                raise DeployError(f"--target {device!r} is not a device id", "1-128 of A-Z a-z 0-9 . _ -")
        if bool(o.targets) == (o.group is not None):
            raise DeployError(
                "say which devices: --target D (repeatable) or --group G", "e.g. --group lobby --canary 10%"
            )
        if o.deploy_id is not None and not safe_deploy_id(o.deploy_id):
            raise DeployError(
                f"--id {o.deploy_id!r} is not a deploy id", "1-64 of A-Z a-z 0-9 . _ - starting with a letter"
            )
        self.options = o
        self.on_event = on_event or (lambda kind, info: None)
        self.report = RolloutReport("deploy", o.fleet, o.deploy_id or "")

    def _event(self, kind: str, **info: Any) -> None:
        self.on_event(kind, info)

    def _members(self, link: FleetLink) -> list[Member]:
        o = self.options
        with link._cond:
            agents = dict(link.agents)
        members, skipped = choose_members(agents, o.targets, o.group)
        self.report.members = [m.device for m in members]
        self.report.skipped = skipped
        self._event("members", members=[m.device for m in members], skipped=skipped)
        if not members:
            where = f"group {o.group!r}" if o.group is not None else f"targets {', '.join(o.targets)}"
            raise DeployError(
                f"no online agent in fleet {o.fleet!r} for {where}"
                + (f" ({'; '.join(f'{d}: {why}' for d, why in skipped.items())})" if skipped else ""),
                "start `edgekit agent run --fleet F --device-id D [--group G]` on the devices",
            )
        return members

    # -- deploy ---------------------------------------------------------------------------------

    def deploy(self) -> RolloutReport:
        """Run the rollout; never raises for a device's refusal (that is in the report), only for setup errors."""
        o = self.options
        if o.bundle is None or o.artifacts is None or o.artifact_url is None:
            raise DeployError(
                "a fleet deploy needs --bundle (or --model), --artifacts DIR and --artifact-url URL",
                "e.g. --artifacts /srv/edgekit/artifacts --artifact-url http://server:8765/artifacts "
                "(what `edgekit fleet serve --artifacts DIR` serves)",
            )
        artifact = publish_artifact(o.bundle, o.artifacts, o.artifact_url)
        problem = check_served(artifact)
        if problem is not None and "HTTP 404" in problem:
            raise DeployError(problem, "--artifact-url must be where the server serves --artifacts DIR")
        report = self.report
        report.deploy_id = o.deploy_id or new_deploy_id("d", artifact.sha256)
        report.artifact = {
            "name": artifact.name,
            "url": artifact.url,
            "sha256": artifact.sha256,
            "size": artifact.size,
            "model": artifact.model,
            "version": artifact.version,
        }
        self._event("artifact", **report.artifact, warning=problem)
        link = FleetLink(o.mqtt, o.fleet).connect()
        link.on_progress = lambda body: self._event("progress", **body)
        try:
            self._deploy(link, artifact)
        finally:
            link.close()
            report.ended_at = time.time()
            self._event("done", outcome=report.outcome, ok=report.ok, reason=report.reason)
        return report

    def _commands(self, devices: Sequence[str], artifact: Artifact) -> list[Command]:
        rid = self.report.deploy_id
        return [
            deploy_message(rid, d, artifact.url, artifact.sha256, artifact.size, artifact.signature)
            for d in devices
        ]

    def _send_and_wait(
        self, link: FleetLink, commands: Sequence[Command], phase: str, undo: bool = False
    ) -> dict[str, bool]:
        """Send ``commands``, wait for their final results; record them (``undo``: as rollbacks); device -> ok."""
        for cmd in commands:
            self._event("send", device=cmd.device, id=cmd.id, action=cmd.action, phase=phase)
            link.send(cmd)
        keys = [(c.device, c.id) for c in commands]
        finals = link.wait_finals(keys, self.options.timeout_s)
        oks: dict[str, bool] = {}
        for device, rid in keys:
            body = finals.get((device, rid))
            if body is None:
                body = {
                    "ok": False,
                    "step": "timeout",
                    "reason": f"no final result within {self.options.timeout_s:g} s",
                }
            target = self.report.rolled_back if undo else self.report.results
            target[device] = {
                k: body.get(k) for k in ("ok", "step", "reason", "hint", "version", "health", "replayed")
            }
            oks[device] = bool(body.get("ok"))
            self._event("result", device=device, phase=phase, **target[device])
        return oks

    def _deploy(self, link: FleetLink, artifact: Artifact) -> None:
        o, report = self.options, self.report
        members = self._members(link)
        devices = [m.device for m in members]
        share = o.canary_share
        canaries = devices[: canary_count(len(devices), share)] if share is not None else []
        rest = [d for d in devices if d not in canaries]
        report.canaries, report.rest = canaries, rest
        if canaries:
            pipelines = {m.device: m.pipeline for m in members}
            # Sessions that exist now are the old version's: the window must only count the new one's.
            old_sessions = {d: link.snapshot_sessions(d) for d in canaries}
            link.watch(d for d in canaries if pipelines.get(d) != "none")
            oks = self._send_and_wait(link, self._commands(canaries, artifact), "canary")
            if not all(oks.values()):
                failed = [d for d in canaries if not oks[d]]
                report.reason = "canary " + ", ".join(
                    f"{d} failed at {report.results[d].get('step')}: {report.results[d].get('reason')}"
                    for d in failed
                )
                report.outcome = "canary-failed"
                # Only those that switched: a rollback where the install failed would go one version too far.
                self._roll_back(link, [d for d in canaries if oks[d]])
                return
            breaches = self._watch(link, canaries, old_sessions, pipelines, artifact.version)
            if breaches:
                report.reason = "; ".join(f"{d}: {why}" for d, why in breaches.items())
                report.outcome = "rolled-back"
                self._roll_back(link, canaries)
                return
        if rest:
            oks = self._send_and_wait(link, self._commands(rest, artifact), "rest")
            if not all(oks.values()):
                failed = [d for d in rest if not oks[d]]
                report.outcome = _outcome(oks)
                report.reason = ", ".join(
                    f"{d} failed at {report.results[d].get('step')}: {report.results[d].get('reason')}"
                    for d in failed
                )
                return
        report.outcome = "deployed"

    def _roll_back(self, link: FleetLink, devices: Sequence[str]) -> None:
        if not devices:
            return
        rid = rollback_id(self.report.deploy_id)
        self._send_and_wait(link, [rollback_message(rid, d) for d in devices], "rollback", undo=True)

    def _watch(
        self,
        link: FleetLink,
        canaries: Sequence[str],
        old_sessions: dict[str, set[str]],
        pipelines: dict[str, str | None],
        version: str,
    ) -> dict[str, str]:
        """Watch the canaries' new pipelines for the window; device -> why it breached (empty: all held)."""
        o = self.options
        watched = [d for d in canaries if pipelines.get(d) != "none"]
        for d in canaries:
            if d not in watched:
                self.report.health[d] = {
                    "device": d,
                    "breach": None,
                    "note": "no pipeline runs there: nothing to watch",
                }
        started = time.monotonic()
        first: dict[str, float] = {}
        self._event("watch", devices=watched, window_s=o.canary_window_s, slo_p95_ms=o.slo_p95_ms)
        while True:
            now = time.monotonic()
            health = {d: self._health(link, d, old_sessions[d], version) for d in watched}
            for d, h in health.items():
                if h.frames and d not in first:
                    first[d] = now
            waiting = [d for d in watched if d not in first]
            if waiting and now - started > o.startup_grace_s:
                for d in waiting:
                    health[d].breach = f"no telemetry from the new version within {o.startup_grace_s:g} s"
                break
            if not waiting and all(now - first[d] >= o.canary_window_s for d in watched):
                break
            time.sleep(0.25)
        breaches: dict[str, str] = {}
        for d, h in health.items():
            if h.breach is None:
                h.breach = self._judge(h)
            self.report.health[d] = h.to_dict()
            if h.breach is not None:
                breaches[d] = h.breach
        self._event("verdict", health=self.report.health, breaches=breaches)
        return breaches

    def _health(self, link: FleetLink, device: str, old: set[str], version: str) -> Health:
        """Merge the windows of ``device``'s new sessions (new since the command, of ``version``)."""
        o = self.options
        h = Health(device)
        with link._cond:
            sessions = dict(link.sessions.get(device, {}))
            messages = list(link.telemetry.get(device, []))
        fresh: dict[str, dict[str, Any]] = {}
        for session, (_, body) in sessions.items():
            model = body.get("model") if isinstance(body.get("model"), dict) else {}
            if session not in old and (
                not isinstance(model, dict) or model.get("version") in (None, version)
            ):
                fresh[session] = body
        h.sessions = sorted(fresh)
        sketch = LatencySketch()
        seen: set[tuple[str, int]] = set()
        for _, body in messages:
            sid, seq = body.get("session"), body.get("seq")
            window = body.get("window")
            if not isinstance(sid, str) or sid not in fresh:
                continue
            if type(seq) is not int or not isinstance(window, dict):
                continue
            if (sid, seq) in seen:  # a replay after a reconnect
                continue
            seen.add((sid, seq))
            try:
                frames, missed = int(window["frames"]), int(window["missed"])
                if frames:
                    sketch.merge(LatencySketch.from_dict(window["latency_ms"]))
            except (KeyError, TypeError, ValueError):
                continue
            h.frames += frames
            h.missed += missed
            h.windows += 1
        h.p95_ms = sketch.quantile(0.95) if sketch.count else None
        budgets = [
            float(b["budget_ms"]) for b in fresh.values() if isinstance(b.get("budget_ms"), (int, float))
        ]
        h.budget_ms = budgets[-1] if budgets else None
        h.limit_ms = o.slo_p95_ms if o.slo_p95_ms is not None else h.budget_ms
        return h

    def _judge(self, h: Health) -> str | None:
        if h.limit_ms is not None and h.p95_ms is not None and h.p95_ms > h.limit_ms:
            return f"p95 {h.p95_ms:.2f} ms over {h.frames} frames > the limit of {h.limit_ms:g} ms"
        if h.miss_rate > self.options.slo_miss_rate:
            return (
                f"{h.missed} of {h.frames} frames missed the budget ({h.miss_rate:.1%} > "
                f"{self.options.slo_miss_rate:.1%})"
            )
        return None

    # -- rollback -------------------------------------------------------------------------------

    def rollback(self) -> RolloutReport:
        """Send a rollback command to every chosen device and wait for the results."""
        o, report = self.options, self.report
        report.action = "rollback"
        report.deploy_id = o.deploy_id or new_deploy_id("rb")
        link = FleetLink(o.mqtt, o.fleet).connect()
        link.on_progress = lambda body: self._event("progress", **body)
        try:
            devices = [m.device for m in self._members(link)]
            oks = self._send_and_wait(
                link, [rollback_message(report.deploy_id, d) for d in devices], "rollback"
            )
            report.outcome = "done" if all(oks.values()) else _outcome(oks)
            failed = [d for d in devices if not oks[d]]
            report.reason = ", ".join(f"{d}: {report.results[d].get('reason')}" for d in failed)
        finally:
            link.close()
            report.ended_at = time.time()
            self._event("done", outcome=report.outcome, ok=report.ok, reason=report.reason)
        return report


def _outcome(oks: dict[str, bool]) -> str:
    """``deployed`` (all ok), ``partial`` (some) or ``failed`` (none)."""
    if all(oks.values()):
        return "deployed"
    return "partial" if any(oks.values()) else "failed"


def run(
    fleet: str,
    mqtt: str,
    *,
    bundle: Path | None = None,
    targets: Sequence[str] = (),
    group: str | None = None,
    artifacts: Path | None = None,
    artifact_url: str | None = None,
    deploy_id: str | None = None,
    canary: str | None = None,
    canary_window: str | None = None,
    slo_p95_ms: float | None = None,
    action: str = "deploy",
    on_event: Event | None = None,
) -> RolloutReport:
    """A fleet deploy (``action="deploy"``) or rollback from command-line values (``"10%"``, ``"60s"``)."""
    options = RolloutOptions(
        fleet=fleet,
        mqtt=mqtt,
        targets=tuple(targets),
        group=group,
        bundle=bundle,
        artifacts=artifacts,
        artifact_url=artifact_url,
        deploy_id=deploy_id,
        canary_share=parse_share(canary) if canary else None,
        canary_window_s=parse_seconds(canary_window, "--canary-window") if canary_window else 60.0,
        slo_p95_ms=slo_p95_ms,
    )
    if slo_p95_ms is not None and not slo_p95_ms > 0:
        raise DeployError(f"--slo-p95-ms {slo_p95_ms} is not positive", "a latency in ms, e.g. 30")
    rollout = Rollout(options, on_event)
    return rollout.rollback() if action == "rollback" else rollout.deploy()
