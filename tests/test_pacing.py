"""The camera-rate scenario's schedule, driven by a fake clock: exact issue times, overruns, wake-up cost."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from edgekit.device.pacing import (
    WARM_MARGIN_NS,
    WARM_MAX_PASSES,
    PacedRun,
    WarmCosts,
    back_to_back_latencies,
    camera_rate,
    fps_for_budget,
    paced_run,
)

MS = 1_000_000  # ns


class FakeTime:
    """A clock that moves only when slept on or when a query "runs" (each takes its set time)."""

    def __init__(self, run_ms: Sequence[float], start_ns: int = 5 * MS) -> None:
        self.now = start_ns
        self.run_ns = [round(ms * MS) for ms in run_ms]
        self.issued: list[int] = []  # when each query started
        self.warmed: list[int] = []  # when each warm pass started (a pass is a query too)
        self.sleeps: list[float] = []

    def clock(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += round(seconds * 1e9)

    def run(self) -> None:
        self.issued.append(self.now)
        self.now += self.run_ns[len(self.issued) - 1]

    def warm(self) -> None:
        self.warmed.append(self.now)
        self.run()


def test_each_query_is_issued_at_its_slot_never_earlier() -> None:
    t = FakeTime([2.0] * 7)  # 2 warm-up + 5 measured, each 2 ms, at 100 fps (10 ms slots)
    run = paced_run(t.run, 100.0, 5, warmup=2, sleep=t.sleep, clock=t.clock)
    t0 = 5 * MS
    assert t.issued == [t0 + i * 10 * MS for i in range(7)]
    assert run.latencies_ms == (2.0,) * 5
    assert run.overruns == 0
    assert run.fps == 100.0
    # Measured from the first measured query's issue to the end: 4 slots and one query.
    assert run.duration_s == pytest.approx(0.042)


def test_a_sleep_that_returns_early_is_slept_again() -> None:
    t = FakeTime([1.0] * 3)
    woke_early = [True]

    def sleep(seconds: float) -> None:
        # The first sleep wakes halfway (as a signal would make it); the pacer must look again.
        if woke_early[0]:
            woke_early[0] = False
            t.sleep(seconds / 2)
        else:
            t.sleep(seconds)

    paced_run(t.run, 50.0, 3, warmup=0, sleep=sleep, clock=t.clock)
    t0 = 5 * MS
    assert t.issued == [t0, t0 + 20 * MS, t0 + 40 * MS]


def test_an_overrun_sends_the_next_query_at_once_and_is_counted() -> None:
    # 10 ms slots: the 2nd measured query takes 25 ms, so the next two slots are already due.
    t = FakeTime([1.0, 1.0, 25.0, 1.0, 1.0, 1.0])
    run = paced_run(t.run, 100.0, 5, warmup=1, sleep=t.sleep, clock=t.clock)
    t0 = 5 * MS
    assert t.issued == [
        t0,  # warm-up
        t0 + 10 * MS,
        t0 + 20 * MS,  # runs 25 ms: ends at 45 ms, past the 30 ms slot and the 40 ms one
        t0 + 45 * MS,  # issued at once (late for its 30 ms slot)
        t0 + 46 * MS,  # its 40 ms slot has passed too: at once
        t0 + 50 * MS,  # back on the schedule: the schedule never shifts
    ]
    assert run.latencies_ms == (1.0, 25.0, 1.0, 1.0, 1.0)
    # Two queries ended after the next one was due: the 25 ms one, and the late one issued at
    # 45 ms that ended at 46 ms, past the 40 ms slot (the loop was still catching up).
    assert run.overruns == 2


def test_warmup_overruns_are_not_counted() -> None:
    t = FakeTime([15.0, 1.0, 1.0])  # the warm-up query overruns its 10 ms slot
    run = paced_run(t.run, 100.0, 2, warmup=1, sleep=t.sleep, clock=t.clock)
    assert t.issued == [5 * MS, 20 * MS, 25 * MS]
    assert run.overruns == 0  # the measured ones each ended before the next was due
    assert run.latencies_ms == (1.0, 1.0)


def test_paced_latencies_and_back_to_back() -> None:
    t = FakeTime([3.0, 1.5, 2.5, 1.0])
    assert list(paced_run(t.run, 30.0, 3, warmup=1, sleep=t.sleep, clock=t.clock).latencies_ms) == [
        1.5,
        2.5,
        1.0,
    ]
    b = FakeTime([3.0, 1.0, 2.0])
    assert back_to_back_latencies(b.run, 2, warmup=1, clock=b.clock) == [1.0, 2.0]
    # Back to back: each query right after the last, no sleep at all.
    assert b.issued == [5 * MS, 8 * MS, 9 * MS]
    assert b.sleeps == []


def test_camera_rate_summary_and_wakeup_cost() -> None:
    paced = [2.0 + 0.01 * i for i in range(100)]  # 2.00 .. 2.99
    bb = [1.0] * 50 + [1.2] * 50
    s = camera_rate(30.0, paced, overruns=2, back_to_back_ms=bb)
    # LoadGen's rule: the sample at floor(n q / 100) of the sorted values.
    assert s.p50_ms == pytest.approx(2.50)
    assert s.p90_ms == pytest.approx(2.90)
    assert s.p99_ms == pytest.approx(2.99)
    assert s.headline_ms == s.p90_ms
    assert s.overruns == 2
    assert s.queries == 100
    assert s.wakeup_ms == pytest.approx(2.50 - 1.2)
    d = s.to_dict()
    assert d == {
        "fps": 30.0,
        "queries": 100,
        "p50_ms": 2.5,
        "p90_ms": 2.9,
        "p99_ms": 2.99,
        "overruns": 2,
        "wakeup_ms": 1.3,
        "cold_p50_ms": 2.5,
        "warm_pass_ms": None,
    }
    assert camera_rate(30.0, paced, 0).wakeup_ms is None  # nothing to compare with


def test_with_a_warm_run_the_headline_is_the_warm_one_and_the_wakeup_the_cold_one() -> None:
    cold = [3.0 + 0.01 * i for i in range(100)]
    warm = PacedRun(
        30.0, tuple(1.5 + 0.01 * i for i in range(100)), 1, 3.3, warm_passes=100, warm_pass_ms=1.4
    )
    s = camera_rate(30.0, cold, overruns=0, back_to_back_ms=[1.2] * 10, warm=warm)
    assert (s.p50_ms, s.p90_ms, s.overruns) == (pytest.approx(2.0), pytest.approx(2.4), 1)
    assert s.headline_ms == s.p90_ms
    assert s.cold_p50_ms == pytest.approx(3.5) and s.wakeup_ms == pytest.approx(3.5 - 1.2)
    assert s.warm_pass_ms == 1.4
    # A warm run that ran no pass (too costly for the period) is the cold scenario: it is not used.
    unwarmed = PacedRun(30.0, (1.0,) * 100, 0, 3.3)
    assert camera_rate(30.0, cold, 0, warm=unwarmed).p50_ms == pytest.approx(3.5)


def test_the_budget_gives_the_frame_rate() -> None:
    assert fps_for_budget(1000 / 30) == pytest.approx(30.0)
    assert fps_for_budget(33.0) == pytest.approx(30.30, abs=0.01)
    assert fps_for_budget(0) == 0.0


@pytest.mark.parametrize(
    ("fps", "queries", "warmup"), [(0.0, 5, 1), (-1.0, 5, 1), (30.0, 0, 1), (30.0, 5, -1)]
)
def test_bad_arguments_are_refused(fps: float, queries: int, warmup: int) -> None:
    t = FakeTime([1.0] * 10)
    with pytest.raises(ValueError):
        paced_run(t.run, fps, queries, warmup=warmup, sleep=t.sleep, clock=t.clock)


def test_a_warm_pass_ends_just_before_each_query_and_is_not_timed() -> None:
    # Queries take 2 ms at 100 fps (10 ms slots); the warm pass is a query too (2 ms, untimed).
    t = FakeTime([2.0] * 20)
    run = paced_run(t.run, 100.0, 5, warmup=2, sleep=t.sleep, clock=t.clock, warm=t.warm)
    warmed = t.warmed
    assert run.latencies_ms == (2.0,) * 5 and run.overruns == 0
    # No pass before the first query (nothing to warm yet), then one before each of the six others.
    assert run.warm_passes == 6 and run.warm_pass_ms == 2.0
    t0 = 5 * MS
    queries = [x for x in t.issued if x not in warmed]
    # The first pass's time is not known yet: it starts WARM_MARGIN before its query and runs into it
    # (that query, a warm-up one, goes late, as a frame would wait); from then on each ends WARM_MARGIN
    # before its query, which goes exactly at its slot.
    late = t0 + 10 * MS - WARM_MARGIN_NS + 2 * MS
    assert queries == [t0, late] + [t0 + i * 10 * MS for i in range(2, 7)]
    assert warmed[0] == t0 + 10 * MS - WARM_MARGIN_NS
    for i, at in enumerate(warmed[1:], start=2):
        assert at == t0 + i * 10 * MS - 2 * MS - WARM_MARGIN_NS


def test_the_cold_first_pass_and_the_others_are_timed_apart_to_plan_how_many_fit() -> None:
    costs = WarmCosts()
    period = 30 * MS  # a third is 10 ms
    assert costs.passes(period) == 1 and costs.passes(period, first_guess_ns=11 * MS) == 0
    assert costs.passes(period, first_guess_ns=4 * MS) == 2  # the others taken as the first, unseen
    costs.add([0, 4 * MS])
    assert costs.passes(period) == 2 and costs.lead_ns(2) == 8 * MS
    costs.add([0, 4 * MS, 6 * MS])  # the second pass took 2 ms: three fit (4 + 2 + 2)
    assert costs.passes(period) == WARM_MAX_PASSES == 3 and costs.lead_ns(3) == 8 * MS
    costs.add([0, 3 * MS, 4 * MS, 5 * MS])
    assert costs.passes(period) == 3  # never more than WARM_MAX_PASSES
    assert costs.count == 1 + 2 + 3 and costs.burst_ms == 5.0  # the median burst: 4, 6 and 5 ms
    costs.clear()
    assert costs.passes(period, first_guess_ns=11 * MS) == 0 and costs.count == 6
    with pytest.raises(ValueError):
        costs.add([0])


def test_as_many_passes_as_fit_in_the_duty_run_back_to_back_before_each_query() -> None:
    # 15 ms slots: a third is 5 ms, and a pass takes 1 ms, so after the first burst (one pass,
    # its time not known yet) they run three at a time, the most.
    t = FakeTime([1.0] * 40)
    run = paced_run(t.run, 1e9 / (15 * MS), 4, warmup=1, sleep=t.sleep, clock=t.clock, warm=t.warm)
    warmed = t.warmed
    assert run.latencies_ms == (1.0,) * 4 and run.overruns == 0
    assert run.warm_passes == 1 + 3 * 3 and run.warm_pass_ms == 3.0
    t0 = 5 * MS
    for i in range(2, 5):  # the three passes end WARM_MARGIN before query i, back to back
        due = t0 + i * 15 * MS
        assert warmed[1 + 3 * (i - 2) : 4 + 3 * (i - 2)] == [
            due - (3 - k) * MS - WARM_MARGIN_NS for k in range(3)
        ]


def test_a_warm_pass_that_costs_more_than_its_share_of_the_period_stops() -> None:
    t = FakeTime([1.0, 5.0] + [1.0, 5.0] * 10)  # query 1 ms, pass 5 ms: over its share of a 10 ms slot
    run = paced_run(t.run, 100.0, 5, warmup=1, sleep=t.sleep, clock=t.clock, warm=t.run)
    assert run.warm_passes == 1  # measured once, then judged not worth its CPU
    assert run.warm_pass_ms == 5.0
