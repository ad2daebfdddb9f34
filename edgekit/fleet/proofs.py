"""``ProofFetcher``: the fleet server asks a device's agent for event proof when the dashboard shows it.

Proof (an event's JPEG snapshot and Motion JPEG AVI clip) stays on the device, and nothing
pushes it: the fleet asks the device's agent on ``cmd`` with a command signed like a deploy
(``--sign-key``), and reads the answer on ``cmd/result`` (``edgekit.protocol.proof_messages``):

- ``list-proofs``, in the background while a device's page is open (at most every
  ``LIST_FRESH_S``): which of its events have a snapshot or a clip, to mark them on the page;
- ``fetch-proof``, when the page shows a snapshot or someone opens a clip: the file in chunks.

Every answer is checked before anything is shown: it answers the id asked, on the device's
own topic; each chunk agrees with the first (size, count, SHA-256) and is as long as its
place says; the whole is ``size`` bytes, has that SHA-256 and starts as a JPEG or an AVI does.

Nothing here waits without an end: a device whose agent says it is offline (its retained
``agent`` message, its Last Will) is answered at once; any other ask waits at most
``WAIT_S`` for its file's kind; at most ``MAX_WAITING`` asks are out at once; and a proof a
device did not have, or a device that did not answer, is not asked again for a while
(``MISSING_S``, ``UNREACHABLE_S``).  What arrived is kept in memory, the least recently
shown going first past ``cache_bytes``: a proof never changes, so a page redrawn every two
seconds asks the device once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgekit.errors import TelemetryError
from edgekit.protocol.broker import BrokerConfig
from edgekit.protocol.control import (
    fetch_proof_message,
    list_proofs_message,
    parse_agent_status,
    parse_answer,
    with_signature,
)
from edgekit.protocol.control_messages import Command, ProofFile, Result
from edgekit.protocol.proof_messages import (
    CHUNK_BYTES,
    MAX_PROOF_BYTES,
    ProofChunk,
    ProofList,
    chunk_count,
    has_magic,
)
from edgekit.protocol.topics import TOPIC_ROOT, topic

log = logging.getLogger(__name__)

MiB = 1 << 20
#: How long one ask waits for its answer: a list, a snapshot, a clip (up to 32 MiB over a device's uplink).
WAIT_S: dict[str, float] = {"list": 10.0, "snapshot": 15.0, "clip": 60.0}
LIST_FRESH_S = 15.0  # a device's proof list is asked for again after this long, while its page is open
MISSING_S = 60.0  # a proof a device said it does not have is not asked for again for this long
UNREACHABLE_S = 10.0  # nor one of a device that did not answer, or answered wrong
CACHE_BYTES = 64 * MiB
MAX_WAITING = 16
MAX_REMEMBERED = 10_000  # agents' states, devices' lists, refusals: each map at most this many
COMMAND_TTL_S = 60.0  # an ask that waits longer is answered 504 anyway: the agent may drop it then
# The agent's answer's step -> the HTTP status the dashboard gets.
_STATUS = {"not-found": 404, "too-large": 413}

Key = tuple[str, str, str, str]  # fleet, device, event, file


class ProofUnavailable(Exception):
    """No proof to show; ``status`` is the HTTP status to answer with, ``message`` says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class _Ask:
    """One command out to an agent, and what came back for it."""

    fleet: str
    device: str
    id: str
    event: str | None  # None: a list
    file: str  # "list", "snapshot" or "clip"
    done: threading.Event = field(default_factory=threading.Event)
    parts: dict[int, bytes] = field(default_factory=dict)
    meta: tuple[int, int, str] | None = None  # count, size, sha256 of the first chunk
    listing: ProofList | None = None
    data: bytes | None = None
    error: ProofUnavailable | None = None

    @property
    def name(self) -> str:
        what = "proof list" if self.event is None else f"{self.file} of event {self.event}"
        return f"{self.fleet}/{self.device}'s {what}"

    def fail(self, status: int, message: str) -> None:
        if not self.done.is_set():
            self.error = ProofUnavailable(status, message)
            self.done.set()


@dataclass
class _Listing:
    at: float
    proofs: dict[str, dict[str, int | None]]


