"""The canary window: the canaries' new pipelines judged by their telemetry.

The windows are taken by the fleet collector (``edgekit.fleet.collector``) into an in-memory
fleet store, as ``edgekit fleet serve`` would take them: one implementation checks them,
de-duplicates them on ``(device, epoch, seq)`` and merges their sketches.  Only windows of the
*new* pipeline count: of a session whose status birth is new since the command and of the new
version.  Percentiles are never averaged: p95 is read from the merged latency sketch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from edgekit.core.tally import FrameTally
from edgekit.deploy.link import Telemetry
from edgekit.fleet.collector import Collector
from edgekit.fleet.store import FleetStore
from edgekit.protocol.topics import topic

DEFAULT_MISS_RATE = 0.01
# The store adds windows up per time step: one step longer than any clock reading holds them all.
ALL_TIME_S = 2.0**62


@dataclass(kw_only=True)
class Health(FrameTally):
    """What the canary window saw of one device's new pipeline: its windows' tally, held to the SLO."""

    device: str
    windows: int = 0
    p95_ms: float | None = None
    budget_ms: float | None = None
    limit_ms: float | None = None
    sessions: list[str] = field(default_factory=list)
    breach: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "frames": self.frames,
            "missed": self.missed,
            "miss_rate": round(self.miss_rate, 5),
            "windows": self.windows,
            "p95_ms": None if self.p95_ms is None else round(self.p95_ms, 3),
            "budget_ms": self.budget_ms,
            "limit_ms": self.limit_ms,
            "breach": self.breach,
        }


class CanaryWatch:
    """What the canaries' telemetry says of their new pipelines, held to an SLO (p95 and miss rate)."""

    def __init__(
        self,
        fleet: str,
        slo_p95_ms: float | None = None,
        slo_miss_rate: float = DEFAULT_MISS_RATE,
        batch_size: int = 1,
    ) -> None:
        self.fleet = fleet
        self.slo_p95_ms = slo_p95_ms
        self.slo_miss_rate = slo_miss_rate
        self.store = FleetStore(":memory:")
        # A wave's gate takes thousands of devices' windows: written in batches (flushed before reads).
        self.collector = Collector(
            self.store, batch_size=batch_size, flush_s=3600.0 if batch_size > 1 else 0.25
        )
        self._taken: dict[str, int] = {}  # device -> how many of its messages were looked at
        # device -> messages of a session whose status birth has not been heard yet
        self._waiting: dict[str, list[Telemetry]] = {}
        self.reported: set[str] = set()  # devices with at least one window of a fresh session taken
        self.budgets: dict[str, float] = {}  # device -> the budget its fresh session's birth says

    def health(
        self,
        device: str,
        births: dict[str, dict[str, Any]],
        messages: Sequence[Telemetry],
        old: set[str],
        version: str,
    ) -> Health:
        """The windows of ``device``'s new sessions (new since the command, of ``version``), merged.

        ``births``: session -> status birth, as heard so far; ``messages``: every telemetry
        message of the device so far, in arrival order (a list that only grows between calls).
        """
        fresh = self.take(device, births, messages, old, version)
        h = Health(device=device, sessions=sorted(fresh))
        self.collector.flush()
        for bucket in self.store.buckets(-math.inf, math.inf, ALL_TIME_S, self.fleet, device):
            h.merge(bucket)
        h.windows = len(self.store.seqs(self.fleet, device))
        h.p95_ms = h.latency.quantile(0.95) if h.latency.count else None
        budgets = [
            float(b["budget_ms"]) for b in fresh.values() if isinstance(b.get("budget_ms"), (int, float))
        ]
        h.budget_ms = budgets[-1] if budgets else None
        h.limit_ms = self.slo_p95_ms if self.slo_p95_ms is not None else h.budget_ms
        return h

    def take(
        self,
        device: str,
        births: dict[str, dict[str, Any]],
        messages: Sequence[Telemetry],
        old: set[str],
        version: str,
        start: int = 0,
    ) -> dict[str, dict[str, Any]]:
        """Hand the collector ``device``'s new windows of fresh sessions (no reading back); the fresh births.

        ``messages`` may be the tail of the device's list from index ``start`` on.
        """
        fresh = {s: body for s, body in births.items() if s not in old and _of_version(body, version)}
        self._take(device, messages, set(fresh), set(births), start)
        budgets = [
            float(b["budget_ms"]) for b in fresh.values() if isinstance(b.get("budget_ms"), (int, float))
        ]
        if budgets:
            self.budgets[device] = budgets[-1]
        return fresh

    def taken(self, device: str) -> int:
        """How many of ``device``'s messages were looked at (where the next ``take`` starts)."""
        return self._taken.get(device, 0)

    def merged(self, name: str) -> Health:
        """Every window taken so far, of every device, in one tally (one merged sketch: no averaged percentile)."""
        self.collector.flush()
        h = Health(device=name)
        for bucket in self.store.buckets(-math.inf, math.inf, ALL_TIME_S, self.fleet):
            h.merge(bucket)
        h.p95_ms = h.latency.quantile(0.95) if h.latency.count else None
        return h

    def _take(
        self, device: str, messages: Sequence[Telemetry], fresh: set[str], known: set[str], offset: int = 0
    ) -> None:
        """Hand the collector the new messages of fresh sessions; keep those of sessions not yet born."""
        start = self._taken.get(device, 0)
        self._taken[device] = max(start, offset + len(messages))
        waiting = [*self._waiting.get(device, []), *messages[max(0, start - offset) :]]
        where = topic(self.fleet, device, "telemetry")
        still: list[Telemetry] = []
        for message in waiting:
            if message.session in fresh:
                self.collector.handle(where, message.payload)  # a replay after a reconnect: a duplicate
                self.reported.add(device)
            elif message.session not in known:
                still.append(message)  # its birth may still come (the old version's sessions never count)
        self._waiting[device] = still

    def judge(self, h: Health) -> str | None:
        """Why ``h`` breaches the SLO, or ``None`` when it holds."""
        if h.limit_ms is not None and h.p95_ms is not None and h.p95_ms > h.limit_ms:
            return f"p95 {h.p95_ms:.2f} ms over {h.frames} frames > the limit of {h.limit_ms:g} ms"
        if h.miss_rate > self.slo_miss_rate:
            return (
                f"{h.missed} of {h.frames} frames missed the budget ({h.miss_rate:.1%} > "
                f"{self.slo_miss_rate:.1%})"
            )
        return None

    def close(self) -> None:
        self.store.close()


def _of_version(birth: dict[str, Any], version: str) -> bool:
    """Whether a status birth is of ``version`` (or does not say which model it runs)."""
    model = birth.get("model") if isinstance(birth.get("model"), dict) else {}
    return not isinstance(model, dict) or model.get("version") in (None, version)
