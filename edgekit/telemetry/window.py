"""``MetricsWindow``: what the frame loop hands to telemetry — a few sketch additions per frame, under a lock.

The frame path calls ``observe(record)`` (microseconds); the publisher thread calls
``take()`` on its timer, which swaps in a fresh window and returns the finished one.
Serialising, writing the spool and talking to the broker all happen on that thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from edgekit._core.sketch import LatencySketch
from edgekit.pipeline.records import FrameRecord
from edgekit.protocol.stages import STAGES


@dataclass
class Window:
    """One reporting window: its wall-clock span, the latency and per-stage sketches, frames and misses."""

    start: float
    end: float = 0.0
    latency: LatencySketch = field(default_factory=LatencySketch)
    stages: dict[str, LatencySketch] = field(default_factory=lambda: {s: LatencySketch() for s in STAGES})
    frames: int = 0
    missed: int = 0

    def to_dict(self) -> dict[str, Any]:
        span = self.end - self.start
        return {
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "frames": self.frames,
            "missed": self.missed,
            "fps": round(self.frames / span, 3) if span > 0 else 0.0,
            "latency_ms": self.latency.to_dict(),
            "stages_ms": {s: sk.to_dict() for s, sk in self.stages.items()},
        }


class MetricsWindow:
    """The pipeline observer that fills windows; thread-safe between the loop and the publisher."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._window = Window(start=time.time())

    def observe(self, record: FrameRecord) -> None:
        with self._lock:
            w = self._window
            w.latency.add(record.latency_ms)
            for stage, ms in record.stage_ms().items():
                w.stages[stage].add(ms)
            w.frames += 1
            if not record.met:
                w.missed += 1

    def take(self) -> Window:
        """The window so far (closed now); a new one starts."""
        now = time.time()
        with self._lock:
            done, self._window = self._window, Window(start=now)
        done.end = now
        return done
