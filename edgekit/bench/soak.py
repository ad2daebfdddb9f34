"""A soak's record: per window, the frames, drops, outages and latency of a running pipeline, and what the process holds.

``SoakRecorder(pipeline, window_s=60)`` watches a pipeline (an observer on its loop thread:
one latency appended and a camera's continuity checked per frame) and, on a thread of its
own, closes a window every ``window_s``: the window's frames, drops, outages and reopens,
its latency p50/p99 (``edgekit.core.stats.percentile``, the project's one rule), and a
``edgekit.core.resources`` sample (RSS, the Python heap, open fds, threads) taken as it
closes.  ``coarse_s`` keeps a second, longer window of latencies only (the p99 per 10
minutes of a long soak).  Latencies wait in ``array('d')`` buffers, 8 bytes each, so the
recorder's own memory does not look like a leak.

Each camera's frames are followed for continuity: a gap of more than ``gap_s`` between two
of its frames is an outage, counted (its source's outage counter went up meanwhile) or not
(a stall nobody noticed).  Between its frames closer than that, the capture thread read the
``index`` difference (the slot's drops included) while the camera, at its ``rates`` frame
rate, sent the time between the captures' worth: a running balance of the two, never above
0 (a backlog read in a burst after a reopen is late frames, not extra ones), falls by one
for each frame the camera sent and the pipeline never captured, and a late frame's dip comes
back with the frame after it.  ``CameraTrack.lost`` is how far it fell, banked at each gap.
The last frame before a gap has no frame after it to tell late from lost: what its interval
took from the balance is counted apart (``CameraTrack.at_edges``), with the outage that
followed, not as a frame lost while the camera ran.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from edgekit.core import resources
from edgekit.core.stats import percentile
from edgekit.pipeline.sinks import sink

if TYPE_CHECKING:
    from edgekit.pipeline import Pipeline
    from edgekit.pipeline.records import FrameRecord

#: A camera's frames this far apart (s) are an outage, not jitter.
GAP_S = 1.0


@dataclass
class CameraTrack:
    """One camera's continuity: its first and last frame (index and capture time) and its gaps."""

    first_index: int = -1
    last_index: int = -1
    first_ns: int = 0
    last_ns: int = 0
    gaps: int = 0  # gaps of more than gap_s during which its source counted an outage
    gap_s: float = 0.0  # their length, s
    uncounted_gaps: int = 0  # gaps with no outage counted: a stall nobody noticed
    uncounted_gap_s: float = 0.0
    outages_seen: int = 0  # the source's outage counter at the last gap (or the first frame)
    banked: int = 0  # frames lost before the last gap
    balance: float = 0.0  # frames read less frames the camera sent since the last gap (at most 0)
    before_last: float = 0.0  # the balance before the last frame's interval
    at_edges: int = 0  # frames short in the last interval before a gap: late or lost as it went away

    @property
    def lost(self) -> int:
        """Frames the camera sent outside its gaps that its capture thread never read (at its rate)."""
        return self.banked + max(0, round(-self.balance))

    @property
    def captured(self) -> int:
        """Frames its capture thread read from the first labelled frame to the last (dropped ones included)."""
        return self.last_index - self.first_index + 1 if self.first_index >= 0 else 0

    @property
    def span_s(self) -> float:
        return (self.last_ns - self.first_ns) / 1e9


@dataclass(frozen=True)
class Window:
    """One window of the soak: counts are this window's, the resources are as it closed."""

    index: int
    start_s: float  # since the recorder started
    end_s: float
    frames: int
    dropped: int
    outages: int
    reopens: int
    p50_ms: float
    p99_ms: float
    camera_frames: dict[str, int]
    resources: resources.Resources

    @property
    def fps(self) -> float:
        span = self.end_s - self.start_s
        return self.frames / span if span > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["resources"] = self.resources.to_dict()
        d["fps"] = round(self.fps, 2)
        return d


@dataclass(frozen=True)
class Coarse:
    """A longer window's latency only: frames and p50/p99."""

    start_s: float
    end_s: float
    frames: int
    p50_ms: float
    p99_ms: float


@dataclass
class _Buffer:
    start_s: float = 0.0
    latencies: array[float] = field(default_factory=lambda: array("d"))


