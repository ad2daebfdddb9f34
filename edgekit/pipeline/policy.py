"""What the pipeline does when frames come faster than it can label them (roboflow's ``BufferFillingStrategy``).

The choice is named, never implicit, and every frame it costs is counted.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from enum import Enum

from edgekit.core.stats import percentile
from edgekit.errors import PipelineError

log = logging.getLogger(__name__)


class Policy(str, Enum):
    """Overload policies.

    ``drop-oldest``
        Keep only the newest frame: when a new frame arrives before the last one was
        taken, the old one is dropped and counted.  Latency stays bounded by one frame
        of processing; nothing queues.  The default for cameras and streams.
    ``block``
        Process every frame: the capture thread waits until the pipeline took the last
        one.  Nothing is dropped; a slow model slows the source down.  The default for
        files and folders (and what to use for offline evaluation).
    ``degrade``
        ``drop-oldest``, and when the p90 latency over a window exceeds the budget for
        ``degrade_after`` frames, switch to a faster artifact of the bundle (measured
        here at start); switch back when the slower one is predicted to fit with
        headroom again.  Each switch is logged and counted.
    """

    DROP_OLDEST = "drop-oldest"
    BLOCK = "block"
    DEGRADE = "degrade"

    @classmethod
    def parse(cls, value: str | Policy) -> Policy:
        try:
            return cls(value)
        except ValueError:
            raise PipelineError(
                f"unknown overload policy {value!r}",
                "use one of: " + ", ".join(p.value for p in cls),
            ) from None

    @classmethod
    def default_for(cls, live: bool) -> Policy:
        """Cameras and streams drop stale frames; files are processed whole."""
        return cls.DROP_OLDEST if live else cls.BLOCK


class DegradeController:
    """Decides when to step to a faster artifact and back, from frame latencies alone (no clock).

    ``speeds_ms[i]`` is the measured inference time of level ``i`` (level 0 the primary,
    each next level faster).  Step down when the window's p90 exceeds the budget for
    ``after`` frames in a row.  Step back up when the p90 *predicted for the slower
    level* (observed p90 scaled by the measured speed ratio) stays under ``headroom`` x
    budget for ``recover_after`` frames: a model that cannot fit is not retried in a loop.
    A recovery that has to be undone within ``recover_after`` frames doubles it (up to 16x).
    """

    def __init__(
        self,
        budget_ms: float,
        speeds_ms: Sequence[float],
        *,
        window: int = 30,
        after: int = 30,
        headroom: float = 0.8,
        recover_after: int = 300,
    ) -> None:
        if len(speeds_ms) < 1 or window < 1 or after < 1 or recover_after < 1:
            raise PipelineError("degrade needs at least one level and positive window/after", "")
        self.budget_ms = budget_ms
        self.speeds_ms = tuple(speeds_ms)
        self.level = 0
        self.switches = 0
        self._window: deque[float] = deque(maxlen=window)
        self._after = after
        self._headroom = headroom
        self._base_recover = recover_after
        self._recover_after = recover_after
        self._over = 0
        self._under = 0
        self._frames_since_recovery: int | None = None

    def observe(self, latency_ms: float) -> int | None:
        """Feed one frame's latency; returns the new level when a switch is due, else ``None``."""
        self._window.append(latency_ms)
        if self._frames_since_recovery is not None:
            self._frames_since_recovery += 1
        if len(self._window) < (self._window.maxlen or 1):
            return None
        now = percentile(sorted(self._window), 90)
        self._over = self._over + 1 if now > self.budget_ms else 0
        if self.level > 0:
            ratio = self.speeds_ms[self.level - 1] / max(self.speeds_ms[self.level], 1e-9)
            self._under = self._under + 1 if now * ratio < self._headroom * self.budget_ms else 0
        if self._over >= self._after and self.level + 1 < len(self.speeds_ms):
            recent = self._frames_since_recovery
            if recent is not None and recent <= self._recover_after:
                self._recover_after = min(self._recover_after * 2, 16 * self._base_recover)
            return self._switch(self.level + 1, now)
        if self.level > 0 and self._under >= self._recover_after:
            self._frames_since_recovery = 0
            return self._switch(self.level - 1, now)
        return None

    def _switch(self, level: int, p90_ms: float) -> int:
        log.debug(
            "degrade: p90 %.1f ms vs budget %.1f ms -> level %d (%.1f ms inference, was %.1f ms)",
            p90_ms,
            self.budget_ms,
            level,
            self.speeds_ms[level],
            self.speeds_ms[self.level],
        )
        self.level = level
        self.switches += 1
        self._window.clear()
        self._over = self._under = 0
        return level
