"""Trace a server's requests: ``trace_requests(model)``, for ``edgekit serve --trace``.

The server hands each finished request's measured times to ``RequestTracer.request`` (a
record appended to a bounded deque: no OpenTelemetry, no lock, no thread woken); the tracer's
own thread takes them every ``POLL_S`` and the frame tracer's sampler (``TailSampler``) decides, and only a kept
request becomes spans (``Tracing.record_request_span``): a ``request`` span continuing the
caller's W3C ``traceparent`` (else a new trace), one child per stage.

Kept: every request that failed or was answered past its deadline (or over ``budget_ms``),
every request whose caller sampled its trace, the slowest of each window, a share of the
rest; failures, callers' and the share at most ``max_per_s`` a second.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgekit.telemetry.otel_export import Tracing
from edgekit.telemetry.trace_ids import new_session
from edgekit.telemetry.trace_sampler import Kept, TailSampler
from edgekit.telemetry.tracing import model_resource, open_tracing

if TYPE_CHECKING:
    from edgekit.model import Model

log = logging.getLogger(__name__)

#: Finished requests the tracer's thread may be behind by before it loses one (counted: ``dropped``).
QUEUE_DEPTH = 4096
#: How often the tracer's thread takes the finished requests.  Polled, not signalled: waking a
#: thread per request cost the request's thread ~20 us (a lock and a GIL hand-off) where the
#: append costs ~1; the SDK exports in batches every few seconds anyway.
POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request, as the server measured it; what the sampler is offered."""

    index: int  # the server's count of traced requests
    captured_at: float  # wall clock (s) when it was received
    latency_ms: float
    met: bool  # answered ok, within its deadline (and ``budget_ms``)
    traceparent: str | None
    stages: tuple[tuple[str, float], ...]  # (stage, ms), in the order they ran
    attributes: Mapping[str, Any]
    error: str | None = None  # the outcome's name when not ok
    camera: str = ""


class RequestTracer:
    """Takes each finished request (``request``); keeps the ones its sampler chooses as traces."""

    def __init__(self, tracing: Tracing, sampler: TailSampler[RequestRecord], budget_ms: float | None = None):
        self.tracing = tracing
        self.sampler = sampler
        self.budget_ms = budget_ms
        #: Requests lost because the tracer's thread was behind (the server is not held up for it).
        self.dropped = 0
        self._count = 0
        self._done: deque[RequestRecord] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="edgekit-serve-traces", daemon=True)
        self._thread.start()

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
        """A finished request: ``stages`` (name, seconds) in order from its receipt at ``received_at``
        (wall clock, s); ``outcome`` its label (``ok``, ``busy``, ...); ``in_time``: before its deadline."""
        steps = tuple((name, s * 1e3) for name, s in stages)
        latency_ms = sum(ms for _, ms in steps)
        ok = outcome == "ok"
        met = ok and in_time and (self.budget_ms is None or latency_ms <= self.budget_ms)
        attrs: dict[str, Any] = {
            "edgekit.model": model,
            "edgekit.protocol": protocol,
            "edgekit.outcome": outcome,
        }
        if batch:
            attrs["edgekit.batch"] = batch
        if not in_time:
            attrs["edgekit.late"] = True
        self._count += 1  # a label, not a count anyone reads: a race costs nothing
        record = RequestRecord(
            self._count, received_at, latency_ms, met, traceparent, steps, attrs, None if ok else outcome
        )
        if len(self._done) < QUEUE_DEPTH:
            self._done.append(record)  # atomic: the tracer's thread pops from the other end
        else:
            self.dropped += 1

    def _work(self) -> None:
        from opentelemetry.trace import get_current_span
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        propagator = TraceContextTextMapPropagator()
        while True:
            stopping = self._stop.wait(POLL_S)
            while self._done:
                record = self._done.popleft()
                # The caller's trace, as W3C reads it (an invalid header: a trace of the request's own).
                parent = get_current_span(propagator.extract({"traceparent": record.traceparent or ""}))
                sc = parent.get_span_context()
                tid = sc.trace_id if sc.is_valid else random.getrandbits(128) or 1
                wanted = sc.is_valid and sc.trace_flags.sampled
                self._export(self.sampler.offer(record, tid, wanted=wanted))
            if stopping:
                return
            # Quiet or not, a window past its end closes: its slowest goes now, not with a later request.
            self._export(self.sampler.expire(time.time()))

    def _export(self, kept: list[Kept[RequestRecord]]) -> None:
        for k in kept:
            r = k.record
            try:
                self.tracing.record_request_span(
                    r.traceparent,
                    r.stages,
                    end_time=r.captured_at + r.latency_ms / 1e3,
                    budget_ms=self.budget_ms,
                    attributes=r.attributes,
                    trace_id=k.trace_id,
                    kept_for=k.reason,
                    error=r.error,
                )
            except Exception:  # a defect in one span must not end the tracer's thread
                log.exception("traces: request %d not exported", r.index)

    def close(self) -> None:
        """Trace what is queued, close the last window, flush the exporter (once)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        try:
            self._export(self.sampler.flush())
        finally:
            self.tracing.close()
        log.info("traces: %s, dropped %d", self.sampler.counts.to_dict(), self.dropped)


def trace_requests(
    model: Model,
    *,
    endpoint: str | None = None,
    protocol: str | None = None,
    device_id: str | None = None,
    ratio: float = 0.01,
    slowest: int = 1,
    window_s: float = 5.0,
    max_per_s: float = 10.0,
    budget_ms: float | None = None,
    exporter: Any = None,
) -> RequestTracer | None:
    """A tracer of ``model``'s served requests (``ServeOptions(tracer=...)``), exporting over OTLP.

    As ``trace()`` for frames: ``endpoint`` and ``protocol`` default to the ``OTEL_EXPORTER_OTLP_*``
    environment; with no endpoint at all and no ``exporter``, a warning and ``None`` (nothing
    traced, nothing imported).  The server closes it when it stops.
    """
    tracing = open_tracing(model_resource(model, device_id), endpoint, protocol, ratio, exporter)
    if tracing is None:
        return None
    sampler: TailSampler[RequestRecord] = TailSampler(
        new_session(), ratio=ratio, slowest=slowest, window_s=window_s, max_per_s=max_per_s
    )
    return RequestTracer(tracing, sampler, budget_ms)