def _pcts(values: array[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return percentile(ordered, 50.0), percentile(ordered, 99.0)


class SoakRecorder:
    """Windows of a running pipeline; ``start()`` before its first frame, ``stop()`` before it closes."""

    def __init__(
        self,
        pipeline: Pipeline,
        window_s: float = 60.0,
        coarse_s: float | None = None,
        gap_s: float = GAP_S,
        rates: Mapping[str, float | None] | None = None,
    ) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        # Its counters and sources, not the pipeline: a recorder kept after the run must not
        # keep the pipeline's telemetry client (and its sockets) alive with it.
        self._counters = pipeline.counters
        self._sources = pipeline.sources
        self.window_s = window_s
        self.coarse_s = coarse_s
        self.gap_ns = round(gap_s * 1e9)
        #: Each camera's frame rate, frames per ns (0: unpaced, nothing expected).
        self._per_ns = {n: ((rates or {}).get(n) or 0.0) / 1e9 for n in pipeline.sources}
        self.windows: list[Window] = []
        self.coarse: list[Coarse] = []
        self.tracks: dict[str, CameraTrack] = {name: CameraTrack() for name in pipeline.sources}
        self.started: resources.Resources | None = None
        self._lock = threading.Lock()
        self._fine = _Buffer()
        self._wide = _Buffer()
        self._camera_frames: dict[str, int] = dict.fromkeys(pipeline.sources, 0)
        self._last_counts = (0, 0, 0, 0)  # frames, dropped, outages, reopens at the last window's end
        self._t0 = 0.0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edgekit-soak", daemon=True)
        pipeline.add_sink(sink("soak", lambda result: self.observe(result.record)))  # inline: counts

    # -- on the frame loop's thread ---------------------------------------------------------

    def observe(self, record: FrameRecord) -> None:
        track = self.tracks[record.camera]
        if track.first_index < 0:
            track.first_index, track.first_ns = record.index, record.captured_ns
            track.outages_seen = self._outages(record.camera)
        elif record.captured_ns - track.last_ns > self.gap_ns:
            gap = (record.captured_ns - track.last_ns) / 1e9
            outages = self._outages(record.camera)
            if outages > track.outages_seen:
                track.gaps += 1
                track.gap_s += gap
            else:
                track.uncounted_gaps += 1
                track.uncounted_gap_s += gap
            track.outages_seen = outages
            kept = round(-track.before_last)  # balances are never above 0
            track.at_edges += max(0, round(-track.balance) - kept)
            track.banked += kept
            track.balance = track.before_last = 0.0  # the reopen's backlog must not pay for it
        else:
            track.before_last = track.balance
            sent = (record.captured_ns - track.last_ns) * self._per_ns[record.camera]
            track.balance = min(0.0, track.balance + (record.index - track.last_index) - sent)
        track.last_index, track.last_ns = record.index, record.captured_ns
        with self._lock:
            self._fine.latencies.append(record.latency_ms)
            if self.coarse_s is not None:
                self._wide.latencies.append(record.latency_ms)
            self._camera_frames[record.camera] += 1

    def _outages(self, camera: str) -> int:
        return self._sources[camera].counters.outages

    # -- the recorder's thread ----------------------------------------------------------------

    def start(self) -> SoakRecorder:
        self.started = resources.sample()
        self._t0 = self.started.at
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the last (partial) window; call it while the pipeline still runs (again: nothing)."""
        if self._halt.is_set():
            return
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join()  # it closes the last window itself: its own thread still counted
        else:
            self._close_window(final=True)

    def _now_s(self) -> float:
        return time.monotonic() - self._t0

    def _run(self) -> None:
        next_end = self.window_s
        next_coarse = self.coarse_s
        while not self._halt.wait(max(0.0, next_end - self._now_s())):
            self._close_window()
            next_end += self.window_s
            if next_coarse is not None and self._now_s() >= next_coarse - 1e-3:
                self._close_coarse()
                next_coarse += self.coarse_s or 0.0
        self._close_window(final=True)

    def _close_coarse(self) -> None:
        now = self._now_s()
        with self._lock:
            buf, self._wide = self._wide, _Buffer(now)
        p50, p99 = _pcts(buf.latencies)
        self.coarse.append(Coarse(buf.start_s, now, len(buf.latencies), p50, p99))

    def _close_window(self, final: bool = False) -> None:
        now = self._now_s()
        with self._lock:
            buf, self._fine = self._fine, _Buffer(now)
            cams, self._camera_frames = self._camera_frames, dict.fromkeys(self._camera_frames, 0)
        if final and not buf.latencies and self.windows:
            return  # stopped just after a window closed: nothing new to say
        c = self._counters
        counts = (c.frames, c.dropped, c.source_outages, c.source_reopens)
        last, self._last_counts = self._last_counts, counts
        p50, p99 = _pcts(buf.latencies)
        del buf  # before the sample: the window's latencies are not the process's growth
        self.windows.append(
            Window(
                index=len(self.windows),
                start_s=round(self.windows[-1].end_s if self.windows else 0.0, 3),
                end_s=round(now, 3),
                frames=counts[0] - last[0],
                dropped=counts[1] - last[1],
                outages=counts[2] - last[2],
                reopens=counts[3] - last[3],
                p50_ms=p50,
                p99_ms=p99,
                camera_frames=cams,
                resources=resources.sample(),
            )
        )
        if final and self.coarse_s is not None and self._wide.latencies:
            self._close_coarse()
