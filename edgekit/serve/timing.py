"""A request's times, for its trace (``edgekit serve --trace``): measured by the server, handed to a ``Tracer``.

Only made when the server has a tracer (``ServeOptions.tracer``): without one, a request
carries ``None`` and costs nothing more.  The tracer (``edgekit.telemetry.trace_requests``)
decides on its own thread which requests become spans; the server only fills this in as the
request goes: ``receive`` (reading it and decoding the protocol), the stages its own thread runs
before queueing it (``decode``, ``preprocess``: ``Service.infer`` prepares it there), ``queue``
(waiting for the worker), the worker's stages (``infer``, ``postprocess``), and ``respond`` (the
rest: its answer handed back and encoded), which together make its whole time.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class Tracer(Protocol):
    """What the server hands each finished request to (``edgekit.telemetry.RequestTracer`` is one)."""

    def request(
        self,
        *,
        traceparent: str | None,
        received_at: float,
        stages: Sequence[tuple[str, float]],
        outcome: str,
        in_time: bool,
        model: str,
        protocol: str,
        batch: int = 0,
    ) -> None:
        """Must return at once: it runs on the request's own thread."""

    def close(self) -> None:
        """The server stopped: export what is left."""


@dataclass(slots=True)
class Timing:
    """One request's times so far (``time.perf_counter`` seconds, but ``received_at``: wall clock)."""

    traceparent: str | None
    received_at: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)
    #: When it was handed to the queue (0: it never was).
    submitted: float = 0.0
    #: Its wait for the worker (None: it never reached the worker).
    queued_s: float | None = None
    #: The requests inferred with it, itself included (0: none ran).
    batch: int = 0
    #: The stages run on its own thread before it was queued (seconds): its preparation.
    prepared: Mapping[str, float] = field(default_factory=dict)
    #: The worker's stages (seconds), from its ``InferResult`` (the prepared ones again: skipped).
    worked: Mapping[str, float] = field(default_factory=dict)
    protocol: str = ""
    #: Its deadline (``time.monotonic``).
    deadline: float = float("inf")

    def stages(self, end: float) -> list[tuple[str, float]]:
        """(stage, seconds) in the order they ran, from its receipt to ``end`` (``perf_counter``)."""
        total = max(end - self.started, 0.0)
        if not self.submitted:
            return [("receive", total)]
        early = dict(self.prepared)
        out = [("receive", max(self.submitted - self.started - sum(early.values()), 0.0)), *early.items()]
        if self.queued_s is not None:
            out.append(("queue", self.queued_s))
        out += ((stage, s) for stage, s in self.worked.items() if stage not in early)
        # What is left: the answer handed back to the request's thread, and encoded.
        out.append(("respond", max(total - sum(s for _, s in out), 0.0)))
        return out
