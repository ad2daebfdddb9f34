"""Keep the model warm between frames: untimed passes shortly before the next frame is due.

At 30 fps a model that runs in 2 ms sits idle for 31 ms between frames.  In that gap the
runtime's threads park, the cores idle and other work takes their caches, so the frame that
comes next pays for a cold start: measured on a 2-core x86_64 VM (reference bundle,
openvino-int8-full, bare ``session.run``), 1.95 ms back to back but 3.6 ms paced at 30 fps
with the same thread count.  It is not the thread pool alone: one thread paces as badly
(2.7 -> 3.8 ms), and neither spinning the loop thread before the frame nor holding
``/dev/cpu_dma_latency`` at 0 changed it.  Running the model once, untimed, ~0.5 ms before
the frame is due brought it to 2.2 ms: what is cold is the model's working set, and only
touching it warms it.  One pass does not undo the whole gap: with a new frame's
preprocessing between the last pass and the frame, the frame's inference took 1.75x its
back-to-back time after one pass, 1.5x after two, 1.1x after three
(``edgekit.device.pacing.WARM_MAX_PASSES``).

So the loop predicts when the next frame comes (the median of the recent capture
intervals: a camera's own rate, whatever it claims) and, when the gap is long enough,
runs *warm passes* back to back ``lead`` before it: the last frame through preprocessing
and the session, then the session again on the same input, results thrown away.  As many
passes run as fit in a third of the frame period, at most three (``pacing.WarmCosts``; the
first, cold one costs more than the others, so each is timed apart): at most a third more
CPU busy at the camera's rate, and none when the device is busy anyway.  Measured in the
loop (same VM, 30 fps): inference 3.2-3.6 ms p50 after one pass, 2.4-2.6 ms after three,
below the back-to-back 2.66 ms of the same sitting.  ``lead`` is the passes' own recent time
plus a margin that grows with the arrival jitter, so the last pass ends just before the
frame.  A frame that arrives while the passes run waits for them: counted as
``warm_late``, and the margin grows.  ``auto`` stops while not even one pass fits in the
third; having stopped, it tries one pass again every ``RETRY_FRAMES`` frames: a pass timed
while the device was busy (at start-up, or by another process) must not turn warming off
for the rest of the run.

It reads no clock: the tests drive ``Warmer`` with frame times they make.
``edgekit.device.pacing`` holds the numbers and the rule for how many passes, since
``edgekit bench`` and the first-load measurement time the same schedule
(``paced_run(..., warm=...)``).
"""

from __future__ import annotations

from collections import deque

from edgekit.core.stats import median
from edgekit.device.pacing import WARM_MARGIN_NS as MIN_MARGIN_NS
from edgekit.device.pacing import WarmCosts

#: Capture intervals the frame rate is taken over.
HISTORY = 16
#: Frames between two tries once ``auto`` has stopped (5 s at 30 fps: one pass in 150 frames).
RETRY_FRAMES = 150


class Warmer:
    """When to run warm passes, and how many: fed each frame's capture time and the passes' durations.

    ``mode``: ``"auto"`` (warm while it pays and fits, see the module docstring), ``"on"``
    (warm whenever the gap allows a pass at all, at least one) or ``"off"``.
    """

    def __init__(self, mode: str = "auto") -> None:
        if mode not in ("auto", "on", "off"):
            raise ValueError(f"warm mode must be auto, on or off, got {mode!r}")
        self.mode = mode
        self._arrivals: deque[int] = deque(maxlen=HISTORY + 1)
        self._costs = WarmCosts()
        self._warmed_for: int | None = None  # the capture time of the frame the last pass warmed after
        self._frames_since_pass = 0
        self._retrying = False  # the pass planned is a try after auto stopped: judged on its own
        self.burst = 1  # how many passes back to back the last plan was for
        self._extra_margin_ns = 0
        self._pass_start_ns = 0
        self._pass_end_ns = 0
        self.late = 0

    # -- what the loop tells it ----------------------------------------------------------------

    def arrived(self, captured_ns: int) -> None:
        """A frame captured at ``captured_ns`` was taken; a frame captured during a warm pass was late."""
        if self._pass_start_ns < captured_ns < self._pass_end_ns:
            self.late += 1
            # The pass ran into the frame: keep a wider gap from now on (at most a quarter period).
            self._extra_margin_ns = min(self._extra_margin_ns + 200_000, self.period_ns() // 4)
        if not self._arrivals or captured_ns > self._arrivals[-1]:
            self._arrivals.append(captured_ns)
            self._frames_since_pass += 1

    def ran(self, *bounds: int) -> None:
        """Warm passes ran back to back: ``bounds`` are their start and each one's end, in ns."""
        if self._retrying:
            self._costs.clear()  # what the device does now, not what stopped it
            self._retrying = False
        self._costs.add(bounds)
        self._pass_start_ns = bounds[0]
        self._pass_end_ns = bounds[-1]
        self._warmed_for = self._arrivals[-1] if self._arrivals else None
        self._frames_since_pass = 0

    # -- what it tells the loop ----------------------------------------------------------------

    @property
    def passes(self) -> int:
        """Warm passes run so far."""
        return self._costs.count

    def period_ns(self) -> int:
        """The median capture interval of the recent frames (0 until there are four)."""
        if len(self._arrivals) < 5:
            return 0
        a = list(self._arrivals)
        return int(median(b - c for b, c in zip(a[1:], a[:-1], strict=True)))

    def next_pass_at(self, frame_work_ns: int) -> int | None:
        """When to start the warm passes before the next frame, or None (not now, or not at all).

        How many: ``burst``, set by this call.  ``frame_work_ns``: what the loop spends on a
        frame (its median), so passes are planned only into time the loop would otherwise
        sleep through (fewer of them where all would not fit).
        """
        if self.mode == "off" or not self._arrivals:
            return None
        last = self._arrivals[-1]
        if self._warmed_for == last:
            return None  # one pass per frame interval
        period = self.period_ns()
        if period <= 0:
            return None
        burst = self._costs.passes(period, frame_work_ns)
        if burst == 0:  # not even one pass fits in WARM_MAX_DUTY of the period
            if self.mode == "auto" and self._frames_since_pass < RETRY_FRAMES:
                return None
            self._retrying = self.mode == "auto"
            burst = 1
        margin = max(MIN_MARGIN_NS, 2 * self._jitter_ns(period)) + self._extra_margin_ns
        for n in range(burst, 0, -1):
            start = last + period - self._costs.lead_ns(n, frame_work_ns) - margin
            if start >= last + frame_work_ns:
                self.burst = n
                return start
        return None  # no room: the frame's own work would still be running

    def _jitter_ns(self, period: int) -> int:
        a = list(self._arrivals)
        if len(a) < 5:
            return 0
        return int(median(abs((b - c) - period) for b, c in zip(a[1:], a[:-1], strict=True)))
