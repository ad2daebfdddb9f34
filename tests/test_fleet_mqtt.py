"""The collector's own MQTT 3.1.1 subscriber against a real Mosquitto: order, QoS 1, the broker's queue
while it is away, reconnects, TLS with a password and an ACL, and refusals that say what to do."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edgekit.errors import EdgekitError, TelemetryError
from edgekit.fleet.mqtt import COMMIT_MAX, FleetSubscriber, shared_topics
from edgekit.protocol.broker import BrokerConfig
from edgekit.testing.mosquitto import Mosquitto, secure_mosquitto


class Inbox:
    def __init__(self) -> None:
        self.got: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()

    def __call__(self, topic: str, payload: bytes) -> None:
        with self.lock:
            self.got.append((topic, payload))

    def wait(self, check: Callable[[list[tuple[str, bytes]]], bool], timeout: float = 20) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if check(list(self.got)):
                    return True
            time.sleep(0.05)
        return False


def wait_until(check: Callable[[], bool], timeout: float = 20) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.02)
    return check()


def publish(port: int, messages: list[tuple[str, bytes]], **tls: str) -> None:
    """Publish with QoS 1 through paho (a device's client), waiting for every PUBACK."""
    # The ACL lets a device write only under its own client id.
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=tls.get("user") or f"pub-{time.monotonic_ns()}")
    if tls:
        c.tls_set(ca_certs=tls["ca"])
        c.username_pw_set(tls["user"], tls["password"])
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        infos = [c.publish(t, p, qos=1) for t, p in messages]
        for info in infos:
            info.wait_for_publish(20)  # a flood of thousands (test_fleet_quotas) on a busy machine
    finally:
        c.disconnect()
        c.loop_stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    b = Mosquitto(tmp_path).start()
    yield b
    b.stop()


def test_messages_arrive_in_order_and_the_broker_keeps_them_while_the_collector_is_away(
    broker: Mosquitto,
) -> None:
    inbox = Inbox()
    config = BrokerConfig.from_url(broker.url)
    sub = FleetSubscriber(config, inbox, client_id="collector-a").start()
    try:
        msgs = [(f"edgekit/v1/f/d{i % 3}/telemetry", f"{i}".encode() * (1 + i % 500)) for i in range(2000)]
        msgs.append(("spBv1.0/f/DDATA/n1/pipeline", b"\x08\x01"))
        msgs.append(("elsewhere/topic", b"not for us"))
        publish(broker.port, msgs)
        assert inbox.wait(lambda got: len(got) >= 2001)
        time.sleep(0.3)
        assert inbox.got == msgs[:2001]  # nothing lost, nothing reordered, nothing outside our topics
    finally:
        sub.stop()
    # Away: the persistent session makes the broker queue QoS 1 messages for this client id.
    away = [("edgekit/v1/f/d1/status", f"away-{i}".encode()) for i in range(100)]
    publish(broker.port, away)
    inbox.got.clear()
    sub = FleetSubscriber(config, inbox, client_id="collector-a").start()
    try:
        assert inbox.wait(lambda got: len(got) >= 100), f"only {len(inbox.got)} of the queued 100 arrived"
        assert inbox.got[:100] == away
    finally:
        sub.stop()


def test_a_handler_error_does_not_end_the_subscription(broker: Mosquitto) -> None:
    seen: list[bytes] = []

    def handle(topic: str, payload: bytes) -> None:
        if payload == b"boom":
            raise RuntimeError("a bug in a handler")
        seen.append(payload)

    sub = FleetSubscriber(BrokerConfig.from_url(broker.url), handle, client_id="collector-b").start()
    try:
        publish(broker.port, [("edgekit/v1/f/d/status", p) for p in (b"1", b"boom", b"2")])
        end = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < end:
            time.sleep(0.05)
        assert seen == [b"1", b"2"] and sub.handler_errors == 1
    finally:
        sub.stop()


