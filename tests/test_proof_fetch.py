"""Event proof stays on the device and is fetched on demand: a real Mosquitto, a real agent, the dashboard's routes.

The agent runs in this process on its own state root (no pipeline child: the proofs are
written here with ``write_snapshot`` / ``write_clip`` into ``<root>/proofs``, where the child
writes them).  The dashboard's HTTP routes ask it over MQTT with commands signed by a key the
agent trusts; what they serve must be the files on the device, byte for byte.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from edgekit.events.event import Event, event_id
from edgekit.events.proof_ring import EncodedFrame
from edgekit.events.proof_store import encode_jpeg, event_dir, write_clip, write_snapshot
from edgekit.protocol.broker import BrokerConfig
from edgekit.testing.mosquitto import Mosquitto

FLEET, DEVICE = "lab", "cam-1"
T = time.time() - 120
# Short waits: an answer on loopback comes in well under a second.
WAITS = {"list": 5.0, "snapshot": 5.0, "clip": 15.0}


def until(check: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    return None


def store_events(site: Site, *events: Event) -> None:
    """The device sends ``events`` (the collector takes them as from the broker)."""
    from edgekit.telemetry.event_queue import event_body

    for seq, e in enumerate(events):
        body = event_body(e.to_dict(), device=DEVICE, fleet=FLEET, session="s1", epoch="e1", seq=seq)
        site.collector.handle(f"edgekit/v1/{FLEET}/{DEVICE}/events", json.dumps(body).encode())


def crossing(n: int, camera: str = "gate") -> Event:
    return Event(
        id=event_id(camera, "cross", "stop", n, T, 1),
        kind="cross",
        camera=camera,
        zone="stop",
        t=T + n,
        frame_index=30 * n,
        track_id=n,
        class_name="car",
        direction="in",
        box=(10.0, 20.0, 110.0, 90.0),
    )


def noise(seed: int, shape: tuple[int, int] = (240, 320)) -> np.ndarray:
    """A frame that JPEG cannot squeeze much: clips of a few of them span several chunks."""
    return np.random.default_rng(seed).integers(0, 256, (*shape, 3), dtype=np.uint8)


@dataclass
class Site:
    broker: Mosquitto
    proofs: Path
    agent: Any
    fetcher: Any
    client: TestClient
    private_key: Path
    collector: Any
    view: Any


@pytest.fixture
def site(tmp_path: Path, broker: Mosquitto) -> Iterator[Site]:
    from edgekit.bundle.keys import generate_keypair, load_private_key
    from edgekit.deploy.agent import Agent, AgentConfig
    from edgekit.deploy.slots import StateRoot
    from edgekit.fleet import Collector
    from edgekit.fleet.dashboard import create_app
    from edgekit.fleet.proofs import ProofFetcher
    from edgekit.fleet.store import FleetStore
    from edgekit.fleet.view import FleetView

    private, public = generate_keypair(tmp_path / "fleet")
    root = StateRoot(tmp_path / "root")
    shutil.copy(public, root.keys_dir / "fleet.pub.pem")
    config = BrokerConfig.from_url(broker.url)
    agent = Agent(root, config, AgentConfig(broker.url, FLEET, DEVICE)).start()
    assert agent._connected.wait(10)
    fetcher = ProofFetcher(config, load_private_key(private).sign, waits=WAITS).start()
    store = FleetStore()
    view = FleetView(store)
    collector = Collector(store, listener=view)
    try:
        with TestClient(create_app(view, proofs=fetcher), base_url="http://127.0.0.1") as client:
            yield Site(broker, agent.proof_root, agent, fetcher, client, private, collector, view)
    finally:
        fetcher.stop()
        agent.stop(timeout_s=5)


def proof_url(event: str, name: str, device: str = DEVICE) -> str:
    return f"/api/device/{FLEET}/{device}/events/{event}/{name}"


def snapshot_of(proofs: Path, event: Event) -> Path:
    return write_snapshot(proofs, event, noise(1), [])


def clip_of(proofs: Path, event: Event, frames: int = 12) -> Path:
    ring = [EncodedFrame(event.t - 1 + i / 10, encode_jpeg(noise(i))) for i in range(frames)]
    return write_clip(proofs, event, ring)


# -- the files, byte for byte ----------------------------------------------------------------------


def test_the_dashboard_fetches_a_snapshot_and_a_clip_from_the_agent_byte_for_byte(site: Site) -> None:
    from edgekit.protocol.proof_messages import CHUNK_BYTES

    event = crossing(1)
    snap, clip = snapshot_of(site.proofs, event), clip_of(site.proofs, event)
    assert clip.stat().st_size > 2 * CHUNK_BYTES  # it travels in several chunks
    r = site.client.get(proof_url(event.id, "snapshot.jpg"))
    assert r.status_code == 200, r.text
    assert r.content == snap.read_bytes() and r.headers["content-type"] == "image/jpeg"
    assert "immutable" in r.headers["cache-control"]
    r = site.client.get(proof_url(event.id, "clip.avi"))
    assert r.status_code == 200, r.text
    assert r.content == clip.read_bytes() and r.headers["content-type"] == "video/x-msvideo"
    assert f'filename="{event.id}.avi"' in r.headers["content-disposition"]
    asked = site.fetcher.stats["asked"]
    # Once here, a proof is served from the fleet's memory: the device is not asked again, even gone.
    site.agent.stop(timeout_s=5)
    again = site.client.get(proof_url(event.id, "clip.avi"))
    assert again.status_code == 200 and again.content == clip.read_bytes()
    assert site.fetcher.stats["asked"] == asked and site.fetcher.stats["cached"] >= 1


def test_the_events_of_a_device_say_which_have_a_snapshot_and_a_clip(site: Site) -> None:
    with_both, snapshot_only, without = crossing(1), crossing(2), crossing(3)
    snap = snapshot_of(site.proofs, with_both)
    clip = clip_of(site.proofs, with_both, frames=3)
    snapshot_of(site.proofs, snapshot_only)
    # A proof someone else put there, its camera no name: left out, not a reason to send no list.
    stray, odd = event_dir(site.proofs, with_both), crossing(5).id
    (stray / f"{odd}.jpg").write_bytes(snap.read_bytes())
    (stray / f"{odd}.json").write_text(
        json.dumps({"event": {"camera": "", "t": T}, "snapshot": f"{odd}.jpg"})
    )
    store_events(site, with_both, snapshot_only, without)

    def events() -> dict[str, Any] | None:
        page = site.client.get(f"/api/device/{FLEET}/{DEVICE}/events").json()["events"]
        marked = {e["id"]: e.get("proof") for e in page}
        return marked if marked.get(with_both.id) else None  # the list is asked for in the background

    marked = until(events)
    assert marked is not None, "the proof list never came"
    assert marked[with_both.id] == {"snapshot": snap.stat().st_size, "clip": clip.stat().st_size}
    assert marked[snapshot_only.id]["clip"] is None and marked[snapshot_only.id]["snapshot"] > 0
    assert marked[without.id] is None
    listed = site.fetcher.proofs_of(FLEET, DEVICE)
    assert listed is not None and set(listed) == {with_both.id, snapshot_only.id}


def test_the_device_page_shows_the_snapshot_and_links_the_clip(site: Site, tmp_path: Path) -> None:
    """In headless Chromium: the Events panel's thumbnail is the device's snapshot, loaded through the server."""
    import uvicorn
    from chromium import open_chromium, require_chromium

    from edgekit.fleet.dashboard import create_app
    from edgekit.testing.mosquitto import free_port

    require_chromium()
    event = crossing(1)
    snapshot_of(site.proofs, event)
    clip_of(site.proofs, event, frames=3)
    store_events(site, event)
    site.view.tick()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(site.view, proofs=site.fetcher), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    driver = None
    try:
        assert until(lambda: server.started, 20)
        driver = open_chromium(tmp_path)
        driver.get(f"http://127.0.0.1:{port}/#/device/{FLEET}/{DEVICE}")
        loaded = (
            "var i = document.querySelector('#dev-events-table img.proof-thumb');"
            "return i && i.complete ? [i.naturalWidth, i.getAttribute('loading'), i.getAttribute('src')] : null;"
        )
        shown = until(lambda: driver.execute_script(loaded), 30)
        clip = driver.execute_script(
            "var a = document.querySelector('#dev-events-table a.proof-clip'); return a && a.href;"
        )
    finally:
        if driver is not None:
            driver.quit()
        server.should_exit = True
        thread.join(10)
    assert shown is not None, "no thumbnail was shown"
    assert shown == [320, "lazy", proof_url(event.id, "snapshot.jpg")]  # the noise frame's width: it decoded
    assert clip and clip.endswith(proof_url(event.id, "clip.avi"))


# -- what is refused, and how it is said -----------------------------------------------------------


def test_an_unknown_event_a_link_out_of_the_folder_and_an_oversized_file_are_refused_with_a_reason(
    site: Site,
) -> None:
    from edgekit.protocol.proof_messages import MAX_PROOF_BYTES

    unknown = crossing(7).id
    r = site.client.get(proof_url(unknown, "snapshot.jpg"))
    assert r.status_code == 404 and f"no snapshot of event {unknown}" in r.text, r.text
    assert site.client.get(proof_url("../../keys", "snapshot.jpg")).status_code in (400, 404)
    assert site.client.get(proof_url("not-a-uuid", "snapshot.jpg")).status_code == 400

    linked = crossing(8)
    folder = event_dir(site.proofs, linked)
    folder.mkdir(parents=True)
    outside = site.proofs.parent / "keys" / "fleet.pub.pem"
    (folder / f"{linked.id}.jpg").symlink_to(outside)
    r = site.client.get(proof_url(linked.id, "snapshot.jpg"))
    assert r.status_code == 502 and "outside the proof folder" in r.text, r.text

    big = crossing(9)
    folder = event_dir(site.proofs, big)
    (folder / f"{big.id}.jpg").write_bytes(b"\xff\xd8\xff" + bytes(MAX_PROOF_BYTES["snapshot"]))
    r = site.client.get(proof_url(big.id, "snapshot.jpg"))
    assert r.status_code == 413 and "over the" in r.text, r.text

    # A temp file (a write in progress) cannot be named: only <event id>.jpg is looked for.
    writing = crossing(10)
    (folder / f".{writing.id}.jpg.tmp-1234").write_bytes(b"\xff\xd8\xff\x00")
    assert site.client.get(proof_url(writing.id, "snapshot.jpg")).status_code == 404


def test_a_traversal_over_mqtt_is_refused_by_the_command_check(site: Site) -> None:
    """Whoever can publish a signed command still names an event id, never a path."""
    from edgekit.bundle.keys import load_private_key
    from edgekit.protocol.control import new_nonce, signed_bytes

    answers: list[dict[str, Any]] = []
    client = BrokerConfig.from_url(site.broker.url).client("test-sender")
    client.on_message = lambda c, u, m: answers.append(json.loads(m.payload))
    client.connect("127.0.0.1", site.broker.port)
    client.subscribe(f"edgekit/v1/{FLEET}/{DEVICE}/cmd/result", qos=1)
    client.loop_start()
    try:
        body = {
            "schema": "edgekit/v1/cmd", "id": "proof-traversal", "action": "fetch-proof", "fleet": FLEET,
            "device": DEVICE, "event": "../keys/fleet.pub", "file": "snapshot",
            "expires_at": time.time() + 60, "nonce": new_nonce(),
        }  # fmt: skip
        body["signature"] = base64.b64encode(
            load_private_key(site.private_key).sign(signed_bytes(body))
        ).decode()
        client.publish(f"edgekit/v1/{FLEET}/{DEVICE}/cmd", json.dumps(body), qos=1).wait_for_publish(5)
        final = until(lambda: [a for a in answers if a.get("final")])
    finally:
        client.loop_stop()
        client.disconnect()
    assert final and final[0]["ok"] is False and final[0]["id"] == "proof-traversal"
    assert "is not an event id" in final[0]["reason"] and not [a for a in answers if "data" in a]


def test_an_unsigned_ask_is_refused_by_the_agent_and_the_dashboard_says_so(site: Site) -> None:
    from edgekit.fleet.dashboard import create_app
    from edgekit.fleet.proofs import ProofFetcher
    from edgekit.fleet.store import FleetStore
    from edgekit.fleet.view import FleetView

    event = crossing(1)
    snapshot_of(site.proofs, event)
    unsigned = ProofFetcher(BrokerConfig.from_url(site.broker.url), None, waits=WAITS).start()
    try:
        with TestClient(
            create_app(FleetView(FleetStore()), proofs=unsigned), base_url="http://127.0.0.1"
        ) as c:
            r = c.get(proof_url(event.id, "snapshot.jpg"))
    finally:
        unsigned.stop()
    assert r.status_code == 502 and "not signed" in r.text, r.text


# -- a device that is not there --------------------------------------------------------------------


def test_an_offline_agent_is_answered_at_once_and_a_silent_device_within_the_wait(site: Site) -> None:
    event = crossing(1)
    snapshot_of(site.proofs, event)
    site.agent.stop(timeout_s=5)  # says offline (retained), as its Last Will would
    assert until(lambda: site.fetcher._agents.get((FLEET, DEVICE)) == "offline", 10)
    started = time.monotonic()
    r = site.client.get(proof_url(event.id, "snapshot.jpg"))
    assert r.status_code == 504 and "offline" in r.text, r.text
    assert time.monotonic() - started < WAITS["snapshot"]  # not a wait for an answer that cannot come

    # No agent ever reported for cam-9: the ask goes out, and ends when its wait does.
    r = site.client.get(proof_url(event.id, "snapshot.jpg", device="cam-9"))
    assert r.status_code == 504 and "no answer within" in r.text, r.text
    # ... and the next view of the page is not another wait.
    started = time.monotonic()
    assert site.client.get(proof_url(event.id, "snapshot.jpg", device="cam-9")).status_code == 504
    assert time.monotonic() - started < WAITS["snapshot"] / 2


def test_a_damaged_answer_is_refused_not_shown(site: Site) -> None:
    """A device that answers with the wrong hash, or with something that is no JPEG, shows nothing."""
    from edgekit.protocol.proof_messages import proof_chunk_message

    event = crossing(1).id
    good = encode_jpeg(noise(3))
    cases = {
        "cam-h": (good, hashlib.sha256(b"something else").hexdigest()),
        "cam-m": (b"GIF89a" + good, None),
    }
    client = BrokerConfig.from_url(site.broker.url).client("test-forger")

    def answer(c: Any, userdata: Any, msg: Any) -> None:
        cmd = json.loads(msg.payload)
        data, digest = cases[cmd["device"]]
        body = proof_chunk_message(
            cmd["device"], cmd["id"], event, "snapshot", 0, len(data),
            digest or hashlib.sha256(data).hexdigest(), base64.b64encode(data).decode(),
        )  # fmt: skip
        result = f"edgekit/v1/{FLEET}/{cmd['device']}/cmd/result"
        c.publish(result, json.dumps(body), qos=1)
        final = {
            "schema": "edgekit/v1/cmd-result",
            "id": cmd["id"],
            "device": cmd["device"],
            "final": True,
            "ok": True,
        }
        c.publish(result, json.dumps(final), qos=1)

    ready = threading.Event()
    client.on_message = answer
    client.on_subscribe = lambda *a: ready.set()
    client.connect("127.0.0.1", site.broker.port)
    client.subscribe(f"edgekit/v1/{FLEET}/+/cmd", qos=1)
    client.loop_start()
    assert ready.wait(10)
    try:
        hashed = site.client.get(proof_url(event, "snapshot.jpg", device="cam-h"))
        mislabelled = site.client.get(proof_url(event, "snapshot.jpg", device="cam-m"))
    finally:
        client.loop_stop()
        client.disconnect()
    assert hashed.status_code == 502 and "SHA-256" in hashed.text, hashed.text
    assert mislabelled.status_code == 502 and "not a JPEG" in mislabelled.text, mislabelled.text


def test_the_agent_tells_its_pipeline_child_where_to_write_proof(tmp_path: Path) -> None:
    from edgekit.deploy.agent import Agent, AgentConfig
    from edgekit.deploy.slots import StateRoot

    url = "mqtt://127.0.0.1:1"
    root = StateRoot(tmp_path / "root")
    agent = Agent(root, BrokerConfig.from_url(url), AgentConfig(url, FLEET, DEVICE, source="synthetic"))
    argv = agent._child_argv(tmp_path / "bundle")
    at = argv.index("--proof-dir")
    assert argv[at + 1] == str(root.path / "proofs") == str(agent.proof_root)
    assert Path(argv[at + 1]).is_absolute()
