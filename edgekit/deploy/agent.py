"""``edgekit agent run``: the device's deploy service — MQTT commands in, downloads, installs, the pipeline.

One process per device (systemd unit ``edgekit-agent.service``)::

    paho's thread     cmd messages (QoS 1, persistent session) -> a queue; acknowledged only
                      when handled, so a command that arrives while the agent is down, or
                      that was being handled when it died, is delivered (again) on reconnect
    worker thread     one command at a time: check it (edgekit.protocol.control), check who sent
                      it (edgekit.deploy.command_trust: signature, expiry, nonce), answer a
                      replayed id from deploys/<id>.json, download from an allowed origin with
                      Range resume into incoming/ (edgekit.deploy.download), install() /
                      rollback() (edgekit.deploy.install; rollbacks rate-limited), report each
                      step and the outcome on cmd/result, restart the pipeline after a switch;
                      or list the event proofs in proofs/ and send one (edgekit.deploy.agent_proofs)
    supervisor        ``edgekit run <active bundle> --mqtt ... --fleet F --device-id D``
                      as a child (edgekit.deploy.supervisor), writing event proofs to proofs/;
                      restarted after a switch, and with back-off when it crashes
    main thread       says READY=1 to systemd, pets its watchdog while the supervisor and the
                      worker run (the supervisor watches the child's own heartbeats:
                      edgekit.deploy.child_watch), waits for SIGTERM/SIGINT, then stops the
                      rest in order

The retained ``edgekit/v1/<fleet>/<device>/agent`` message says what is installed and
active, the group and the profile (``edgekit deploy --fleet`` finds its members there);
the Last Will turns it ``offline``.  Bad input never ends the agent: each refusal is a
log line and, when the command's id was readable, a final ``ok: false`` result.

Who may command it: a trusted key's signature on each command (``edgekit.deploy.command_trust``),
and the broker's ACL on who may publish (``edgekit.deploy.agent_wire`` shows one).  It fetches
only from its ``--artifact-origin`` list and installs only bundles its trusted keys signed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import queue
import signal
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.core.sd_notify import Notifier
from edgekit.deploy.agent_commands import CommandHandling
from edgekit.deploy.agent_proofs import PROOF_DIR, ProofRefused, chunks, proof_items, read_proof
from edgekit.deploy.agent_wire import agent_client_id, connect_kwargs, status_payload
from edgekit.deploy.child_watch import ChildHeartbeats
from edgekit.deploy.command_trust import (
    DEFAULT_ROLLBACK_LIMIT,
    DEFAULT_ROLLBACK_WINDOW_S,
    CommandGuard,
    CommandRefused,
)
from edgekit.deploy.download import DEFAULT_MAX_BYTES, DownloadError, download, parse_origin
from edgekit.deploy.recovery import recover
from edgekit.deploy.supervisor import PipelineSupervisor, child_environment
from edgekit.protocol.control import Command
from edgekit.protocol.control_messages import MAX_LISTED
from edgekit.protocol.proof_messages import proof_list_message
from edgekit.protocol.topics import topic

if TYPE_CHECKING:
    from edgekit.deploy.install import InstallResult
    from edgekit.deploy.slots import StateRoot
    from edgekit.protocol.broker import BrokerConfig

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 1.0
SESSION_EXPIRY_S = 7 * 86400  # MQTT 5: how long the broker keeps our queue while we are away
QUEUE_SIZE = 32  # commands waiting for the worker; more are dropped
CHUNK_ACK_S = 10.0  # how long one proof chunk may wait for the broker's PUBACK before the send is given up


@dataclass
class AgentConfig:
    """What ``edgekit agent run`` was told: where the broker is, who this device is, what to run."""

    mqtt_url: str
    fleet: str
    device_id: str
    group: str | None = None
    profile: str | None = None
    source: str | None = None
    telemetry_interval_s: float = 5.0
    budget_ms: float | None = None
    max_bundle_bytes: int = DEFAULT_MAX_BYTES
    download_attempts: int = 5
    download_backoff_s: float = 1.0
    child_args: Sequence[str] = field(default_factory=tuple)
    # Where bundles may come from: scheme://host[:port] each; none: every deploy is refused.
    artifact_origins: Sequence[str] = field(default_factory=tuple)
    # The artifact port's download token (edgekit fleet serve --artifact-token-file): sent to the origins.
    artifact_token: str | None = field(default=None, repr=False)
    allow_unsigned_commands: bool = False  # a lab only: anyone who can publish on .../cmd commands it
    rollback_limit: int = DEFAULT_ROLLBACK_LIMIT
    rollback_window_s: float = DEFAULT_ROLLBACK_WINDOW_S
    queue_size: int = QUEUE_SIZE


class Agent(CommandHandling):
    """The long-running agent on one state root; ``run()`` blocks until ``stop()`` (or a signal)."""

    def __init__(self, root: StateRoot, broker: BrokerConfig, config: AgentConfig) -> None:
        self.root = root
        self.broker = broker
        self.config = config
        self.device_id, self.fleet = config.device_id, config.fleet
        self.session = uuid.uuid4().hex[:12]
        self.cmd_topic = topic(config.fleet, config.device_id, "cmd")
        self.result_topic = topic(config.fleet, config.device_id, "cmd/result")
        self.agent_topic = topic(config.fleet, config.device_id, "agent")
        # The pipeline child writes event proofs here; the agent lists and sends them.
        self.proof_root = Path(root.path) / PROOF_DIR
        self.handled = 0
        self.refused = 0
        self.dropped = 0
        self.busy: str | None = None
        self.origins = frozenset(parse_origin(o) for o in config.artifact_origins)
        self.guard = CommandGuard(
            Path(root.path),
            root.trusted_keys,
            allow_unsigned=config.allow_unsigned_commands,
            rollback_limit=config.rollback_limit,
            rollback_window_s=config.rollback_window_s,
        )
        self._queue: queue.Queue[tuple[int, int, bytes] | None] = queue.Queue(max(1, config.queue_size))
        self._queued: set[str] = set()  # digests of payloads waiting or in progress (redelivery)
        self._queued_lock = threading.Lock()
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._worker = threading.Thread(target=self._work, name="edgekit-agent-worker", daemon=True)
        # systemd's notify socket and watchdog (Type=notify, WatchdogSec=); a no-op without them.
        self.notifier = Notifier()
        watchdog_s = self.notifier.watchdog_s
        self._heartbeats = ChildHeartbeats() if watchdog_s is not None else None
        self.supervisor = PipelineSupervisor(
            self._child_argv,
            self._active_bundle,
            lambda state: self.publish_status(),
            self._child_env,
            heartbeats=self._heartbeats,
            watchdog_s=watchdog_s,
        )
        self._client = self._make_client()

    # -- MQTT ----------------------------------------------------------------------------

    def _make_client(self) -> Any:
        # Not a clean session: the broker keeps commands for us while we are away.
        client = self.broker.client(
            agent_client_id(self.config.fleet, self.config.device_id), clean_session=False, max_delay_s=10
        )
        client.manual_ack_set(True)  # a command is acknowledged once handled, not once received
        client.will_set(self.agent_topic, self._status_payload("offline"), qos=1, retain=True)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        return client

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            log.error(
                "agent: %s refused the connection: %s (check the user, password and ACL)",
                self.broker.describe(), reason,
            )  # fmt: skip
            return
        log.info(
            "agent: connected to %s as %s/%s (session %s); commands on %s",
            self.broker.describe(), self.config.fleet, self.config.device_id,
            "resumed" if flags.session_present else "new", self.cmd_topic,
        )  # fmt: skip
        client.subscribe(self.cmd_topic, qos=1)
        self._connected.set()
        self.publish_status()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if self._connected.is_set() and not self._stop.is_set():
            log.warning("agent: lost %s (%s); reconnecting", self.broker.describe(), reason)
        self._connected.clear()

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        # paho's network thread: only queue it; a slow install must not stop keep-alives.
        if msg.topic != self.cmd_topic:
            # A session the broker kept can hold a subscription this agent never made (another
            # fleet's, under an older client id): what arrives there is not for us.
            log.warning("agent: ignored a message on %s: this agent takes commands on %s only",
                        str(msg.topic)[:200], self.cmd_topic)  # fmt: skip
            if msg.qos > 0:
                client.ack(msg.mid, msg.qos)
            return
        payload = bytes(msg.payload)
        digest = hashlib.sha256(payload).hexdigest()
        with self._queued_lock:
            if digest in self._queued:  # redelivered after a reconnect while still waiting here
                return
            try:
                self._queue.put_nowait((msg.mid, msg.qos, payload))
            except queue.Full:
                self.dropped += 1
                log.warning(
                    "agent: %d commands wait already: dropped one (%d bytes; %d dropped so far)",
                    self._queue.maxsize, len(payload), self.dropped,
                )  # fmt: skip
                if msg.qos > 0:
                    client.ack(msg.mid, msg.qos)  # dropped for good: not redelivered on reconnect
                return
            self._queued.add(digest)

    def _publish(self, topic_: str, body: dict[str, Any], retain: bool = False) -> None:
        data = json.dumps(body, separators=(",", ":"), default=str).encode()
        # While disconnected paho keeps QoS 1 messages and sends them on reconnect.
        self._client.publish(topic_, data, qos=1, retain=retain)

    def _status_payload(self, state: str) -> bytes:
        c = self.config
        online = None
        if state == "online":
            online = {
                "session": self.session,
                "pipeline": self.supervisor.state if c.source else "none",
                "busy": self.busy,
                "dropped": self.dropped,
            }
        return status_payload(state, c.device_id, c.fleet, c.group, c.profile, online, self._root_status)

    def publish_status(self) -> None:
        """Publish the retained agent message (what is installed, active, running)."""
        try:
            self._client.publish(self.agent_topic, self._status_payload("online"), qos=1, retain=True)
        except Exception:  # a status is a report: never let it stop a deploy
            log.exception("agent: publishing the status failed")

    def _root_status(self) -> dict[str, Any]:
        try:
            return dict(self.root.status())
        except Exception as err:  # a damaged root must still be reported, not end the agent
            log.exception("agent: reading the state root failed")
            return {"error": str(err)}

    # -- the pipeline ----------------------------------------------------------------------

    def _active_bundle(self) -> Path | None:
        try:
            bundle = self.root.active_bundle()
        except Exception:
            log.exception("agent: cannot read the active slot")
            return None
        # The slot's own path: a later switch of ``active`` must not move the files under the child.
        return bundle.resolve() if bundle is not None else None

    def _child_argv(self, bundle: Path) -> list[str]:
        c = self.config
        assert c.source is not None
        from edgekit.core.redact import has_secret, without_password

        # No secret on a command line (ps shows it to everyone): a source with a password goes
        # in the child's environment (_child_env), the broker URL without its password.
        source = [] if has_secret(c.source) else ["--source", c.source]
        argv = [sys.executable, "-m", "edgekit.cli", "run", str(bundle), *source, "--json"]
        for key in self.root.trusted_keys():  # the slot's bundle must be signed by a key this device trusts
            argv += ["--key", str(key)]
        argv += ["--mqtt", without_password(c.mqtt_url), "--fleet", c.fleet, "--device-id", c.device_id]
        argv += ["--telemetry-interval", f"{c.telemetry_interval_s:g}"]
        # In the state root: the one place the agent's unit lets it write, kept across restarts.
        argv += ["--spool", str(Path(self.root.path) / "telemetry.db")]
        argv += ["--proof-dir", str(self.proof_root)]
        b = self.broker
        for flag, path in (
            ("--mqtt-ca", b.ca_file),
            ("--mqtt-cert", b.cert_file),
            ("--mqtt-key", b.key_file),
        ):
            if path is not None:
                argv += [flag, str(path)]
        if b.protocol != "3.1.1":
            argv += ["--mqtt-protocol", b.protocol]
        if c.profile:
            argv += ["--device", c.profile]
        if c.budget_ms is not None:
            argv += ["--budget", f"{c.budget_ms:g}"]
        return argv + list(c.child_args)

    def _child_env(self) -> dict[str, str]:
        return child_environment(self.broker.password, self.config.source)

    # -- commands ----------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            mid, qos, payload = item
            try:
                self.handle(payload)
            except Exception:  # a bug in one command's handling must not end the agent
                log.exception("agent: handling a command failed")
            finally:
                with self._queued_lock:
                    self._queued.discard(hashlib.sha256(payload).hexdigest())
                if qos > 0:
                    self._client.ack(mid, qos)

    def _proof_command(self, cmd: Command, payload: bytes) -> dict[str, Any]:
        """``list-proofs`` or ``fetch-proof``: the answer on cmd/result, then the final result."""
        try:
            self.guard.take_nonce(cmd)
        except CommandRefused as err:
            return self._refuse(cmd, payload, err)
        try:
            if cmd.action == "list-proofs":
                items, more = proof_items(self.proof_root, cmd.camera, cmd.limit or MAX_LISTED)
                self._publish(
                    self.result_topic, proof_list_message(self.config.device_id, cmd.id, items, more)
                )
                return self._final(
                    cmd.id, cmd.action, "done", ok=True, info={"proofs": len(items), "more": more}
                )
            assert cmd.event is not None and cmd.file is not None
            data = read_proof(self.proof_root, cmd.event, cmd.file)
            sent = 0
            for body in chunks(self.config.device_id, cmd.id, cmd.event, cmd.file, data):
                if not self._publish_acked(body):
                    raise ProofRefused(
                        "refused",
                        f"the broker did not take chunk {sent} of the {cmd.file} in {CHUNK_ACK_S:g} s",
                        "ask again",
                    )
                sent += 1
            log.info(
                "agent: sent the %s of event %s (%d bytes, %d chunks)", cmd.file, cmd.event, len(data), sent
            )
            info = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "chunks": sent}
            return self._final(cmd.id, cmd.action, "done", ok=True, info=info)
        except ProofRefused as err:
            log.info("agent: %s %s: %s", cmd.action, cmd.id, err.message)
            return self._final(cmd.id, cmd.action, err.step, ok=False, reason=err.message, hint=err.hint)
        except Exception as err:  # a bug: still answer, so the dashboard does not wait for nothing
            log.exception("agent: %s %s failed", cmd.action, cmd.id)
            return self._final(
                cmd.id, cmd.action, "agent", ok=False, reason=f"the agent failed: {err}", hint="see its log"
            )
        finally:
            self.guard.settle(cmd)

    def _publish_acked(self, body: dict[str, Any]) -> bool:
        """Publish ``body`` on cmd/result and wait for the broker to take it: one chunk in memory at a time."""
        data = json.dumps(body, separators=(",", ":")).encode()
        info = self._client.publish(self.result_topic, data, qos=1)
        with contextlib.suppress(RuntimeError, ValueError):
            info.wait_for_publish(CHUNK_ACK_S)
        return bool(info.is_published())

    def _run_command(self, cmd: Command) -> dict[str, Any]:
        self._progress(cmd, "received", {})
        if cmd.action == "rollback":
            from edgekit.deploy.install import rollback

            result = rollback(self.root, cmd.id, lambda step, info: self._progress(cmd, step, dict(info)))
        else:
            outcome = self._deploy(cmd)
            if isinstance(outcome, dict):  # the download failed: already answered
                return outcome
            result = outcome
        if result.ok and not result.replayed and self.config.source:
            self.supervisor.restart()  # the switch happened: run what is active now
        if result.ok:
            log.info("agent: %s %s done (version %s)", cmd.action, cmd.id, result.version)
        else:
            log.warning("agent: %s %s failed at %s: %s", cmd.action, cmd.id, result.step, result.reason)
        return self._final(
            cmd.id,
            cmd.action,
            result.step,
            ok=result.ok,
            reason=result.reason or "",
            hint=result.hint or "",
            health=dict(result.health or {}),
            version=result.version,
            replayed=bool(result.replayed),
        )

    def _deploy(self, cmd: Command) -> InstallResult | dict[str, Any]:
        from edgekit.deploy.install import install

        assert cmd.url is not None and cmd.sha256 is not None and cmd.size is not None
        last = [0.0]

        def fetched(have: int, size: int) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY_S or have == size:
                last[0] = now
                self._progress(cmd, "download", {"bytes": have, "size": size})

        try:
            archive = download(
                cmd.url,
                self._incoming(),
                sha256=cmd.sha256,
                size=cmd.size,
                origins=self.origins,
                max_bytes=self.config.max_bundle_bytes,
                attempts=self.config.download_attempts,
                backoff_s=self.config.download_backoff_s,
                progress=fetched,
                token=self.config.artifact_token,
            )
        except DownloadError as err:
            log.warning("agent: deploy %s: %s (%s)", cmd.id, err.message, err.detail)
            return self._final(cmd.id, cmd.action, "download", ok=False, reason=err.message, hint=err.hint)
        try:
            return install(
                self.root,
                archive,
                cmd.id,
                profile=self.config.profile,
                progress=lambda step, info: self._progress(cmd, step, dict(info)),
                budget_ms=self.config.budget_ms,  # gate at the budget the pipeline will be held to
            )
        finally:
            archive.unlink(missing_ok=True)  # installed or refused: the slot holds what is kept

    def _incoming(self) -> Path:
        return Path(self.root.incoming)

    def _recorded(self, deploy_id: str) -> dict[str, Any] | None:
        """The recorded outcome of ``deploy_id`` (deploys/<id>.json), if it was handled before."""
        # A damaged record reads as None: install() then decides again, under its lock.
        return self.root.deploy_record(deploy_id)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Agent:
        """Recover the root, start the pipeline, connect (in the background) and take commands."""
        recover(self.root)
        self.guard.warn(self.cmd_topic, bool(self.origins))
        if self.config.source:
            self.supervisor.start()
        b = self.broker
        kwargs = connect_kwargs(b.protocol, SESSION_EXPIRY_S)
        self._client.connect_async(b.host, b.port, keepalive=b.keepalive_s, **kwargs)
        self._client.loop_start()
        self._worker.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the command in progress (up to ``timeout_s``), stop the pipeline, say offline, disconnect."""
        self._stop.set()
        self._queue.put(None)
        self._worker.join(timeout_s)
        if self._worker.is_alive():
            log.warning("agent: a command is still running; leaving it (the install is crash-safe)")
        self.supervisor.stop()
        if self._heartbeats is not None:
            self._heartbeats.close()
        if self._connected.is_set():
            info = self._client.publish(self.agent_topic, self._status_payload("offline"), qos=1, retain=True)
            with contextlib.suppress(RuntimeError, ValueError):
                info.wait_for_publish(2.0)
        self._client.disconnect()
        self._client.loop_stop()

    def run(self) -> int:
        """Start, then wait for SIGTERM or SIGINT; returns the exit code."""
        done = threading.Event()

        def on_signal(signum: int, frame: Any) -> None:
            log.info("agent: %s: stopping", signal.Signals(signum).name)
            done.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start()
        self.notifier.ready(f"agent {self.config.device_id}: pipeline {self.supervisor.state}")
        every = min(1.0, self.notifier.pet_every_s or 1.0)
        while not done.wait(every):
            self._pet()
        self.notifier.stopping()
        self.stop()
        return 0

    def _pet(self) -> None:
        # From the main thread, while the threads that keep the device going run: a wedged child
        # is the supervisor's to kill and start again, so the agent is restarted only when it is stuck.
        if self.supervisor.alive and self._worker.is_alive():
            self.notifier.watchdog(
                f"pipeline {self.supervisor.state}, {self.supervisor.starts} starts, "
                f"{self.supervisor.wedged} wedged"
            )


def run_agent(root_path: Path, config: AgentConfig, broker: BrokerConfig) -> int:
    """Run the agent on ``root_path`` until a signal; the ``edgekit agent run`` entry point."""
    from edgekit.deploy.slots import StateRoot

    root = StateRoot(root_path)
    return Agent(root, broker, config).run()
