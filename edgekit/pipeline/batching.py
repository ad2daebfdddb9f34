"""Frames of many cameras inferred as one batch: how big a batch may be, which frames join it, and when to stop waiting.

Cameras of one device often deliver at the same moments (same rate, started together).
Their frames are then waiting together, and inferring them as one batch costs less than one
after another: on the reference classifier here, OpenVINO int8 takes 2.4 ms for one frame
and 6.2 ms for four (1.56 ms a frame).  A batch needs a session whose artifact has a free
batch dimension (``Session.batchable``; the build makes its ONNX and OpenVINO artifacts so);
without one, frames go one at a time, earliest deadline first, under the same rule.

**The deadline rule.**  A frame's deadline is its capture time plus the budget, whatever
batch it joins.  The loop takes the waiting frame with the earliest deadline, then every
other waiting frame (earliest first) up to the largest batch.  It waits for a frame that is
not there yet only when a camera's next frame is predicted within the window (its median
capture interval after its last frame) *and* the batch, one frame larger, would still end
before the earliest deadline in it, with a margin.

**The largest batch** is measured when the pipeline starts: each batch size's inference
time on this device, plus each frame's own preprocessing and postprocessing.  A frame that
arrives just as a batch starts waits for that batch and then runs in the next, so a size is
allowed only while two batches of it fit the budget.

Cameras may have budgets of their own: the earliest deadline is then the earliest capture
time plus budget in the batch, and the tightest budget sets the window and the largest batch.

**The window** is a tenth of the budget (3.3 ms at 30 fps): long enough to catch cameras
that deliver together but a little apart (their capture threads take turns), short enough
that cameras out of phase are not held back waiting for each other.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgekit.core.stats import median
from edgekit.errors import EdgekitError, PipelineError

if TYPE_CHECKING:
    from edgekit.backends.base import Session
    from edgekit.pipeline.cameras import CameraGroup
    from edgekit.pipeline.capture import Frame
    from edgekit.pipeline.levels import Level

log = logging.getLogger(__name__)

#: The largest batch ``auto`` considers (and the most sessions a pipeline compiles for it).
MAX_BATCH = 8
#: How long the loop may hold a batch open for a frame about to arrive, as a share of the budget.
WINDOW_SHARE = 0.1
#: Kept free before the earliest deadline in a batch when deciding to wait for one more frame.
MARGIN_NS = 1_000_000
# A camera's predicted next frame may come this much after the prediction and still be waited for.
_LATE_NS = 500_000


def parse_batch(batch: str | int) -> int | None:
    """``auto`` -> None (measured), ``off`` -> 1, a number n >= 1 -> n (the most frames a batch holds)."""
    if batch == "auto":
        return None
    if batch == "off":
        return 1
    try:
        n = int(batch)
    except (TypeError, ValueError):
        n = 0
    if isinstance(batch, bool) or n < 1 or str(n) != str(batch).strip():
        raise PipelineError(
            f"batch must be auto, off or a number of frames >= 1, got {batch!r}", "e.g. --batch auto"
        )
    return n


@dataclass
class Arrivals:
    """Each camera's last capture and its recent capture intervals: when its next frame is due."""

    last_ns: dict[str, int] = field(default_factory=dict)
    gaps: dict[str, deque[int]] = field(default_factory=dict)

    def saw(self, frame: Frame) -> None:
        last = self.last_ns.get(frame.camera)
        if last is not None and frame.captured_ns > last:
            self.gaps.setdefault(frame.camera, deque(maxlen=9)).append(frame.captured_ns - last)
        self.last_ns[frame.camera] = frame.captured_ns

    def next_due(self, besides: set[str]) -> int | None:
        """The earliest predicted capture of a camera not in ``besides`` (None: none predictable)."""
        due = [
            self.last_ns[cam] + int(median(gaps))
            for cam, gaps in self.gaps.items()
            if cam not in besides and gaps
        ]
        return min(due) if due else None


