"""``edgekit deploy --fleet F --waves 1,10,50,100``: a rollout in percentage waves, each gated on the fleet SLO.

::

    plan      the members (as ``edgekit.deploy.rollout`` finds them), by name, cut into waves:
              wave k holds the devices up to ceil(share_k x members), at least one new one each
    wave k    its devices are marked *sent* in the state (saved), then get the signed deploy
              command; their final results are awaited (or, after a restart, the retained agent
              message that says the rollout's deploy id is active)
    gate      the new version's windows of every device updated so far (waves 1..k), from the
              first window of each device of wave k, for --wave-window: their latency sketches
              merged into one, whose p95 must be within --slo-p95-ms (default: the smallest
              budget the devices report) and whose miss share within 1%
    stop      a breach, a failed install, no telemetry, or an operator's abort: rollback
              commands to every device that switched; nobody in a later wave gets anything

The operator steers a running rollout with a *retained* MQTT message on
``edgekit/v1/<fleet>/~rollout/<id>/control`` (``edgekit deploy control --fleet F --id ID
pause|resume|abort``).  Why a retained message rather than a signal or a row: the rollout
already holds a connection to the broker, so no port or file has to be shared with the
operator's machine; the broker keeps the last word, so a rollout restarted while paused or
after an abort reads it on subscribing and does what it said; and the broker's ACL says who
may publish there (``write edgekit/v1/<fleet>/~rollout/#`` for operators only).  ``~`` is no
device-name character, so no device's topics can collide with it.

The state (``WaveState``: the plan, who was sent what, every result, each gate) is a JSON file,
and with ``--state-db`` a row of the fleet store too (``StateFile``), rewritten before each batch
of commands goes out: a rollout killed at any point
and started again with the same --state continues where it stopped.  A device marked sent is
never sent the deploy command again (at most once: one marked just before a crash may never
have had it, and is then judged by its agent message, or times out); results already in are kept.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgekit.core.io import write_atomic
from edgekit.deploy.canary import DEFAULT_MISS_RATE, CanaryWatch
from edgekit.deploy.command_trust import load_signing_key, sign_command
from edgekit.deploy.link import FleetLink
from edgekit.deploy.members import choose_members
from edgekit.deploy.publish import Artifact
from edgekit.errors import DeployError, EdgekitError
from edgekit.protocol.control import Command, deploy_message, rollback_message
from edgekit.protocol.topics import TOPIC_ROOT

Event = Callable[[str, dict[str, Any]], None]
log = logging.getLogger(__name__)

CONTROL_ACTIONS = ("pause", "resume", "abort")
SEND_BATCH = 50  # devices marked sent per state write: the most a crash can leave unsure
POLL_S = 0.25
UNSURE_WAIT_S = 15.0  # how long a device the rollout stopped while sending to may take to answer
UNSURE = (
    "the rollout stopped while its command was being sent, and it has not answered: "
    "probably never sent; deploy to it again with the same --id (its agent answers a done id from its record)"
)
RUNNING = ("planned", "running", "paused", "rolling-back")  # a state in one of these continues on restart


def control_topic(fleet: str, rollout_id: str) -> str:
    """``edgekit/v1/<fleet>/~rollout/<id>/control``: where an operator pauses, resumes or aborts a rollout."""
    return f"{TOPIC_ROOT}/{fleet}/~rollout/{rollout_id}/control"


def default_state_path(fleet: str) -> Path:
    """``./.edgekit/rollouts/<fleet>.json``: where a wave rollout keeps its state without --state."""
    return Path(".edgekit") / "rollouts" / f"{fleet}.json"


def parse_waves(text: str) -> list[float]:
    """``1,10,50,100`` (or ``1%,10%,...``) -> ``[0.01, 0.1, 0.5, 1.0]``: rising shares, the last 100%."""
    shares: list[float] = []
    for part in text.split(","):
        t = part.strip().rstrip("%")
        try:
            value = float(t) / 100
        except ValueError:
            value = -1.0
        if not 0 < value <= 1 or (shares and value <= shares[-1]):
            raise DeployError(
                f"--waves {text!r}: {part.strip()!r} is not a rising share of the fleet",
                "percentages that rise and end at 100, e.g. --waves 1,10,50,100",
            )
        shares.append(value)
    if not shares or shares[-1] != 1.0:
        raise DeployError(f"--waves {text!r} does not end at 100", "e.g. --waves 1,10,50,100")
    return shares


def plan_waves(devices: Sequence[str], shares: Sequence[float]) -> list[list[str]]:
    """``devices`` (sorted by name: a repeatable plan) cut at ceil(share x n); a wave that adds nobody is left out."""
    ordered = sorted(devices)
    n, waves, upto = len(ordered), [], 0
    for share in shares:
        end = min(n, max(upto + 1, math.ceil(share * n - 1e-9)))
        if end > upto:
            waves.append(ordered[upto:end])
            upto = end
    return waves


@dataclass
class WaveState:
    """A wave rollout as far as it got: saved after each step, read back by a restarted process."""

    fleet: str
    id: str
    artifact: dict[str, Any]
    shares: list[float]
    waves: list[list[str]]
    # planned | running | paused | rolling-back, then deployed | breached | failed | aborted
    status: str = "planned"
    stopped: str = (
        ""  # why it stops before the end (breached | failed | aborted): rolled back, then the status
    )
    wave: int = 0  # the wave in progress (or the last one)
    sent: dict[str, int] = field(default_factory=dict)  # device -> its wave; marked before the command
    # marked sent, the broker's PUBACK not yet seen: after a crash, unsure whether it went out
    pending: list[str] = field(default_factory=list)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    gates: list[dict[str, Any]] = field(default_factory=list)  # one per wave that was judged
    rollback_sent: list[str] = field(default_factory=list)
    rolled_back: dict[str, dict[str, Any]] = field(default_factory=dict)
    reason: str = ""
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    restarts: int = 0
    saved_at: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "deployed"

    def switched(self) -> list[str]:
        """The devices whose deploy worked: a rollback goes to these, and only these."""
        return sorted(d for d, r in self.results.items() if r.get("ok"))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok}

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> WaveState:
        known = {k: body[k] for k in cls.__dataclass_fields__ if k in body}
        return cls(**known)


class StateFile:
    """The rollout's state: a JSON file replaced whole on each save, and a row in the fleet store if reachable.

    The file is always written (it is local, and the store may go away mid-rollout); with
    ``db`` (what ``edgekit fleet serve --db`` takes: a SQLite path or a PostgreSQL URL) the same
    JSON is kept in its ``rollout_state`` table under the fleet and the file's stem, so a rollout
    started again on another host, without the file, continues too.  On load the newer copy wins.
    """

    def __init__(
        self, path: Path, db: str | None = None, warn: Callable[[str], None] | None = None, fleet: str = ""
    ) -> None:
        self.path = path
        self.fleet = fleet  # the store's rows are per fleet
        self.db = db
        self.warn = warn or (lambda text: log.warning("rollout: %s", text))
        self._store: Any = None
        self._errors: tuple[type[Exception], ...] = (EdgekitError,)
        if db is not None:
            from edgekit.fleet.open_store import open_store

            try:
                self._store = open_store(db)
                self._errors = (EdgekitError, *self._store.transient)  # its driver's "cannot reach" errors
            except EdgekitError as err:  # unreachable: the file alone keeps the state
                self.warn(
                    f"the fleet store {db} cannot be opened ({err.message}): the state is kept in {path} only"
                )

    def load(self) -> WaveState | None:
        copies = [c for c in (self._from_file(), self._from_store()) if c is not None]
        return max(copies, key=lambda c: c.saved_at) if copies else None

    def _from_file(self) -> WaveState | None:
        try:
            body = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise DeployError(
                f"the rollout state {self.path} cannot be read ({err})",
                "it says which devices have the command already; fix it, or pass another --state "
                "to start a new rollout",
            ) from err
        return WaveState.from_dict(body)

    def _from_store(self) -> WaveState | None:
        if self._store is None:
            return None
        try:
            row = self._store.rollout(self.fleet, self.path.stem)
        except self._errors as err:  # the store went away: the file still holds the state
            self.warn(f"the fleet store cannot be read ({err}): using {self.path}")
            return None
        return WaveState.from_dict(json.loads(row[0])) if row is not None else None

    def save(self, state: WaveState) -> None:
        state.saved_at = time.time()
        data = json.dumps(state.to_dict(), separators=(",", ":"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, data.encode())
        if self._store is not None:
            try:
                self._store.save_rollout(state.fleet, self.path.stem, data, state.saved_at)
            except self._errors as err:  # the store went away: the file has it; said once
                self.warn(
                    f"the fleet store cannot take the rollout's state ({err}): kept in {self.path} only"
                )
                self.close()

    def close(self) -> None:
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.close()
            self._store = None


@dataclass
class WaveOptions:
    """The waves and their gate (the rest: ``RolloutOptions``' broker, fleet, key and timeouts)."""

    shares: list[float]
    state_path: Path
    state_db: str | None = None  # the fleet store (a SQLite path or PostgreSQL URL) to keep it in too
    window_s: float = 60.0
    slo_p95_ms: float | None = None
    slo_miss_rate: float = DEFAULT_MISS_RATE
    startup_grace_s: float = 120.0
    timeout_s: float = 900.0


class WaveRollout:
    """One wave rollout of ``artifact`` to ``devices`` (or, with a state file, the one it holds)."""

    def __init__(
        self,
        fleet: str,
        mqtt: str,
        options: WaveOptions,
        *,
        sign_key: Path | None = None,
        on_event: Event | None = None,
    ) -> None:
        self.fleet, self.mqtt, self.options = fleet, mqtt, options
        self._key = load_signing_key(sign_key) if sign_key is not None else None
        self.on_event = on_event or (lambda kind, info: None)
        self.store = StateFile(
            options.state_path, options.state_db, lambda text: self._event("warning", text=text), fleet
        )
        self._control = "resume"
        self._control_at = 0.0
        self._lock = threading.Lock()
        self.state: WaveState | None = None
        self._unsure: set[str] = set()

    def _event(self, kind: str, **info: Any) -> None:
        self.on_event(kind, info)

    # -- the plan or the state --------------------------------------------------------------------

    def resume_or_plan(
        self, link: FleetLink, artifact: Artifact, deploy_id: str, targets: Sequence[str], group: str | None
    ) -> WaveState:
        """The state file's rollout when one is unfinished there, else a new plan over the online members."""
        old = self.store.load()
        if old is not None and old.status in RUNNING:
            if old.fleet != self.fleet or old.artifact.get("sha256") != artifact.sha256:
                raise DeployError(
                    f"{self.store.path} holds rollout {old.id} of {old.artifact.get('name')} to fleet "
                    f"{old.fleet}, not this one",
                    "finish or abort that one first, or pass another --state",
                )
            old.restarts += 1
            # Marked sent when the process stopped, but maybe never sent: judged by what they say,
            # never sent again (a command once: the agent's deploy record would answer it anyway).
            self._unsure = set(old.pending)
            self._event("resume", id=old.id, wave=old.wave, sent=len(old.sent), results=len(old.results))
            return old
        members, skipped = choose_members(link.snapshot_agents(), targets, group)
        devices = [m.device for m in members]
        if not devices:
            raise DeployError(
                f"no online agent in fleet {self.fleet!r} to roll out to",
                "start `edgekit agent run --fleet F --device-id D [--group G]` on the devices",
            )
        waves = plan_waves(devices, self.options.shares)
        state = WaveState(
            fleet=self.fleet,
            id=deploy_id,
            artifact={
                "name": artifact.name,
                "url": artifact.url,
                "sha256": artifact.sha256,
                "size": artifact.size,
                "model": artifact.model,
                "version": artifact.version,
            },
            shares=list(self.options.shares),
            waves=waves,
        )
        self._event(
            "plan", id=deploy_id, members=len(devices), skipped=skipped, waves=[len(w) for w in waves]
        )
        return state

    def _save(self) -> None:
        assert self.state is not None
        self.store.save(self.state)

    # -- the operator's word ----------------------------------------------------------------------

    def _on_control(self, payload: bytes) -> None:
        try:
            body = json.loads(payload) if payload else {}
        except ValueError:
            return
        action = body.get("action") if isinstance(body, dict) else None
        if action in CONTROL_ACTIONS:
            with self._lock:
                self._control = str(action)
                self._control_at = time.time()
            self._event("control", action=action, reason=body.get("reason", ""))

    def _word(self) -> str:
        with self._lock:
            return self._control

    def _hold(self) -> bool:
        """Wait while paused; ``False`` when the operator aborted."""
        assert self.state is not None
        if self._word() == "pause":
            self.state.status = "paused"
            self._save()
            self._event("paused", wave=self.state.wave)
            while self._word() == "pause":
                time.sleep(POLL_S)
            if self._word() != "abort":
                self.state.status = "running"
                self._save()
                self._event("resumed", wave=self.state.wave)
        return self._word() != "abort"

    # -- the run ----------------------------------------------------------------------------------

    def run(
        self, artifact: Artifact, deploy_id: str, targets: Sequence[str] = (), group: str | None = None
    ) -> WaveState:
        """Run (or continue) the rollout; returns its final state (also in the state file)."""
        link = FleetLink(self.mqtt, self.fleet).connect()
        link.on_progress = lambda body: None
        try:
            self.state = state = self.resume_or_plan(link, artifact, deploy_id, targets, group)
            link.listen(control_topic(self.fleet, state.id), self._on_control)
            time.sleep(0.5)  # the retained word, if any, comes right after the SUBACK
            if not state.stopped:
                state.status = "running"
                self._save()
                self._waves(link, artifact)
            if state.stopped:
                state.status = "rolling-back"
                self._save()
                self._roll_back(link)
                state.status = state.stopped
            if state.status not in RUNNING:
                # Finished: the retained word has done its job; a later rollout must not read it.
                link.publish(control_topic(self.fleet, state.id), b"", retain=True)
        finally:
            link.close()
            if self.state is not None:
                if self.state.status not in RUNNING:
                    self.state.ended_at = time.time()
                self._save()
                self._event("done", status=self.state.status, reason=self.state.reason)
            self.store.close()
        return self.state

    def _waves(self, link: FleetLink, artifact: Artifact) -> None:
        state = self.state
        assert state is not None
        canary = CanaryWatch(self.fleet, self.options.slo_p95_ms, self.options.slo_miss_rate, batch_size=1000)
        try:
            # Every device sent to so far: their telemetry is what the gates judge.
            link.watch(state.sent)
            for k in range(state.wave, len(state.waves)):
                state.wave = k
                if not self._hold():
                    state.stopped, state.reason = "aborted", f"aborted by the operator in wave {k + 1}"
                    return
                wave = state.waves[k]
                t0 = time.monotonic()
                self._event("wave", wave=k + 1, of=len(state.waves), devices=len(wave))
                link.watch(wave)
                if not self._send(link, wave, k, artifact):
                    # Aborted while sending: the wave's commands already out are finished first.
                    self._collect(link, [d for d in wave if d in state.sent])
                    state.stopped, state.reason = "aborted", f"aborted by the operator in wave {k + 1}"
                    return
                failed = self._collect(link, wave)
                sent_s = time.monotonic() - t0
                if failed:
                    state.stopped = "failed"
                    state.reason = (
                        f"wave {k + 1}: "
                        + ", ".join(
                            f"{d} failed at {state.results[d].get('step')}: {state.results[d].get('reason')}"
                            for d in failed[:5]
                        )
                        + (f" (and {len(failed) - 5} more)" if len(failed) > 5 else "")
                    )
                    return
                gate = self._gate(link, canary, k)
                gate |= {"installed_s": round(sent_s, 3), "seconds": round(time.monotonic() - t0, 3)}
                if len(state.gates) > k:
                    state.gates[k] = gate
                else:
                    state.gates.append(gate)
                self._save()
                self._event("gate", **gate, verdict=f"BREACH: {gate['breach']}" if gate["breach"] else "held")
                if gate["aborted"]:
                    state.stopped, state.reason = "aborted", f"aborted by the operator in wave {k + 1}"
                    return
                if gate["breach"] is not None:
                    state.stopped, state.reason = "breached", f"wave {k + 1}: {gate['breach']}"
                    return
            state.status = "deployed"
        finally:
            canary.close()

    # -- sending and results ------------------------------------------------------------------------

    def _signed(self, cmd: Command) -> Command:
        return sign_command(cmd, self._key) if self._key is not None else cmd

    def _deploy_command(self, device: str, artifact: Artifact) -> Command:
        assert self.state is not None
        cmd = deploy_message(
            self.state.id, device, artifact.url, artifact.sha256, artifact.size, self.options.timeout_s,
            fleet=self.fleet,
        )  # fmt: skip
        return self._signed(cmd)

    def _send(self, link: FleetLink, wave: Sequence[str], k: int, artifact: Artifact) -> bool:
        """Mark and send the wave's commands in batches; ``False`` when the operator aborted midway."""
        state = self.state
        assert state is not None
        todo = [d for d in wave if d not in state.sent]
        for start in range(0, len(todo), SEND_BATCH):
            if not self._hold():
                return False
            batch = todo[start : start + SEND_BATCH]
            for d in batch:
                state.sent[d] = k
            state.pending = list(batch)
            self._save()  # before the commands: a restarted rollout never sends these again
            link.send_many([self._deploy_command(d, artifact) for d in batch])
            state.pending = []  # the broker has them all (saved with the next results)
            self._event("sent", wave=k + 1, devices=len(batch), total=len(state.sent))
        return True

    def _collect(self, link: FleetLink, devices: Sequence[str], rollback: bool = False) -> list[str]:
        """Wait for the final results of ``devices``; returns those that failed.

        A device whose final result this process did not hear (it was sent before a restart) is
        judged by its retained agent message: the rollout's id active there means it switched.
        """
        state = self.state
        assert state is not None
        rid = _rollback_id(state.id) if rollback else state.id
        book = state.rolled_back if rollback else state.results
        waiting = [d for d in devices if d not in book]
        started = time.monotonic()
        deadline = started + self.options.timeout_s
        while waiting:
            finals = link.wait_finals([(d, rid) for d in waiting], min(1.0, self.options.timeout_s))
            agents = link.snapshot_agents() if not rollback else {}
            still = []
            for d in waiting:
                body = finals.get((d, rid))
                if body is None and _active_id(agents.get(d)) == rid:
                    body = {"ok": True, "step": "done", "reason": "", "from": "agent message"}
                if body is None:
                    still.append(d)
                else:
                    book[d] = {
                        k: body.get(k) for k in ("ok", "step", "reason", "version", "replayed", "from")
                    }
            if len(still) < len(waiting):
                self._save()
            waiting = still
            unsure = [d for d in waiting if d in self._unsure and not rollback]
            if unsure and time.monotonic() > started + min(self.options.timeout_s, UNSURE_WAIT_S):
                for d in unsure:  # most likely never sent: left out, not a failure of the wave
                    book[d] = {"ok": None, "step": "unsure", "reason": UNSURE}
                waiting = [d for d in waiting if d not in unsure]
                self._save()
            if waiting and time.monotonic() > deadline:
                for d in waiting:
                    book[d] = {"ok": False, "step": "timeout", "reason": "no final result in time"}
                self._save()
                break
        return [d for d in devices if book[d].get("ok") is False]

    # -- the gate -----------------------------------------------------------------------------------

    def _gate(self, link: FleetLink, canary: CanaryWatch, k: int) -> dict[str, Any]:
        """Watch the new version on every device updated so far; the merged verdict for wave ``k``."""
        state = self.state
        assert state is not None
        o = self.options
        version = str(state.artifact.get("version"))
        updated = [d for d in state.switched() if state.sent.get(d, -1) <= k]
        fresh = [d for d in state.waves[k] if d in updated]
        started = time.monotonic()
        first: float | None = None
        aborted = False

        def take() -> None:
            # What came since the last look, of every updated device: the collector's work is spread
            # over the window instead of piling up at its end.
            for d in updated:
                tail = link.telemetry_since(d, canary.taken(d))
                if tail or d not in canary.reported:
                    canary.take(d, link.births(d), tail, set(), version, start=canary.taken(d))

        while True:
            if not self._hold():
                aborted = True
                break
            now = time.monotonic()
            take()
            if first is None and all(d in canary.reported for d in fresh):
                first = now
            if first is not None and now - first >= o.window_s:
                break
            if first is None and now - started > o.startup_grace_s:
                break
            time.sleep(max(POLL_S, min(1.0, (time.monotonic() - now) * 2)))
        take()
        merged = canary.merged(f"waves 1-{k + 1}")
        budgets = [canary.budgets[d] for d in updated if d in canary.budgets]
        silent = [d for d in fresh if d not in canary.reported]
        merged.limit_ms = o.slo_p95_ms if o.slo_p95_ms is not None else (min(budgets) if budgets else None)
        breach = None
        if not aborted:
            if silent:
                breach = (
                    f"no telemetry from the new version on {len(silent)} of {len(fresh)} devices "
                    f"within {o.startup_grace_s:g} s (e.g. {', '.join(silent[:3])})"
                )
            else:
                breach = canary.judge(merged)
        return {
            "wave": k + 1,
            "devices": len(state.waves[k]),
            "updated": len(updated),
            "frames": merged.frames,
            "p95_ms": None if merged.p95_ms is None else round(merged.p95_ms, 3),
            "limit_ms": merged.limit_ms,
            "miss_rate": round(merged.miss_rate, 5),
            "watched_s": round(time.monotonic() - (first or started), 3),
            "breach": breach,
            "aborted": aborted,
        }

    # -- the way back ------------------------------------------------------------------------------

    def _roll_back(self, link: FleetLink) -> None:
        """Rollback commands to every device that switched (each once, even across restarts)."""
        state = self.state
        assert state is not None
        devices = state.switched()
        todo = [d for d in devices if d not in state.rollback_sent]
        rid = _rollback_id(state.id)
        self._event("rollback", devices=len(devices), id=rid)
        for start in range(0, len(todo), SEND_BATCH):
            batch = todo[start : start + SEND_BATCH]
            state.rollback_sent.extend(batch)
            self._save()
            link.send_many(
                [
                    self._signed(rollback_message(rid, d, self.options.timeout_s, fleet=self.fleet))
                    for d in batch
                ]
            )
        self._collect(link, devices, rollback=True)


def _rollback_id(deploy_id: str) -> str:
    return f"{deploy_id[:61]}-rb"


def _active_id(agent: dict[str, Any] | None) -> str | None:
    active = agent.get("active") if isinstance(agent, dict) else None
    value = active.get("deploy_id") if isinstance(active, dict) else None
    return value if isinstance(value, str) else None


def send_control(mqtt: str, fleet: str, rollout_id: str, action: str, reason: str = "") -> None:
    """``edgekit deploy control``: leave the operator's word (retained) where the rollout reads it."""
    if action not in CONTROL_ACTIONS:
        raise DeployError(f"{action!r} is not a rollout control", f"one of {', '.join(CONTROL_ACTIONS)}")
    link = FleetLink(mqtt, fleet).connect(timeout_s=15.0)
    try:
        body = {"action": action, "reason": reason, "ts": round(time.time(), 3)}
        link.publish(control_topic(fleet, rollout_id), json.dumps(body).encode(), retain=True)
    finally:
        link.close()
