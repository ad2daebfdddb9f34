"""The agent's pipeline supervisor: a crashing child is started again with back-off, and a restart
or a stop ends that back-off at once (real child processes, no mocks)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgekit.deploy import supervisor as sup
from edgekit.deploy.supervisor import PipelineSupervisor

CRASH = [sys.executable, "-c", "raise SystemExit(3)"]


def until(cond: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_a_crashing_child_is_started_again_with_growing_waits_up_to_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sup, "CRASH_BACKOFF_FIRST_S", 0.05)
    monkeypatch.setattr(sup, "MAX_BACKOFF_S", 0.2)
    caplog.set_level(logging.WARNING, logger=sup.__name__)
    states: list[str] = []
    s = PipelineSupervisor(lambda bundle: CRASH, lambda: tmp_path, on_state=states.append).start()
    try:
        assert until(lambda: s.starts >= 5), f"started {s.starts} times"
    finally:
        s.stop()
    waits = [
        float(r.getMessage().rsplit(" in ", 1)[1].split()[0])
        for r in caplog.records
        if "exited with 3" in r.getMessage()
    ]
    assert waits[:4] == [0.05, 0.1, 0.2, 0.2]
    assert "running" in states and "backoff" in states


def test_a_restart_or_a_stop_ends_the_back_off_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sup, "CRASH_BACKOFF_FIRST_S", 600.0)  # a wait no test would sit out
    monkeypatch.setattr(sup, "MAX_BACKOFF_S", 600.0)
    s = PipelineSupervisor(lambda bundle: CRASH, lambda: tmp_path).start()
    try:
        assert until(lambda: s.state == "backoff" and s.starts == 1)
        s.restart()  # a switch: the child is started again now, not in 600 s
        assert until(lambda: s.starts == 2)
        assert until(lambda: s.state == "backoff")
    finally:
        s.stop()
    assert not s._thread.is_alive()  # the stop ended the 600 s wait too
