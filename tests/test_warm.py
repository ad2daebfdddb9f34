"""Keeping the model warm between frames: when the warm pass is planned, and what it must not change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from skimage import data

import edgekit
from edgekit.device.pacing import WARM_MAX_DUTY as MAX_DUTY
from edgekit.device.pacing import WARM_MAX_PASSES
from edgekit.errors import PipelineError
from edgekit.pipeline.warm import MIN_MARGIN_NS, RETRY_FRAMES, Warmer

MS = 1_000_000
PERIOD = 33 * MS


def fed(warmer: Warmer, frames: int, period: int = PERIOD, jitter: list[int] | None = None) -> int:
    """Frames arrive every ``period`` (plus ``jitter[i]``); returns the last capture time."""
    t = 0
    for i in range(frames):
        t = i * period + (jitter[i] if jitter else 0)
        warmer.arrived(t)
    return t


def test_no_pass_until_the_rate_is_known_then_one_just_before_the_next_frame() -> None:
    w = Warmer("auto")
    assert w.next_pass_at(2 * MS) is None  # nothing seen yet
    last = fed(w, 4)
    assert w.period_ns() == 0 and w.next_pass_at(2 * MS) is None  # three intervals are not a rate
    last = fed(w, 6)
    assert w.period_ns() == PERIOD
    # Before any pass its time is guessed from the frame's work, 2 ms, and so is each pass after it:
    # three fit in a third of 33 ms, and the last ends MIN_MARGIN before the frame.
    assert w.next_pass_at(2 * MS) == last + PERIOD - 3 * 2 * MS - MIN_MARGIN_NS
    assert w.burst == WARM_MAX_PASSES == 3
    # The first pass (the cold one) took 6 ms, the second 3 ms: planned for from now on.
    w.ran(last + 20 * MS, last + 26 * MS, last + 29 * MS)
    assert w.next_pass_at(2 * MS) is None  # one burst per frame interval
    last += PERIOD
    w.arrived(last)
    assert w.next_pass_at(2 * MS) == last + PERIOD - (6 + 3) * MS - MIN_MARGIN_NS
    assert w.burst == 2  # 6 + 3 + 3 ms would not fit in 11
    assert (w.passes, w.late) == (2, 0)


def test_fewer_passes_where_all_would_not_fit_before_the_frame() -> None:
    w = Warmer("on")
    last = fed(w, 6)
    w.ran(last + MS, last + 2 * MS, last + 3 * MS, last + 4 * MS)  # 1 ms a pass: three fit in the duty
    last += PERIOD
    w.arrived(last)
    # The frame's own work takes 30 ms of the 33: room for two passes and the margin, not three.
    start = w.next_pass_at(30 * MS)
    assert w.burst == 2 and start == last + PERIOD - 2 * MS - MIN_MARGIN_NS
    assert w.next_pass_at(31 * MS) == last + PERIOD - MS - MIN_MARGIN_NS and w.burst == 1


def test_auto_warms_only_while_the_pass_fits_in_its_share_of_the_period() -> None:
    fits, costly = round(MAX_DUTY * PERIOD) - MS, round(MAX_DUTY * PERIOD) + MS
    for mode, pass_ns, planned in (("auto", fits, True), ("auto", costly, False), ("on", costly, True)):
        w = Warmer(mode)
        last = fed(w, 6)
        w.ran(last - PERIOD + MS, last - PERIOD + MS + pass_ns)  # a pass in the previous interval
        last += PERIOD
        w.arrived(last)
        assert (w.next_pass_at(MS) is not None) is planned, (mode, pass_ns)


def test_auto_stopped_by_a_costly_pass_tries_again_and_resumes_when_a_pass_fits() -> None:
    fits, costly = round(MAX_DUTY * PERIOD) - MS, round(MAX_DUTY * PERIOD) + MS
    w = Warmer("auto")
    last = fed(w, 6)
    w.ran(last + MS, last + MS + costly)  # timed while the device was busy

    def next_frame() -> int | None:
        nonlocal last
        last += PERIOD
        w.arrived(last)
        return w.next_pass_at(MS)

    skipped = 0
    while (at := next_frame()) is None:
        skipped += 1
        assert skipped < 10 * RETRY_FRAMES, "auto never tried again"
    assert skipped == RETRY_FRAMES - 1  # one try in RETRY_FRAMES frames
    w.ran(at, at + costly)  # still too costly: stopped again for as long
    assert sum(next_frame() is None for _ in range(RETRY_FRAMES - 1)) == RETRY_FRAMES - 1
    at = next_frame()
    assert at is not None
    w.ran(at, at + fits)  # the device is quiet now: judged on this pass, not on the costly ones
    for _ in range(5):  # warmed every frame again
        at = next_frame()
        assert at is not None
        w.ran(at, at + fits)
    assert w.passes == 3 + 5


def test_off_never_warms_and_no_room_means_no_pass() -> None:
    w = Warmer("off")
    fed(w, 10)
    assert w.next_pass_at(MS) is None
    w = Warmer("on")
    fed(w, 10)
    # The frame's own work fills the period: a pass would start before the frame is even done.
    assert w.next_pass_at(PERIOD - MS) is None
    with pytest.raises(ValueError, match="auto, on or off"):
        Warmer("always")


def test_a_frame_that_arrives_during_a_pass_is_late_and_widens_the_margin() -> None:
    w = Warmer("on")
    last = fed(w, 6)
    before = w.next_pass_at(2 * MS)
    assert before is not None
    w.ran(before, before + 2 * MS)
    w.arrived(before + MS)  # captured while the pass ran
    assert w.late == 1
    planned = w.next_pass_at(2 * MS)
    assert planned is not None
    # The next pass starts further ahead of its frame than the first did.
    assert (before + MS + w.period_ns()) - planned > (last + PERIOD) - before


def test_jittery_arrivals_keep_a_wider_margin() -> None:
    steady, jittery = Warmer("on"), Warmer("on")
    last_s = fed(steady, 9)
    last_j = fed(jittery, 9, jitter=[0, 900_000, -900_000, 800_000, -800_000, 900_000, -900_000, 800_000, 0])
    lead_s = last_s + steady.period_ns() - (steady.next_pass_at(MS) or 0)
    lead_j = last_j + jittery.period_ns() - (jittery.next_pass_at(MS) or 0)
    assert lead_j > lead_s


# -- in the pipeline -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(x86_bundle: tuple[Path, dict[str, Any]]) -> Any:
    with edgekit.load(x86_bundle[0], device="x86_64-cpu") as m:
        yield m


@pytest.mark.slow
def test_warm_passes_run_on_a_camera_and_change_no_label(model: Any, tmp_path: Path) -> None:
    # A folder replayed at 20 fps like a camera (block: every frame labelled, none dropped),
    # warm on and off: the same labels for every frame; the passes are counted.
    for i, image in enumerate((data.chelsea(), data.astronaut(), data.coffee(), data.rocket()) * 3):
        cv2.imwrite(str(tmp_path / f"{i:02d}.png"), cv2.resize(image[..., ::-1], (640, 480)))
    runs = {}
    for warm in ("on", "off"):
        with edgekit.Pipeline(model, str(tmp_path), realtime=True, fps=20, warm=warm) as p:
            runs[warm] = [(r.record.index, r.top.id if r.top else None, r.labels) for r in p]
            runs[warm + " counters"] = p.counters
    assert runs["on"] == runs["off"] and len(runs["on"]) == 12
    assert runs["off counters"].warm_passes == 0
    # Every frame after the rate is known (five arrivals) is preceded by one pass.
    assert runs["on counters"].warm_passes >= 12 - 6


@pytest.mark.slow
def test_a_file_read_as_fast_as_it_goes_is_never_warmed(model: Any, tmp_path: Path) -> None:
    for i in range(8):
        cv2.imwrite(str(tmp_path / f"{i}.png"), np.full((48, 64, 3), 30 * i, np.uint8))
    with edgekit.Pipeline(model, str(tmp_path), warm="on") as p:
        assert len(list(p)) == 8
    assert p.counters.warm_passes == 0
    with pytest.raises(PipelineError, match="auto, on or off"):
        edgekit.Pipeline(model, str(tmp_path), warm="sometimes")