class Batcher:
    """The batch sessions of a pipeline's primary level, their measured times, and the gathering rule."""

    def __init__(self, level: Level, budgets_ms: Mapping[str, float], most: int | None) -> None:
        self.level = level
        #: Each camera's budget; the tightest sets the window and how large a batch may grow.
        self.budgets_ns = {n: round(ms * 1e6) for n, ms in budgets_ms.items()}
        self.budget_ns = min(self.budgets_ns.values())
        self.window_ns = round(self.budget_ns * WINDOW_SHARE)
        cameras = len(budgets_ms)
        self.sessions: dict[int, Session] = {}
        self.infer_ns: dict[int, float] = {}
        self.frame_ns = 0.0  # one frame's preprocessing and postprocessing (measured with the sizes)
        self.arrivals = Arrivals()
        self.inferences = 0
        self.frames = 0
        cap = min(cameras, MAX_BATCH if most is None else most)
        self.max = 1
        session = level.session
        if cap < 2:
            return
        if not session.batchable:
            log.info(
                "batching: %s has a fixed batch of one (%s): frames go one at a time, earliest deadline first",
                level.name,
                session.artifact.name,
            )
            return
        self._measure(cap, explicit=most is not None)

    def _measure(self, cap: int, explicit: bool) -> None:
        import numpy as np

        level = self.level
        black = np.zeros((480, 640, 3), np.uint8)
        x = level.prep(black)
        t0 = time.perf_counter_ns()
        for _ in range(3):
            x = level.prep(black)
        self.frame_ns = (time.perf_counter_ns() - t0) / 3
        self.buffer = np.empty((cap, *x.shape[1:]), x.dtype)
        self.infer_ns[1] = _median_ns(level.session, x[:1])
        measured = [f"1: {self.infer_ns[1] / 1e6:.1f}"]
        for k in range(2, cap + 1):
            try:
                sess = level.session.batched(k)
            except EdgekitError as err:  # a runtime that cannot reshape this graph: stop growing
                log.warning("batching: %s cannot take %d frames at once (%s)", level.name, k, err)
                break
            try:
                self.infer_ns[k] = _median_ns(sess, self.buffer[:k])
            except EdgekitError as err:  # reshaped, but a batch does not run: one at a time it is
                sess.close()
                log.warning("batching: %s does not run %d frames at once (%s)", level.name, k, err)
                break
            measured.append(f"{k}: {self.infer_ns[k] / 1e6:.1f}")
            # Two batches of k must fit the budget: a frame arriving as one starts waits for it.
            if not explicit and 2 * self.estimate_ns(k) > self.budget_ns:
                sess.close()
                del self.infer_ns[k]
                break
            self.sessions[k] = sess
            self.max = k
        log.info(
            "batching: %s takes up to %d frames at once (inference ms by batch size %s; window %.1f ms)",
            level.name,
            self.max,
            ", ".join(measured),
            self.window_ns / 1e6,
        )

    def estimate_ns(self, k: int) -> float:
        """A batch of ``k``'s inference plus each of its frames' preprocessing and postprocessing."""
        return self.infer_ns.get(k, self.infer_ns[1] * k) + k * self.frame_ns

    def may_wait(self, batch: list[Frame], opened_ns: int, now: int) -> int | None:
        """Until when (ns) the loop may wait for one more frame to join ``batch`` (opened at
        ``opened_ns``); None: run it now."""
        if len(batch) >= self.max:
            return None
        due = self.arrivals.next_due({f.camera for f in batch})
        if due is None or due + _LATE_NS <= now:  # none predicted, or overdue: not coming soon
            return None
        earliest = min(f.captured_ns + self.budgets_ns[f.camera] for f in batch)
        latest_start = earliest - MARGIN_NS - self.estimate_ns(len(batch) + 1)
        limit = min(latest_start, opened_ns + self.window_ns)
        if due > limit:
            return None
        return int(min(due + _LATE_NS, limit))

    def gather(self, group: CameraGroup, first: Frame) -> list[Frame]:
        """``first`` (the earliest waiting frame) and the frames that join its batch."""
        # The earliest frame, then every other waiting one, earliest first; a frame predicted
        # within the window joins while the batch would still end before its earliest deadline.
        batch = [first]
        self.arrivals.saw(first)
        opened = time.perf_counter_ns()
        while len(batch) < self.max:
            frame = group.take(timeout=0)
            if frame is None:
                until = self.may_wait(batch, opened, time.perf_counter_ns())
                if until is None:
                    break
                frame = group.take(timeout=max(0.0, (until - time.perf_counter_ns()) / 1e9))
                if frame is None:
                    break
            self.arrivals.saw(frame)
            batch.append(frame)
        return batch

    def run(self, frames: list[Frame]) -> tuple[list[Any], int, int, int]:
        """Prepare every frame into the batch buffer and run them: (outputs, t0, t1, t2) in ns."""
        level, k = self.level, len(frames)
        t0 = time.perf_counter_ns()
        for i, f in enumerate(frames):
            self.buffer[i] = level.prep(f.image)[0]
        t1 = time.perf_counter_ns()
        ys = self.sessions[k].run(self.buffer[:k])
        t2 = time.perf_counter_ns()
        self.inferences += 1
        self.frames += k
        return ys, t0, t1, t2

    def close(self) -> None:
        for sess in self.sessions.values():
            sess.close()
        self.sessions.clear()


def batch_summary(batcher: Batcher | None, frames: int) -> dict[str, float]:
    """The largest batch allowed and the mean frames per inference over ``frames`` frames."""
    if batcher is None or not batcher.inferences:
        return {"max": batcher.max if batcher else 1, "mean": 1.0}
    alone = max(frames - batcher.frames, 0)  # frames that went alone (nothing else waiting)
    return {"max": batcher.max, "mean": round(frames / (batcher.inferences + alone), 3)}


def _median_ns(session: Session, x: Any, runs: int = 5) -> float:
    session.run(x)  # the first run of a session allocates: not its speed
    times = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        session.run(x)
        times.append(time.perf_counter_ns() - t0)
    return median(times)
