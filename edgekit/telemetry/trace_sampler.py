"""Which frames' traces a device keeps, decided after each frame finished (tail-based, on the device).

Kept: every frame that missed its budget, the slowest ``slowest`` frames of each window, and a
``ratio`` share of the rest (by trace id, as OpenTelemetry's ``TraceIdRatioBased``).  Frames kept
for a miss or the ratio are capped at ``max_per_s`` a second (a token bucket on the frames'
capture clock, a second's worth of burst): a device whose every frame misses still spends a
bounded share of its CPU on traces; those past the cap are counted (``over_cap``), not kept.
A window's slowest are kept whatever the cap: ``slowest`` a window is its own bound.

A window closes when a frame arrives ``window_s`` after it opened, or when telemetry closes
its own (``take``): then its slowest frames are the ones the telemetry window names.

The same rules keep a served request's trace (``edgekit serve --trace``): anything with a
capture time, a latency and a met flag is offered (``Offered``), with the trace id it already has
(a caller's ``traceparent``) and whether its caller sampled it (then kept as ``sampled``, under
the cap).

Pure bookkeeping, no OpenTelemetry: a frame costs a comparison or two and a lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from edgekit.protocol.messages import MAX_WINDOW_TRACES
from edgekit.telemetry.trace_ids import frame_trace_id, ratio_keeps, trace_hex


class Offered(Protocol):
    """What the sampler reads of a frame (``FrameRecord``) or a served request."""

    @property
    def index(self) -> int: ...
    @property
    def captured_at(self) -> float: ...  # wall clock (s) when it began
    @property
    def latency_ms(self) -> float: ...
    @property
    def met(self) -> bool: ...  # within its budget (a frame), answered ok in time (a request)
    @property
    def camera(self) -> str: ...


R = TypeVar("R", bound=Offered)


@dataclass(frozen=True, slots=True)
class Kept(Generic[R]):
    """A frame whose trace is exported, and why: ``missed``, ``slowest`` (of its window) or ``sampled``."""

    record: R
    trace_id: int
    reason: str

    def ref(self) -> dict[str, Any]:
        """What a telemetry window says of it (``edgekit.protocol``'s ``TraceRef``)."""
        out: dict[str, Any] = {
            "trace_id": trace_hex(self.trace_id),
            "latency_ms": round(self.record.latency_ms, 3),
            "index": self.record.index,
        }
        if self.record.camera:
            out["camera"] = self.record.camera
        return out


@dataclass
class _Window(Generic[R]):
    start: float  # the first frame's capture time (wall clock, s)
    worst: list[tuple[float, int, R, int, bool]] = field(default_factory=list)
    # (latency_ms, order, record, trace_id, kept already); at most ``slowest`` entries


@dataclass
class SamplerCounts:
    """Frames seen, and kept by reason; ``over_cap``: misses and sampled frames the cap turned away."""

    frames: int = 0
    missed: int = 0
    slowest: int = 0
    sampled: int = 0
    over_cap: int = 0

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("frames", "missed", "slowest", "sampled", "over_cap")}