class ProofFetcher:
    """Asks agents for event proof over MQTT (its own client); ``fetch`` and ``proofs_of`` are thread-safe."""

    def __init__(
        self,
        broker: BrokerConfig,
        sign: Callable[[bytes], bytes] | None = None,
        *,
        client_id: str = "edgekit-fleet-proofs",
        cache_bytes: int = CACHE_BYTES,
        waits: dict[str, float] | None = None,
        max_waiting: int = MAX_WAITING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.broker = broker
        self.sign = sign
        self.cache_bytes = cache_bytes
        self.waits = {**WAIT_S, **(waits or {})}
        self.max_waiting = max_waiting
        self.clock = clock
        self.connected = threading.Event()
        self.stats: dict[str, int] = {
            "asked": 0,
            "fetched": 0,
            "cached": 0,
            "refused": 0,
            "timeouts": 0,
            "bad": 0,
        }
        self._lock = threading.Lock()
        self._asks: dict[str, _Ask] = {}  # by command id
        self._inflight: dict[Key, _Ask] = {}  # one ask per proof file, whoever waits for it
        self._cache: OrderedDict[Key, bytes] = OrderedDict()
        self._cached = 0
        self._refusals: dict[Key, tuple[float, ProofUnavailable]] = {}
        self._agents: dict[tuple[str, str], str] = {}  # the retained agent messages' state
        self._lists: OrderedDict[tuple[str, str], _Listing] = OrderedDict()
        self._listing: set[tuple[str, str]] = set()  # lists being asked for
        # A clean session: an ask outlives no restart, so nothing is to be kept for us.
        self._client = broker.client(f"{client_id}-{os.urandom(3).hex()}", clean_session=True)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = lambda *a: self.connected.clear()
        self._client.on_message = self._on_message

    # -- life ---------------------------------------------------------------------------------

    def start(self, wait_s: float = 10.0) -> ProofFetcher:
        """Connect and subscribe to the agents' answers and states; ``TelemetryError`` if not within ``wait_s``."""
        b = self.broker
        try:
            self._client.connect_async(b.host, b.port, keepalive=b.keepalive_s)
        except (OSError, ValueError) as err:
            raise TelemetryError(
                f"cannot reach the MQTT broker {b.describe()}: {err}", "check --mqtt"
            ) from err
        self._client.loop_start()
        if not self.connected.wait(wait_s):
            self.stop()
            raise TelemetryError(
                f"{b.describe()} did not take the proof fetcher's subscription within {wait_s:g} s",
                f"check the broker's ACL: read {TOPIC_ROOT}/<fleet>/+/cmd/result and .../+/agent, "
                f"write {TOPIC_ROOT}/<fleet>/+/cmd",
            )
        return self

    def stop(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()
        with self._lock:
            for ask in list(self._asks.values()):
                ask.fail(503, "the fleet server is stopping")

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            log.error("fleet: %s refused the proof fetcher: %s", self.broker.describe(), reason)
            return
        client.subscribe([(f"{TOPIC_ROOT}/+/+/cmd/result", 1), (f"{TOPIC_ROOT}/+/+/agent", 1)])
        self.connected.set()

    # -- what the dashboard calls -------------------------------------------------------------

    def fetch(self, fleet: str, device: str, event: str, file: ProofFile) -> bytes:
        """The bytes of ``file`` of ``event``'s proof on ``fleet``/``device``; ``ProofUnavailable`` if none."""
        key: Key = (fleet, device, event, file)
        with self._lock:
            data = self._cache.get(key)
            if data is not None:
                self._cache.move_to_end(key)
                self.stats["cached"] += 1
                return data
            self._check_refused(key)
            ask = self._inflight.get(key)
            fresh = ask is None
            if ask is None:
                ask = self._inflight[key] = self._new_ask(fleet, device, event, file)
        if fresh:
            self._send(ask, fetch_proof_message(ask.id, device, event, file, COMMAND_TTL_S, fleet=fleet))
        self._wait(ask)
        with self._lock:
            self._inflight.pop(key, None)
            if ask.error is not None:
                wait = MISSING_S if ask.error.status == 404 else UNREACHABLE_S
                self._remember(self._refusals, key, (self.clock() + wait, ask.error))
                raise ask.error
            assert ask.data is not None
            if key not in self._cache:
                self._keep(key, ask.data)
            return ask.data

    def proofs_of(self, fleet: str, device: str) -> dict[str, dict[str, int | None]] | None:
        """Which events of ``fleet``/``device`` have proof (event id -> {snapshot, clip: size or None}), as last heard.

        Never waits: a list older than ``LIST_FRESH_S`` (or none) is asked for in the background,
        unless the device's agent is offline.  None until a first list has come.
        """
        key = (fleet, device)
        with self._lock:
            listing = self._lists.get(key)
            stale = listing is None or self.clock() - listing.at > LIST_FRESH_S
            ask_now = (
                stale
                and key not in self._listing
                and self._agents.get(key) != "offline"
                and len(self._asks) < self.max_waiting
            )
            if ask_now:
                self._listing.add(key)
        if ask_now:
            threading.Thread(
                target=self._refresh, args=key, name="edgekit-fleet-proof-list", daemon=True
            ).start()
        return listing.proofs if listing is not None else None

    def annotate(self, fleet: str, device: str, events: list[dict[str, Any]]) -> None:
        """Add ``proof: {snapshot, clip}`` (sizes) to each of ``events`` the device has proof of."""
        proofs = self.proofs_of(fleet, device) if events else None
        for e in events if proofs else ():
            found = proofs.get(str(e.get("id"))) if proofs else None
            if found is not None:
                e["proof"] = found

    # -- asking -------------------------------------------------------------------------------

    def _check_refused(self, key: Key) -> None:
        refused = self._refusals.get(key)
        if refused is not None:
            until, error = refused
            if self.clock() < until:
                raise error
            del self._refusals[key]

    def _new_ask(self, fleet: str, device: str, event: str | None, file: str) -> _Ask:
        """Under the lock: a new ask, or ``ProofUnavailable`` when the agent is offline or too many wait."""
        if self._agents.get((fleet, device)) == "offline":
            raise ProofUnavailable(
                504, f"{fleet}/{device}'s agent is offline: its proof stays on the device until it is back"
            )
        if not self.connected.is_set():
            raise ProofUnavailable(503, f"the fleet server is not connected to {self.broker.describe()}")
        if len(self._asks) >= self.max_waiting:
            raise ProofUnavailable(
                503, f"{self.max_waiting} proof requests wait for devices already: try again"
            )
        ask = _Ask(fleet, device, f"proof-{os.urandom(8).hex()}", event, file)
        self._asks[ask.id] = ask
        self.stats["asked"] += 1
        return ask

    def _send(self, ask: _Ask, cmd: Command) -> None:
        if self.sign is not None:
            cmd = with_signature(cmd, self.sign)
        self._client.publish(topic(ask.fleet, ask.device, "cmd"), cmd.to_json(), qos=1)

    def _wait(self, ask: _Ask) -> None:
        """Wait for ``ask``'s answer, at most its kind's time; ``ask.error`` says what went wrong."""
        wait = self.waits[ask.file]
        if not ask.done.wait(wait):
            self.stats["timeouts"] += 1
            ask.fail(
                504,
                f"no answer within {wait:g} s for {ask.name}: the agent is offline, busy with a deploy, "
                "or older than proof commands",
            )
        with self._lock:
            self._asks.pop(ask.id, None)

    def _refresh(self, fleet: str, device: str) -> None:
        key = (fleet, device)
        try:
            with self._lock:
                ask = self._new_ask(fleet, device, None, "list")
            self._send(ask, list_proofs_message(ask.id, device, COMMAND_TTL_S, fleet=fleet))
            self._wait(ask)
            with self._lock:
                old = self._lists.get(key)
                proofs = old.proofs if old is not None else {}
                if ask.listing is not None:
                    proofs = {p.event: {"snapshot": p.snapshot, "clip": p.clip} for p in ask.listing.proofs}
                elif ask.error is not None:
                    log.info("fleet: %s", ask.error.message)
                self._lists.pop(key, None)
                self._remember(self._lists, key, _Listing(self.clock(), proofs))
        except ProofUnavailable as err:
            log.info("fleet: no proof list of %s/%s: %s", fleet, device, err.message)
        finally:
            with self._lock:
                self._listing.discard(key)

    # -- the answers (paho's thread) ----------------------------------------------------------

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        try:
            self._take(str(msg.topic), bytes(msg.payload))
        except Exception:  # one odd message must not stop the others
            log.exception("fleet: reading a message on %s failed", str(msg.topic)[:200])

    def _take(self, where: str, payload: bytes) -> None:
        parts = where.split("/")
        if len(parts) == 5 and parts[4] == "agent":
            status = parse_agent_status(payload) if payload else None
            with self._lock:
                self._remember(self._agents, (parts[2], parts[3]), status["state"] if status else "offline")
            return
        if len(parts) != 6 or parts[4:] != ["cmd", "result"] or not self._asks:
            return
        answer = parse_answer(payload)
        if answer is None or answer.id is None:
            return
        with self._lock:
            ask = self._asks.get(answer.id)
        # The id is random, and the answer must come from the device asked, on its own topic.
        if ask is None or (parts[2], parts[3]) != (ask.fleet, ask.device) or answer.device != ask.device:
            return
        if isinstance(answer, ProofList):
            if ask.event is None:
                ask.listing = answer
                ask.done.set()
        elif isinstance(answer, ProofChunk):
            self._chunk(ask, answer)
        elif isinstance(answer, Result) and answer.final:
            self._final(ask, answer)

    def _bad(self, ask: _Ask, why: str) -> None:
        self.stats["bad"] += 1
        log.warning("fleet: %s: %s", ask.name, why)
        ask.fail(502, f"{ask.name} came back damaged: {why}")

    def _chunk(self, ask: _Ask, chunk: ProofChunk) -> None:
        if ask.event is None or (chunk.event, chunk.file) != (ask.event, ask.file) or ask.done.is_set():
            return
        cap = MAX_PROOF_BYTES[ask.file]
        if chunk.size > cap:
            self._bad(ask, f"{chunk.size} bytes, over the {cap} a {ask.file} may be")
            return
        meta = (chunk.count, chunk.size, chunk.sha256)
        if chunk.count != chunk_count(chunk.size) or chunk.index >= chunk.count:
            self._bad(ask, f"chunk {chunk.index} of {chunk.count} for {chunk.size} bytes")
            return
        if ask.meta is not None and meta != ask.meta:
            self._bad(ask, f"chunk {chunk.index} disagrees with the first on size, count or SHA-256")
            return
        ask.meta = meta
        if chunk.index in ask.parts:  # redelivered: QoS 1 is at least once
            return
        try:
            raw = base64.b64decode(chunk.data, validate=True)
        except (binascii.Error, ValueError):
            self._bad(ask, f"chunk {chunk.index} is not base64")
            return
        last = chunk.size - CHUNK_BYTES * (chunk.count - 1)
        if len(raw) != (last if chunk.index == chunk.count - 1 else CHUNK_BYTES):
            self._bad(ask, f"chunk {chunk.index} has {len(raw)} bytes")
            return
        ask.parts[chunk.index] = raw

    def _final(self, ask: _Ask, result: Result) -> None:
        if ask.done.is_set():
            return
        if not result.ok:
            self.stats["refused"] += 1
            status = _STATUS.get(result.step, 502)
            said = f"{result.reason} ({result.hint})" if result.hint else result.reason
            ask.fail(status, f"{ask.fleet}/{ask.device}'s agent: {said or 'refused'}")
            return
        if ask.event is None:
            ask.fail(502, f"{ask.fleet}/{ask.device}'s agent answered without a list")
            return
        if ask.meta is None:
            self._bad(ask, "no chunk arrived")
            return
        count, size, sha256 = ask.meta
        if len(ask.parts) != count:
            self._bad(ask, f"{len(ask.parts)} of {count} chunks arrived")
            return
        data = b"".join(ask.parts[i] for i in range(count))
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
            self._bad(ask, "its SHA-256 is not the one it was sent with")
            return
        if not has_magic(ask.file, data):
            self._bad(ask, "it is not a JPEG" if ask.file == "snapshot" else "it is not an AVI")
            return
        ask.parts.clear()
        ask.data = data
        self.stats["fetched"] += 1
        ask.done.set()

    # -- memory -------------------------------------------------------------------------------

    def _keep(self, key: Key, data: bytes) -> None:
        """Under the lock: cache ``data``, dropping the least recently shown past ``cache_bytes``."""
        if len(data) > self.cache_bytes:
            return
        self._cache[key] = data
        self._cached += len(data)
        while self._cached > self.cache_bytes:
            _, old = self._cache.popitem(last=False)
            self._cached -= len(old)

    @staticmethod
    def _remember(into: dict[Any, Any], key: Any, value: Any) -> None:
        """``into[key] = value``, dropping the oldest entry when ``into`` holds ``MAX_REMEMBERED``."""
        if key not in into and len(into) >= MAX_REMEMBERED:
            into.pop(next(iter(into)))
        into[key] = value
