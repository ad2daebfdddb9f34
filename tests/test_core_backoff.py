"""edgekit's one exponential back-off (``edgekit.core.backoff``), and that every retrying loop uses it."""

from __future__ import annotations

import random
import re
import threading
import time
from pathlib import Path

import pytest

from edgekit.core.backoff import Backoff


def delays(b: Backoff, n: int) -> list[float]:
    return [b.next_delay() for _ in range(n)]


def test_delays_grow_by_the_factor_and_stop_at_the_cap() -> None:
    b = Backoff(0.1, cap_s=4.0)
    assert delays(b, 8) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 4.0, 4.0])
    assert delays(Backoff(1.0, factor=3.0, cap_s=10.0), 4) == [1.0, 3.0, 9.0, 10.0]
    assert delays(Backoff(1.0), 6) == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]  # no cap unless given
    assert delays(Backoff(0.0), 3) == [0.0, 0.0, 0.0]  # a caller may ask for no wait at all


def test_delay_s_is_the_next_wait_and_reset_starts_over() -> None:
    b = Backoff(1.0, cap_s=5.0)
    assert b.delay_s == 1.0
    assert delays(b, 2) == [1.0, 2.0]
    assert b.delay_s == 4.0  # what a log line says the next wait will be
    assert b.next_delay() == 4.0 and b.delay_s == 5.0
    b.reset()
    assert b.delay_s == 1.0 and delays(b, 2) == [1.0, 2.0]


def test_jitter_shortens_each_wait_by_at_most_its_share() -> None:
    b = Backoff(1.0, cap_s=8.0, jitter=0.5, rng=random.Random(7))
    got = delays(b, 200)
    plain = delays(Backoff(1.0, cap_s=8.0), 200)
    for j, p in zip(got, plain, strict=True):
        assert 0.5 * p <= j <= p
    assert len({round(j, 6) for j in got[10:]}) > 1  # it varies (at the cap the plain delay does not)
    assert b.delay_s == 8.0  # the un-jittered delay still grows and caps


@pytest.mark.parametrize(
    "kwargs",
    [
        {"first_s": -1.0},
        {"first_s": 1.0, "factor": 0.5},
        {"first_s": 2.0, "cap_s": 1.0},
        {"first_s": 1.0, "jitter": 1.5},
    ],
)
def test_nonsense_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)


def test_wait_returns_false_at_once_when_the_event_is_set() -> None:
    stop = threading.Event()
    stop.set()
    b = Backoff(30.0)
    t0 = time.monotonic()
    assert b.wait(stop) is False
    assert time.monotonic() - t0 < 10.0  # far less than the 30 s it would have slept


def test_wait_ends_early_when_the_event_is_set_meanwhile() -> None:
    stop = threading.Event()
    b = Backoff(30.0)
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    assert b.wait(stop) is False
    assert time.monotonic() - t0 < 10.0


def test_wait_sleeps_the_delay_when_nothing_stops_it() -> None:
    b = Backoff(0.05, cap_s=0.05)
    t0 = time.monotonic()
    assert b.wait(threading.Event()) is True
    assert b.wait() is True  # no event: a plain sleep
    assert time.monotonic() - t0 >= 0.09  # it did wait (a lower bound only)


ROOT = Path(__file__).resolve().parents[1]
# A hand-written doubling of a delay: what Backoff is for.
HAND_WRITTEN = re.compile(r"min\(\s*\w+\s*\*\s*2\s*,|\*\s*2\s*\*\*\s*\(?\s*attempt")


def test_no_hand_written_back_off_in_edgekit() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / "edgekit").rglob("*.py"))
        if path.name != "backoff.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if HAND_WRITTEN.search(line)
    ]
    assert not found, "use edgekit.core.backoff.Backoff:\n" + "\n".join(found)
