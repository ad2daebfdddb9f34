"""The watchdog: WATCHDOG=1 reaches a real notify socket from a real pipeline while its frames flow,
and stops when the loop is stuck or a camera hangs without an outage; a camera in a counted outage
(reconnecting) keeps it.  Real model (the reference bundle), real sockets and processes; the wedges are stand-ins that block
on an Event, so they happen exactly when the test says."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from stand_in import SlowSession

import edgekit
from edgekit.core.sd_notify import Notifier
from edgekit.pipeline.heartbeat import attach_heartbeat
from edgekit.pipeline.sources import Source, SourceInfo

pytestmark = pytest.mark.slow

PET_S = 0.1  # the heartbeat's interval in these tests (half of a 0.2 s WatchdogSec)
QUIET_S = 1.0  # ten intervals without a pet: held back, not late


def until(cond: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def goes_quiet(li: Listener, timeout_s: float = 30.0) -> bool:
    """Whether ``QUIET_S`` (ten intervals) pass without a pet, within ``timeout_s``: petting stopped.

    Not at once: a camera that delivered a frame since the last pet still earns one more."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = li.count("WATCHDOG=1")
        time.sleep(QUIET_S)
        if li.count("WATCHDOG=1") == before:
            return True
    return False


class Listener:
    """A notify socket, as systemd's: collects every message on a thread."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)
        self._sock.settimeout(0.2)
        self.messages: list[list[str]] = []
        self._done = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._done:
            try:
                self.messages.append(self._sock.recv(4096).decode().splitlines())
            except TimeoutError:
                continue

    def count(self, line: str) -> int:
        return sum(line in m for m in list(self.messages))

    def close(self) -> None:
        self._done = True
        self._thread.join(2)
        self._sock.close()


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    li = Listener(tmp_path / "notify.sock")
    yield li
    li.close()


@pytest.fixture(scope="module")
def model(x86_bundle: tuple[Path, dict[str, Any]]) -> Any:
    with edgekit.load(x86_bundle[0], device="x86_64-cpu") as m:
        yield m


class WedgingSession(SlowSession):
    """The real session, until ``wedge`` is set: then ``run()`` blocks until ``release`` (a hung runtime)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner, 0.0)
        self.wedge, self.wedged, self.release = threading.Event(), threading.Event(), threading.Event()

    def _run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        if self.wedge.is_set() and not self.release.is_set():
            self.wedged.set()
            self.release.wait()
        return super()._run(arrays)


class GateSource(Source):
    """A live 30 fps test pattern that stops on cue: ``hang`` (stuck in a read, nothing counted) or
    ``outage`` (counted, then waiting to reopen, as a camera that is down); ``hang_after_reopen``:
    the reopened camera then hangs in its first read until ``unhang``."""

    def __init__(self) -> None:
        super().__init__(SourceInfo("gate:", "synthetic", live=True, fps=30.0))
        self.mode = ""
        self.stuck = threading.Event()
        self.resume = threading.Event()
        self.hang_after_reopen = False
        self.reopened = threading.Event()
        self.unhang = threading.Event()

    def _read(self) -> np.ndarray | None:
        if self.mode and not self.resume.is_set():
            if self.mode == "outage":
                self._outage()  # counted as a real source counts one
            self.stuck.set()
            self.resume.wait()
            if self.mode == "outage":
                self.counters.reopens += 1
                if self.hang_after_reopen:
                    self.reopened.set()
                    self.unhang.wait()
        time.sleep(1 / 30)
        return np.full((120, 160, 3), 128, np.uint8)

    def close(self) -> None:
        self.resume.set()
        self.unhang.set()
        super().close()


def notifier(li: Listener) -> Notifier:
    return Notifier({"NOTIFY_SOCKET": li.path, "WATCHDOG_USEC": str(round(2 * PET_S * 1e6))})


def running(p: edgekit.Pipeline) -> threading.Thread:
    t = threading.Thread(target=p.run, daemon=True)
    t.start()
    return t


def test_pets_while_frames_flow_and_none_while_the_runtime_hangs(model: Any, listener: Listener) -> None:
    real = model.session
    session = model.session = WedgingSession(real)
    try:
        with edgekit.Pipeline(model, "synthetic:160x120@30") as p:
            beat = attach_heartbeat(p, notifier(listener))
            assert beat is not None
            t = running(p)
            assert until(lambda: listener.count("READY=1") == 1 and listener.count("WATCHDOG=1") >= 5)
            session.wedge.set()
            assert session.wedged.wait(30)
            assert goes_quiet(listener)  # the loop is stuck: no pet
            before, frames = listener.count("WATCHDOG=1"), p.counters.frames
            time.sleep(QUIET_S)
            assert listener.count("WATCHDOG=1") == before and p.counters.frames == frames
            session.release.set()
            assert until(lambda: listener.count("WATCHDOG=1") >= before + 3)  # frames flow again
            p.stop()
            t.join(30)
        assert until(lambda: listener.count("STOPPING=1") == 1)  # closed on purpose
        assert any(line.startswith("STATUS=source: ") for m in listener.messages for line in m)
    finally:
        session.release.set()
        model.session = real


def test_a_hung_camera_stops_the_pets_and_a_camera_in_an_outage_keeps_them(
    model: Any, listener: Listener
) -> None:
    for mode, pets in (("hang", False), ("outage", True)):
        listener.messages.clear()
        source = GateSource()
        with edgekit.Pipeline(model, source) as p:
            beat = attach_heartbeat(p, notifier(listener))
            assert beat is not None
            t = running(p)
            assert until(lambda: listener.count("WATCHDOG=1") >= 3)
            source.mode = mode
            assert source.stuck.wait(30)
            if pets:  # reconnecting with back-off: the source's own cure, no restart
                for _ in range(3):  # ten intervals, three times over: pets all along
                    before = listener.count("WATCHDOG=1")
                    time.sleep(QUIET_S)
                    assert listener.count("WATCHDOG=1") >= before + 3, mode
                assert any("reconnecting (outage 1, down " in line for m in listener.messages for line in m)
            else:  # the loop goes round, waiting, but the camera accounts for nothing
                assert goes_quiet(listener), mode
                assert beat.held.startswith("no frame and no outage")
            after = listener.count("WATCHDOG=1")
            source.resume.set()
            assert until(lambda: listener.count("WATCHDOG=1") >= after + 3)  # noqa: B023 (called now)
            p.stop()
            t.join(30)


def test_a_camera_reopened_that_then_hangs_is_wedged(model: Any, listener: Listener) -> None:
    source = GateSource()
    source.hang_after_reopen = True
    with edgekit.Pipeline(model, source) as p:
        assert attach_heartbeat(p, notifier(listener)) is not None
        t = running(p)
        assert until(lambda: listener.count("WATCHDOG=1") >= 3)
        source.mode = "outage"
        assert source.stuck.wait(30)
        before = listener.count("WATCHDOG=1")
        time.sleep(QUIET_S)
        assert listener.count("WATCHDOG=1") >= before + 3  # reconnecting: pets
        source.resume.set()  # reopened, and stuck in its first read: no longer reconnecting
        assert source.reopened.wait(30)
        assert goes_quiet(listener)
        source.unhang.set()
        after = listener.count("WATCHDOG=1")
        assert until(lambda: listener.count("WATCHDOG=1") >= after + 3)
        p.stop()
        t.join(30)


def test_without_a_socket_nothing_is_attached(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    with edgekit.Pipeline(model, "synthetic:160x120@30", frames=3) as p:
        assert attach_heartbeat(p) is None
        assert p.run().frames == 3