def test_it_reconnects_when_the_broker_comes_back(broker: Mosquitto) -> None:
    inbox = Inbox()
    sub = FleetSubscriber(BrokerConfig.from_url(broker.url), inbox, client_id="collector-c").start()
    try:
        publish(broker.port, [("edgekit/v1/f/d/status", b"before")])
        assert inbox.wait(lambda got: len(got) == 1)
        broker.kill()
        assert not sub.connected.wait(0) or inbox.wait(lambda got: not sub.connected.is_set(), 10)
        broker.start()  # same port, same persistence file
        assert sub.connected.wait(30), f"no reconnect: {sub.last_error}"
        publish(broker.port, [("edgekit/v1/f/d/status", b"after")])
        assert inbox.wait(lambda got: got[-1][1] == b"after")
        assert sub.connects >= 2
    finally:
        sub.stop()


def test_nothing_listening_or_a_bad_url_says_what_to_do() -> None:
    from edgekit.testing.mosquitto import free_port

    with pytest.raises(TelemetryError) as err:
        FleetSubscriber(BrokerConfig.from_url(f"mqtt://127.0.0.1:{free_port()}"), print).start()
    assert "cannot reach" in str(err.value) and "mosquitto" in err.value.hint


@pytest.fixture
def secure_broker(tmp_path: Path) -> Iterator[tuple[Mosquitto, Path]]:
    b, ca_file = secure_mosquitto(
        tmp_path,
        {"fleet": "pw-f", "cam-1": "pw-1", "nosy": "pw-n"},
        "user fleet\ntopic read edgekit/v1/#\ntopic read spBv1.0/#\n\n"
        "user nosy\ntopic read other/#\n\npattern readwrite edgekit/v1/+/%c/#\n",
    )
    yield b, ca_file
    b.stop()


def test_tls_with_a_password_and_refusals_with_hints(secure_broker: tuple[Mosquitto, Path]) -> None:
    broker, ca = secure_broker
    inbox = Inbox()
    good = BrokerConfig.from_url(f"mqtts://fleet:pw-f@127.0.0.1:{broker.port}", ca_file=ca)
    sub = FleetSubscriber(good, inbox, client_id="collector-tls").start()
    try:
        publish(
            broker.port, [("edgekit/v1/f/cam-1/status", b"hello")], ca=str(ca), user="cam-1", password="pw-1"
        )
        assert inbox.wait(lambda got: got == [("edgekit/v1/f/cam-1/status", b"hello")])
    finally:
        sub.stop()
    wrong = BrokerConfig.from_url(f"mqtts://fleet:nope@127.0.0.1:{broker.port}", ca_file=ca)
    with pytest.raises(TelemetryError) as err:
        FleetSubscriber(wrong, inbox).start()
    assert "not authorized" in str(err.value) and "EDGEKIT_MQTT_PASSWORD" in err.value.hint
    assert "nope" not in str(err.value)
    untrusted = BrokerConfig.from_url(f"mqtts://fleet:pw-f@127.0.0.1:{broker.port}")  # no CA: not trusted
    with pytest.raises(TelemetryError) as err:
        FleetSubscriber(untrusted, inbox).start()
    assert "certificate" in str(err.value).lower()


def test_nothing_is_acknowledged_before_commit_returns(broker: Mosquitto) -> None:
    """A read whose commit fails is not acknowledged: the broker delivers it again (a crash before the
    store's transaction committed loses nothing)."""
    inbox = Inbox()
    commits: list[int] = []

    def commit() -> None:
        commits.append(len(inbox.got))
        if len(commits) == 1:
            raise RuntimeError("the store's transaction failed")

    sub = FleetSubscriber(BrokerConfig.from_url(broker.url), inbox, client_id="collector-e", commit=commit)
    sub.start()
    try:
        msgs = [("edgekit/v1/f/d/telemetry", str(i).encode()) for i in range(50)]
        publish(broker.port, msgs)
        assert inbox.wait(lambda got: {p for _, p in got} >= {p for _, p in msgs}, 30)
        assert sub.unacknowledged == 1 and sub.connects >= 2
        first = commits[0]  # what the failed read had handled: every one of them came again
        again = [p for _, p in inbox.got[first:]]
        assert all(p in again for _, p in inbox.got[:first]), (
            "a message of the failed read was not redelivered"
        )
    finally:
        sub.stop()