class TailSampler(Generic[R]):
    """Decides, frame by frame after the fact, which traces to keep; thread-safe (``offer`` vs ``take``).

    ``TailSampler[FrameRecord]`` for a pipeline's frames (trace ids derived from the frames),
    ``TailSampler[RequestRecord]`` for served requests (trace ids given to ``offer``).
    """

    def __init__(
        self,
        session: str,
        *,
        ratio: float = 0.01,
        slowest: int = 1,
        window_s: float = 5.0,
        max_per_s: float = 10.0,
    ) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"a sampling ratio is between 0 and 1, got {ratio}")
        if not 0 <= slowest <= MAX_WINDOW_TRACES:
            raise ValueError(f"slowest per window is 0 to {MAX_WINDOW_TRACES}, got {slowest}")
        if not window_s > 0 or not max_per_s > 0:
            raise ValueError("window_s and max_per_s must be positive")
        self.session = session
        self.ratio = ratio
        self.slowest = slowest
        self.window_s = window_s
        self.max_per_s = max_per_s
        self.counts = SamplerCounts()
        self._lock = threading.Lock()
        self._window: _Window[R] | None = None
        self._driven = False  # telemetry closes the windows (``take``), not the frames' clock
        self._tokens = max_per_s  # a second's worth of burst
        self._last_at: float | None = None
        self._order = 0

    def trace_id(self, record: Offered) -> int:
        return frame_trace_id(self.session, record.camera, record.index)

    def offer(self, record: R, trace_id: int | None = None, *, wanted: bool = False) -> list[Kept[R]]:
        """The traces to export now: this frame's if kept, and a closed window's slowest not kept yet.

        ``trace_id``: the record's own (a request's), else derived (a frame's); ``wanted``: its
        caller sampled it (the ``traceparent``'s flag), so it is kept as ``sampled``, under the cap.
        """
        out: list[Kept[R]] = []
        tid = self.trace_id(record) if trace_id is None else trace_id
        with self._lock:
            w = self._window
            if w is None:
                w = self._window = _Window(record.captured_at)
            elif not self._driven and record.captured_at >= w.start + self.window_s:
                out.extend(self._close(w))
                w = self._window = _Window(record.captured_at)
            self.counts.frames += 1
            reason = (
                "missed" if not record.met else ("sampled" if wanted or ratio_keeps(tid, self.ratio) else "")
            )
            kept = bool(reason) and self._token(record.captured_at)
            if reason and not kept:
                self.counts.over_cap += 1
            if kept:
                setattr(self.counts, reason, getattr(self.counts, reason) + 1)
                out.append(Kept(record, tid, reason))
            self._consider(w, record, tid, kept)
        return out

    def take(self) -> tuple[list[Kept[R]], list[dict[str, Any]]]:
        """Close the window now (telemetry's window closed): its slowest to export, and all its slowest's refs.

        From the first call on, windows close only here: the telemetry window and the traces it
        names cover the same frames.
        """
        with self._lock:
            self._driven = True
            w, self._window = self._window, None
            if w is None:
                return [], []
            refs = [
                Kept(rec, tid, "slowest").ref()
                for _, _, rec, tid, _ in sorted(w.worst, key=lambda e: e[:2], reverse=True)
            ]
            return self._close(w), refs

    def flush(self) -> list[Kept[R]]:
        """Close the window at the end of a run: its slowest not kept yet."""
        with self._lock:
            w, self._window = self._window, None
            return self._close(w) if w is not None else []

    def expire(self, now: float) -> list[Kept[R]]:
        """Close the window if ``window_s`` has passed by ``now`` (wall clock) with nothing offered since.

        For a server gone quiet after a slow request: its window's slowest is exported within a
        window, not when the next request comes.  A telemetry-driven sampler's windows stay open.
        """
        with self._lock:
            w = self._window
            if w is None or self._driven or now < w.start + self.window_s:
                return []
            self._window = None
            return self._close(w)

    # -- under the lock ---------------------------------------------------------------------

    def _token(self, at: float) -> bool:
        if self._last_at is not None and at > self._last_at:
            self._tokens = min(self.max_per_s, self._tokens + (at - self._last_at) * self.max_per_s)
        self._last_at = at if self._last_at is None else max(self._last_at, at)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def _consider(self, w: _Window[R], record: R, tid: int, kept: bool) -> None:
        if self.slowest == 0:
            return
        self._order += 1  # ties: the earlier frame stays
        entry = (record.latency_ms, -self._order, record, tid, kept)
        if len(w.worst) < self.slowest:
            w.worst.append(entry)
            return
        low = min(range(len(w.worst)), key=lambda i: w.worst[i][:2])
        if entry[:2] > w.worst[low][:2]:
            w.worst[low] = entry

    def _close(self, w: _Window[R]) -> list[Kept[R]]:
        out = [Kept(rec, tid, "slowest") for _, _, rec, tid, kept in w.worst if not kept]
        self.counts.slowest += len(out)
        return out
