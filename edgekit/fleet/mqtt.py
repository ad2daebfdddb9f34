"""``FleetSubscriber``: the collector's MQTT side — subscribe to the fleet's topics, feed ``Collector.handle``.

A collector only subscribes, so it speaks just that part of MQTT 3.1.1 itself: CONNECT
(persistent session, so the broker queues while the collector restarts; de-duplication
makes redelivery harmless), SUBSCRIBE with QoS 1, PUBLISH in, PUBACK out, PINGREQ.  Why
not paho: paho parses every packet with several ``recv()`` calls, a ``select()``, a wake-up
socket write and a ``send()`` per PUBACK — measured here as much CPU per message as the
collector itself (0.26 ms/msg end to end with paho, 0.15 with this; benchmarks/fleet_ingest.py).
This reads up to 256 KiB per ``recv()`` and handles every complete packet in it; once it holds
``COMMIT_MAX`` messages or the first is ``commit_delay_s`` old it calls ``commit()`` (the collector
writes what it buffered, in one transaction), and only then acknowledges them all with one
``sendall()``: a crash before the commit means redelivery, never loss (and a redelivered
message the store already has is dropped by its insert).  When the store cannot take a read
(``commit`` raises, or ``handle`` raises one of ``retry_on``) nothing of it is acknowledged: the
connection is dropped and made again, and the broker delivers the messages again.  TLS, user/password, keep-alive and reconnect with back-off are supported.

Nothing a client publishes can stop it (any device may publish on its own topics, retained):

- a PUBLISH over ``max_packet`` is drained — read and thrown away chunk by chunk, never
  buffered — then acknowledged (so the broker does not deliver it again on every reconnect)
  and reported to ``reject(topic, "too-large", detail)``;
- a malformed packet (a PUBLISH too short for its topic, a length over four bytes) ends the
  connection, which is counted (``malformed``) and made again;
- the reading thread is its own supervisor: whatever escapes a connection (a bug included)
  is logged and counted (``restarts``), and it connects again with back-off.  It ends only on
  ``stop()``.
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable

from edgekit.core.backoff import Backoff
from edgekit.errors import EdgekitError, TelemetryError
from edgekit.protocol.broker import BrokerConfig
from edgekit.protocol.topics import EVERYTHING

log = logging.getLogger(__name__)

TOPICS = (EVERYTHING, "spBv1.0/#")
# A member of a shared-subscription group (``shared_topics``) takes its share of the data: each
# message goes to one member of the group.  Windows and events carry their own (epoch, seq) or id,
# so the store keeps each once whichever member writes it.
SHARED_TOPICS = (
    "edgekit/v1/+/+/telemetry",
    "edgekit/v1/+/+/events",
    "edgekit/v1/+/+/labels",
    "spBv1.0/+/DDATA/+/+",
)
# ...and every member gets every state message: a Sparkplug DDATA needs its node's NBIRTH (the
# session that numbers it) on whichever member it lands, and a device's online/offline must be
# applied in the order it was sent, which one subscription keeps and a group of them would not.
STATE_TOPICS = (
    "edgekit/v1/+/+/status",
    "spBv1.0/+/NBIRTH/+",
    "spBv1.0/+/NDEATH/+",
    "spBv1.0/+/DBIRTH/+/+",
    "spBv1.0/+/DDEATH/+/+",
)
GROUP_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = (
    1, 2, 3, 4, 8, 9, 10, 11, 12, 13, 14,
)  # fmt: skip
# How long ``stop(leave=True)`` waits for the broker to confirm the unsubscription and send what
# it had queued; the link is drained once nothing has come for QUIET_S.
LEAVE_S, QUIET_S = 10.0, 0.5
# A PUBLISH bigger than this is drained unread (the collector refuses payloads over 256 KiB anyway;
# topics are at most 64 KiB).  MQTT itself caps a packet at 256 MiB (a four-byte length).
MAX_PACKET = 1024 * 1024
READ_SIZE = 256 * 1024
# The reader holds its PUBACKs, and so the commit, until this many messages or this many seconds
# have gone by since the first: at a fleet's steady trickle (10,000 devices, a window every 10 s,
# shared by two collectors) a read holds one message, and a transaction per message cost 0.69
# CPU s per 1,000 messages in the collectors and 0.60 in PostgreSQL (benchmarks/fleet_scale.py).
# COMMIT_MAX stays under Mosquitto's default max_inflight_messages (20): the broker sends no more
# than that unacknowledged, and a full hand would otherwise wait out the delay.
COMMIT_MAX = 16
COMMIT_DELAY_S = 0.05
# Back-off between connection attempts, and after the reader caught something unexpected.
RETRY_S, RETRY_MAX_S = 1.0, 5.0
CONNACK_REASONS = {
    1: "it does not speak MQTT 3.1.1",
    2: "it rejected the client id",
    3: "the server is unavailable",
    4: "the user name or password is wrong",
    5: "not authorized (a wrong user or password, or a user the broker does not allow)",
}


def shared_topics(group: str) -> tuple[str, ...]:
    """The topic filters of a collector in shared-subscription group ``group`` (``$share/<group>/...``).

    The broker hands each data message to one member of the group; a shared subscription's
    PUBLISH carries the message's own topic, so ``handle`` sees the same topics as without.
    """
    # MQTT forbids only '/', '+' and '#' (and an empty name); the rest is kept to what every broker
    # and every log shows plainly.
    if not GROUP_NAME.fullmatch(group):
        raise EdgekitError(
            f"--share {group!r} is not a group name",
            "up to 64 letters, digits, '.', '_' or '-' (no '/', '+', '#'), the same for every collector "
            "of the group: e.g. --share collectors",
        )
    return (*(f"$share/{group}/{t}" for t in SHARED_TOPICS), *STATE_TOPICS)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _str(s: str) -> bytes:
    b = s.encode()
    return len(b).to_bytes(2, "big") + b


def _packet(kind: int, flags: int, body: bytes) -> bytes:
    return bytes([kind << 4 | flags]) + _varint(len(body)) + body


class Refused(ConnectionError):
    """The broker answered, and said no (credentials, ACL): retrying the same will not help."""


class Unacknowledged(ConnectionError):
    """What this read brought could not be stored now: the connection ends unacknowledged, so the
    broker keeps the messages and delivers them again once it is made again."""


class Malformed(ConnectionError):
    """A packet that breaks MQTT 3.1.1: the stream cannot be trusted past it, so the connection ends."""


def _no_commit() -> None:
    pass


def _no_reject(topic: str, reason: str, detail: str) -> None:
    log.warning("fleet: dropped a message on %r (%s: %s)", topic[:200], reason, detail)


class FleetSubscriber:
    """Subscribes to ``topics`` with QoS 1 and calls ``handle(topic, payload)`` for each message, in order.

    ``commit()`` is called after each read's messages were handled and before they are
    acknowledged: whatever ``handle`` buffered must be stored when it returns (``Collector.flush``).
    An exception of ``retry_on`` from ``handle`` (the store cannot take writes now), or any from
    ``commit``, acknowledges nothing of the read: the connection is made again after a back-off and
    the broker delivers the messages again.  Any other exception from ``handle`` is that message's
    alone: it is logged, counted and acknowledged (delivering it again would fail again).
    """

    def __init__(
        self,
        broker: BrokerConfig,
        handle: Callable[[str, bytes], object],
        client_id: str = "edgekit-fleet-collector",
        topics: tuple[str, ...] = TOPICS,
        reject: Callable[[str, str, str], object] = _no_reject,
        max_packet: int = MAX_PACKET,
        commit: Callable[[], object] = _no_commit,
        retry_on: tuple[type[Exception], ...] = (),
        commit_delay_s: float = COMMIT_DELAY_S,
    ) -> None:
        self.broker = broker
        self.handle = handle
        self.commit = commit
        # Nothing to commit: nothing to wait for, each read is acknowledged at once.
        self.commit_delay_s = commit_delay_s if commit is not _no_commit else 0.0
        self.retry_on = retry_on
        self.reject = reject  # (topic, reason, detail) of a message dropped before ``handle``
        self.client_id = client_id
        self.topics = topics
        self.max_packet = max_packet
        self.connected = threading.Event()
        self.last_error = ""
        self.messages = 0
        self.handler_errors = 0
        self.connects = 0
        self.too_large = 0  # PUBLISHes drained unread
        self.malformed = 0  # connections ended by a malformed packet
        self.restarts = 0  # times the reader caught something unexpected and started over
        self.unacknowledged = 0  # reads the store could not take: not acknowledged, so redelivered
        self._skip = 0  # bytes of an oversized PUBLISH still to drain
        self._skip_ack = b""  # its PUBACK, sent once it is drained (acks go in order)
        self._stop = threading.Event()
        self._left = threading.Event()  # the broker confirmed ``stop(leave=True)``'s unsubscription
        self._unsubacked = False  # an UNSUBACK in the read being handled (``_left`` once it is acked)
        self._idle_since: float | None = None  # when the last read was handled and acknowledged
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._tls = self._tls_context() if broker.tls else None
        self._thread = threading.Thread(target=self._run, name="edgekit-fleet-subscriber", daemon=True)

    def _tls_context(self) -> ssl.SSLContext:
        b = self.broker
        try:
            context = ssl.create_default_context(cafile=str(b.ca_file) if b.ca_file else None)
            if b.cert_file:
                context.load_cert_chain(str(b.cert_file), str(b.key_file) if b.key_file else None)
        except (OSError, ssl.SSLError) as err:
            raise TelemetryError(
                f"TLS setup for {b.describe()} failed: {err}", "check the CA/cert/key files"
            ) from err
        return context

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, wait_s: float = 10.0) -> FleetSubscriber:
        """Connect, subscribe and start reading; raises ``TelemetryError`` if that fails within ``wait_s``."""
        b = self.broker
        try:
            self._sock = self._connect()
        except Refused as err:
            raise TelemetryError(
                f"{b.describe()} refused the collector: {err}",
                "check the user and password (EDGEKIT_MQTT_PASSWORD) and that the ACL lets it read edgekit/v1/#",
            ) from err
        except ssl.SSLError as err:
            raise TelemetryError(
                f"TLS with {b.describe()} failed: {err}",
                "pass the CA that signed the broker's certificate with --mqtt-ca, and use the name it was issued for",
            ) from err
        except (OSError, ConnectionError) as err:
            raise TelemetryError(
                f"cannot reach the MQTT broker {b.describe()}: {err}",
                "start the broker (e.g. `mosquitto -p 1883`) or pass --mqtt mqtt://host:port",
            ) from err
        self._thread.start()
        if not self.connected.wait(wait_s):
            self.stop()
            raise TelemetryError(
                f"{b.describe()} did not confirm the subscription within {wait_s:g} s: {self.last_error or 'no answer'}",
                "check the broker's ACL for edgekit/v1/# and spBv1.0/#"
                + (
                    ", and that it takes shared subscriptions ($share/, Mosquitto 1.6 or later)"
                    if any(t.startswith("$share/") for t in self.topics)
                    else ""
                ),
            )
        return self

    def stop(self, leave: bool = False) -> None:
        """Disconnect cleanly and end the reading thread.

        ``leave``: unsubscribe first (a shared group's member that stops), reading on until the
        broker confirms: what it sent before that is handled, committed and acknowledged, and it
        sends nothing more for this client id, so no message waits in this session for a member
        that may never return; the other members take its share.  Without ``leave`` the
        persistent session stays, and the broker queues for this client id until it is back.
        """
        sock = self._sock
        if leave and sock is not None and self.connected.is_set() and self._thread.is_alive():
            self._left.clear()
            self._unsubacked = False
            try:
                filters = b"".join(_str(t) for t in self.topics)
                self._send(sock, _packet(UNSUBSCRIBE, 2, b"\x00\x02" + filters))
            except OSError:
                pass
            else:
                self._drain(time.monotonic() + LEAVE_S)
        self._stop.set()
        sock = self._sock
        if sock is not None:
            try:
                self._send(sock, _packet(DISCONNECT, 0, b""))
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread.is_alive():
            self._thread.join(5)

    def _drain(self, deadline: float) -> None:
        """Until ``deadline``: wait for the UNSUBACK, then for the broker to stop sending what it had queued."""
        if not self._left.wait(max(0.0, deadline - time.monotonic())):
            log.warning("fleet: %s did not confirm the unsubscription", self.broker.describe())
            return
        # Messages queued for this session before it left still come; each read is acknowledged
        # (after its commit) before ``_idle_since`` moves, so a quiet link has nothing unacknowledged.
        while time.monotonic() < deadline:
            idle = self._idle_since
            if idle is not None and time.monotonic() - idle >= QUIET_S:
                return
            time.sleep(0.05)
        log.warning("fleet: still receiving from %s when it had to stop", self.broker.describe())

    # -- the connection ----------------------------------------------------------------------

    def _send(self, sock: socket.socket, data: bytes) -> None:
        with self._send_lock:  # acks (reader thread) and DISCONNECT (stop) must not interleave
            sock.sendall(data)

    def _connect(self) -> socket.socket:
        b = self.broker
        sock = socket.create_connection((b.host, b.port), timeout=10)
        try:
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=b.host)
            flags = 0x00  # clean session 0: the broker keeps the subscription and queues for us
            payload = _str(self.client_id)
            if b.username:
                flags |= 0x80
                payload += _str(b.username)
                if b.password is not None:
                    flags |= 0x40
                    payload += _str(b.password)
            var = _str("MQTT") + bytes([4, flags]) + b.keepalive_s.to_bytes(2, "big")
            sock.sendall(_packet(CONNECT, 0, var + payload))
            ack = self._read_exact(sock, 4)
            if ack[0] >> 4 != CONNACK:
                raise ConnectionError(f"expected CONNACK, got packet type {ack[0] >> 4}")
            if ack[3] != 0:
                raise Refused(CONNACK_REASONS.get(ack[3], f"CONNACK code {ack[3]}"))
            subs = b"".join(_str(t) + b"\x01" for t in self.topics)
            sock.sendall(_packet(SUBSCRIBE, 2, b"\x00\x01" + subs))
        except BaseException:
            sock.close()
            raise
        self.connects += 1
        log.info("fleet: connected to %s, subscribing to %s", b.describe(), ", ".join(self.topics))
        return sock

    @staticmethod
    def _read_exact(sock: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            data += chunk
        return data

    def stats(self) -> dict[str, int]:
        """The link's counters: messages read, connects, drained (too large), malformed, reader restarts."""
        return {
            "messages": self.messages,
            "connects": self.connects,
            "too_large": self.too_large,
            "malformed": self.malformed,
            "restarts": self.restarts,
            "handler_errors": self.handler_errors,
            "unacknowledged": self.unacknowledged,
        }

    def _run(self) -> None:
        """Connect, read, and on any failure connect again with back-off, until ``stop()``: the thread never dies."""
        backoff = Backoff(RETRY_S, cap_s=RETRY_MAX_S)
        while not self._stop.is_set():
            try:
                if self._sock is None:
                    self._sock = self._connect()
                backoff.reset()
                self._serve(self._sock)
            except Refused as err:
                self.last_error = str(err)
                log.error("fleet: %s refused the collector: %s", self.broker.describe(), err)
            except Unacknowledged as err:
                self.last_error = str(err)
                log.warning(
                    "fleet: %s; not acknowledged: %s delivers it again when we reconnect in %g s",
                    err,
                    self.broker.describe(),
                    backoff.delay_s,
                )
            except Malformed as err:
                self.malformed += 1
                self.last_error = str(err)
                log.warning(
                    "fleet: %s; reconnecting to %s in %g s", err, self.broker.describe(), backoff.delay_s
                )
            except (OSError, ConnectionError) as err:
                if self._stop.is_set():
                    break
                self.last_error = str(err)
                log.warning(
                    "fleet: lost %s (%s); reconnecting in %g s", self.broker.describe(), err, backoff.delay_s
                )
            except Exception as err:  # a bug or an input nobody foresaw: start over, never end collection
                self.restarts += 1
                self.last_error = f"reader failed: {err!r}"[:300]
                log.exception("fleet: the reader failed; restarting it in %g s", backoff.delay_s)
            finally:
                self.connected.clear()
                self._skip, self._skip_ack = 0, b""
                if self._sock is not None:
                    self._sock.close()
                    self._sock = None
            backoff.wait(self._stop)

    def _serve(self, sock: socket.socket) -> None:
        keepalive = self.broker.keepalive_s
        idle_wait = max(0.5, keepalive / 4)
        buf = bytearray()
        last_sent = last_heard = time.monotonic()
        held: list[bytes] = []  # PUBACKs owed for what is handled but not yet committed
        held_since = 0.0
        while not self._stop.is_set():
            # While acks are held, wake when the oldest is due; settimeout(0) would make the socket non-blocking.
            wait = max(0.001, held_since + self.commit_delay_s - time.monotonic()) if held else idle_wait
            sock.settimeout(wait)
            try:
                data = sock.recv(READ_SIZE)
            except TimeoutError:
                data = None
            now = time.monotonic()
            if data == b"":
                raise ConnectionError("the broker closed the connection")
            if data:
                last_heard = now
                self._idle_since = None
                acks: list[bytes] = []
                fresh = memoryview(data)
                if self._skip:  # the rest of an oversized PUBLISH: count it off, keep nothing
                    n = min(self._skip, len(data))
                    self._skip -= n
                    fresh = fresh[n:]
                    if not self._skip and self._skip_ack:
                        acks.append(self._skip_ack)
                        self._skip_ack = b""
                if fresh:
                    buf += fresh
                    pos = self._frames(buf, acks)
                    del buf[:pos]
                if acks and not held:
                    held_since = now
                held += acks
            elif now - last_heard > 1.5 * keepalive:  # not even a PINGRESP: the link is dead
                raise ConnectionError(f"nothing from the broker for {now - last_heard:.0f} s")
            # One commit for many reads: a transaction per read costs more than the message at a
            # fleet's steady trickle (see COMMIT_DELAY_S).
            if held and (
                len(held) >= COMMIT_MAX or now - held_since >= self.commit_delay_s or self._unsubacked
            ):
                self._commit()
                self._send(sock, b"".join(held))
                held = []
                last_sent = now
            if data and not held:
                self._idle_since = time.monotonic()
                if self._unsubacked:  # after this read's acks: what came before the UNSUBACK is done
                    self._left.set()
            if now - last_sent > keepalive / 2:
                self._send(sock, _packet(PINGREQ, 0, b""))
                last_sent = now

    def _commit(self) -> None:
        """Have what this read's messages left buffered stored before they are acknowledged."""
        try:
            self.commit()
        except Exception as err:
            self.unacknowledged += 1
            # Not acknowledged: the broker still holds them, and sends them again once we are back.
            raise Unacknowledged(f"storing what was read failed ({err!r:.200})") from err

    def _frames(self, buf: bytearray, acks: list[bytes]) -> int:
        """Handle every complete packet in ``buf``, adding the PUBACKs owed to ``acks``; returns how far it got."""
        pos, end = 0, len(buf)
        while end - pos >= 2:
            head = buf[pos]
            length, shift, i = 0, 0, pos + 1
            while True:
                if i >= end:
                    return pos
                byte = buf[i]
                i += 1
                length |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    break
                shift += 7
                if shift > 21:
                    raise Malformed("a malformed packet length from the broker")
            kind = head >> 4
            if length > self.max_packet:
                if kind != PUBLISH:
                    raise Malformed(f"a {length}-byte packet of type {kind} from the broker")
                got = self._oversized(buf, i, end, length, head, acks)
                if got is None or self._skip:  # its topic is not all here yet, or the rest is to come
                    return pos if got is None else got
                pos = got
                continue
            stop = i + length
            if stop > end:
                break
            if kind == PUBLISH:
                qos = head & 0x06
                if length < 2:
                    raise Malformed(f"a {length}-byte PUBLISH (no room for its topic)")
                tlen = buf[i] << 8 | buf[i + 1]
                p = i + 2 + tlen
                if p + (2 if qos else 0) > stop:
                    raise Malformed(f"a {length}-byte PUBLISH with a {tlen}-byte topic")
                topic = buf[i + 2 : p].decode("utf-8", "replace")
                if qos:  # QoS 1 (we never subscribe at 2): a packet id follows the topic
                    acks.append(b"\x40\x02" + bytes(buf[p : p + 2]))
                    p += 2
                self.messages += 1
                try:
                    self.handle(topic, bytes(buf[p:stop]))
                except self.retry_on as err:  # not this message's fault: all of the read comes again
                    self.unacknowledged += 1
                    raise Unacknowledged(f"storing a message on {topic[:200]!r} failed ({err})") from err
                except Exception:  # one bad message must not end the subscription
                    self.handler_errors += 1
                    log.exception("fleet: handling a message on %r failed", topic[:200])
            elif kind == UNSUBACK:
                self._unsubacked = True
            elif kind == SUBACK:
                if 0x80 in buf[i + 2 : stop]:
                    raise Refused("the broker refused a subscription (its ACL?)")
                self.last_error = ""
                self.connected.set()
            pos = stop
        return pos

    def _oversized(
        self, buf: bytearray, i: int, end: int, length: int, head: int, acks: list[bytes]
    ) -> int | None:
        """Start draining the PUBLISH at ``i`` (``length`` bytes): report it, and skip what is not here yet.

        Returns where ``buf`` is used up to, or None until its topic and packet id have arrived.
        """
        if end - i < 2:
            return None
        tlen = buf[i] << 8 | buf[i + 1]
        qos = head & 0x06
        need = 2 + tlen + (2 if qos else 0)
        if need > length:
            raise Malformed(f"a {length}-byte PUBLISH with a {tlen}-byte topic")
        if end - i < need:
            return None
        topic = buf[i + 2 : i + 2 + tlen].decode("utf-8", "replace")
        ack = b"\x40\x02" + bytes(buf[i + need - 2 : i + need]) if qos else b""
        self.messages += 1
        self.too_large += 1
        here = min(length, end - i)
        self._skip = length - here
        if self._skip:
            self._skip_ack = ack
        elif ack:
            acks.append(ack)
        try:
            self.reject(topic, "too-large", f"{length} bytes > {self.max_packet}")
        except Exception:
            log.exception("fleet: reporting a dropped message on %r failed", topic[:200])
        return i + here