def test_a_trickle_of_messages_shares_commits(broker: Mosquitto) -> None:
    """At a fleet's steady trickle a read holds one message: the reader holds the acks for up to
    ``commit_delay_s`` (or COMMIT_MAX messages) so that one transaction stores many."""
    inbox = Inbox()
    commits: list[int] = []  # messages handled at each commit
    sub = FleetSubscriber(
        BrokerConfig.from_url(broker.url),
        inbox,
        client_id="collector-t",
        commit=lambda: commits.append(len(inbox.got)),
        commit_delay_s=0.2,
    ).start()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="pub-trickle")
    c.connect("127.0.0.1", broker.port)
    c.loop_start()
    try:
        assert sub.connected.wait(10)
        for i in range(20):  # one every 10 ms: each its own read
            c.publish("edgekit/v1/f/d/telemetry", str(i).encode(), qos=1)
            time.sleep(0.01)
        assert wait_until(lambda: bool(commits) and commits[-1] == 20), commits
        assert 2 <= len(commits) <= 10, commits  # grouped; never more than COMMIT_MAX held at once
        assert all(b - a <= COMMIT_MAX for a, b in zip([0, *commits], commits, strict=False)), commits
    finally:
        c.disconnect()
        c.loop_stop()
        sub.stop()


def test_a_shared_group_splits_the_data_and_gives_every_member_the_states(broker: Mosquitto) -> None:
    inboxes = [Inbox(), Inbox()]
    config = BrokerConfig.from_url(broker.url)
    subs = [
        FleetSubscriber(config, inbox, client_id=f"collector-g{i}", topics=shared_topics("g")).start()
        for i, inbox in enumerate(inboxes)
    ]
    try:
        data = [(f"edgekit/v1/f/d{i % 4}/telemetry", f"w{i}".encode()) for i in range(200)]
        data += [("edgekit/v1/f/d0/events", b"e1"), ("spBv1.0/f/DDATA/d0/pipeline", b"\x08\x01")]
        states = [("edgekit/v1/f/d0/status", b"online"), ("spBv1.0/f/NBIRTH/d0", b"\x08\x00")]
        publish(broker.port, [*states, *data])
        everything = set(data) | set(states)
        assert inboxes[0].wait(lambda _: set(inboxes[0].got) | set(inboxes[1].got) >= everything)
        time.sleep(0.3)  # anything delivered twice would be here by now
        got = [set(inbox.got) - set(states) for inbox in inboxes]
        assert got[0] and got[1], "one member took the whole stream"
        assert got[0] | got[1] == set(data) and not got[0] & got[1]  # each data message to one member
        assert all(len(inbox.got) == len(set(inbox.got)) for inbox in inboxes)
        assert all(set(states) <= set(inbox.got) for inbox in inboxes)  # the real topics, not $share/...
    finally:
        for sub in subs:
            sub.stop()


@pytest.mark.parametrize("group", ["", "a/b", "a+", "#", "two words", "x" * 65])
def test_a_bad_group_name_says_what_a_good_one_is(group: str) -> None:
    with pytest.raises(EdgekitError) as err:
        shared_topics(group)
    assert "--share" in str(err.value) and "e.g. --share collectors" in err.value.hint


def test_a_member_that_leaves_leaves_its_share_to_the_others(broker: Mosquitto) -> None:
    """Stopped with leave=True a member unsubscribes: the broker queues nothing for its session (which
    would wait for it, maybe for ever), and the member that stays gets every message."""
    inboxes = [Inbox(), Inbox()]
    config = BrokerConfig.from_url(broker.url)

    def member(i: int) -> FleetSubscriber:
        return FleetSubscriber(config, inboxes[i], client_id=f"collector-l{i}", topics=shared_topics("g"))

    leaving, staying = member(0).start(), member(1).start()
    try:
        before = [(f"edgekit/v1/f/d{i % 3}/telemetry", f"a{i}".encode()) for i in range(100)]
        publish(broker.port, before)
        assert inboxes[0].wait(lambda _: len(inboxes[0].got) + len(inboxes[1].got) >= 100)
        leaving.stop(leave=True)
        assert set(inboxes[0].got) | set(inboxes[1].got) == set(before)
        after = [(f"edgekit/v1/f/d{i % 3}/telemetry", f"b{i}".encode()) for i in range(100)]
        publish(broker.port, after)
        assert inboxes[1].wait(lambda got: set(after) <= set(got)), "a message went to the member that left"
        back = member(0).start()  # the same client id: its session has nothing waiting
        time.sleep(1.0)
        back.stop(leave=True)
        assert not set(after) & set(inboxes[0].got)
    finally:
        staying.stop()
