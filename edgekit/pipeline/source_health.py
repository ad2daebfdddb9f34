"""``HealthWatch``: how each camera of a running pipeline keeps delivering, readable from any thread.

The sources count their own outages, reopens, stalls, corrupt frames and the seconds without
frames of the outages that ended (``SourceCounters``); the frame loop adds what only it sees,
each camera's size changes and when its last frame came.  ``health()`` puts them together as
one ``SourceHealth`` per camera, the current outage's seconds included, at the moment it is
asked: a stalled camera sends no frames, so the publisher's timer asks, not the frame loop.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from edgekit.core.tally import SourceHealth
from edgekit.pipeline.sources import Source


class HealthWatch:
    """Each camera's size changes and last frame time, noted by the frame loop; ``health()`` from any thread."""

    def __init__(self, sources: Mapping[str, Source]) -> None:
        self.sources = sources
        self._size_changes = dict.fromkeys(sources, 0)
        # Before its first frame a camera counts from the start of the run (set by ``start``).
        self._last_ns = dict.fromkeys(sources, 0)
        self._started_ns = 0
        # The seconds without frames last reported: an outage that ends between reading the source's
        # ended outages and its current one reads short for a moment, and the figure must not go down.
        self._down_s = dict.fromkeys(sources, 0.0)

    def start(self, now_ns: int) -> None:
        self._started_ns = now_ns
        for name in self._last_ns:
            self._last_ns[name] = now_ns

    def frame(self, camera: str, captured_ns: int, size_changed: bool) -> None:
        """The loop took a frame of ``camera`` (captured at ``captured_ns``, perf_counter_ns)."""
        if captured_ns > self._last_ns[camera]:
            self._last_ns[camera] = captured_ns
        if size_changed:
            self._size_changes[camera] += 1

    def health(self, now_ns: int | None = None) -> dict[str, SourceHealth]:
        """Each camera's health now (a single source's is named ``""``)."""
        now = time.perf_counter_ns() if now_ns is None else now_ns
        out: dict[str, SourceHealth] = {}
        for name, source in self.sources.items():
            c = source.counters
            since = max(0.0, (now - self._last_ns[name]) / 1e9) if self._started_ns else 0.0
            down = self._down_s[name] = max(self._down_s[name], c.down_s + source.down_now_s())
            out[name] = SourceHealth(
                outages=c.outages,
                reopens=c.reopens,
                stalls=c.stalls,
                corrupt=c.corrupt,
                size_changes=self._size_changes[name],
                rate_changes=c.rate_changes,
                down_s=down,
                since_frame_s=since,
            )
        return out


def total(health: Mapping[str, SourceHealth]) -> SourceHealth:
    """The cameras together: counts and time without frames added, the longest silence."""
    out = SourceHealth()
    for h in health.values():
        out.add(h)
    return out
