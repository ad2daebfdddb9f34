"""OpenTelemetry spans of frames and requests, built after the fact from their measured times.

``Tracing`` holds one SDK ``TracerProvider`` (not the global one: an application's own tracing
stays its own) with a batching processor and an OTLP exporter, configured the standard way:

- ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``), ``OTEL_EXPORTER_OTLP_HEADERS``,
  read by the exporters themselves; ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or ``..._TRACES_PROTOCOL``):
  ``http/protobuf`` (the specification's default, port 4318) or ``grpc`` (port 4317);
- ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``, read by the SDK's resource (edgekit
  adds ``device.id``, ``edgekit.device.profile``, ``edgekit.bundle.sha256``, ``edgekit.model.name``;
  ``service.name`` is ``edgekit`` unless the environment names one).

A frame's spans are made when the frame has finished and was kept (``TailSampler``): a root
span ``frame`` from capture to the sink's end, and one child per stage (``STAGES``: capture_wait
is the time in the queue, sink the publishing), each with the times the frame's record measured.
Nothing of this runs on the frame loop.

The SDK is an extra (``pip install 'edgekit[tracing]'``): imported here only, when tracing starts.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgekit.errors import TelemetryError
from edgekit.telemetry.trace_ids import ratio_keeps, trace_hex

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from edgekit.pipeline.records import FrameRecord
    from edgekit.telemetry.trace_sampler import Kept

#: The protocols an OTLP exporter speaks (``OTEL_EXPORTER_OTLP_PROTOCOL``).
PROTOCOLS = ("http/protobuf", "grpc")
TRACING_HINT = "pip install 'edgekit[tracing]' (the OpenTelemetry SDK and its OTLP exporters)"


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """What ``record_request_span`` made: the trace and span ids (hex), and whether it was exported."""

    trace_id: str
    span_id: str
    kept: bool

    @property
    def traceparent(self) -> str:
        """The W3C ``traceparent`` of the request span (for a response header)."""
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.kept else '00'}"


def _protocol(protocol: str | None) -> str:
    chosen = (
        protocol
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    if chosen not in PROTOCOLS:
        raise TelemetryError(
            f"OTLP protocol {chosen!r} is not one edgekit exports with",
            f"use one of {', '.join(PROTOCOLS)} (OTEL_EXPORTER_OTLP_PROTOCOL)",
        )
    return chosen


def _exporter(protocol: str, endpoint: str | None) -> Any:
    """The OTLP span exporter; ``endpoint`` as ``OTEL_EXPORTER_OTLP_ENDPOINT`` would say it (a base URL)."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        return Grpc(endpoint=endpoint) if endpoint else Grpc()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    # As the environment variable: the HTTP exporter posts to the base endpoint's /v1/traces.
    return Http(endpoint=endpoint.rstrip("/") + "/v1/traces") if endpoint else Http()


class Tracing:
    """One provider, its exporter, and how frames and requests become spans; ``close()`` flushes."""

    def __init__(
        self,
        *,
        resource: Mapping[str, str] | None = None,
        endpoint: str | None = None,
        protocol: str | None = None,
        request_ratio: float = 0.01,
        exporter: Any = None,
    ) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
            from opentelemetry.sdk.trace.sampling import ALWAYS_ON
        except ImportError as e:
            raise TelemetryError(
                f"tracing needs the OpenTelemetry SDK ({e.name} is missing)", TRACING_HINT
            ) from e
        self.protocol = _protocol(protocol)
        attrs = {k: v for k, v in (resource or {}).items() if v}
        res = Resource.create(attrs)
        if str(res.attributes.get("service.name", "")).startswith("unknown_service"):
            res = res.merge(Resource({"service.name": "edgekit"}))
        self.resource = res

        preset = threading.local()

        class _Ids(RandomIdGenerator):
            # A root span's trace id: the derived one when set for this thread, else random.
            def generate_trace_id(self) -> int:
                tid: int | None = getattr(preset, "trace_id", None)
                if tid is None:
                    return super().generate_trace_id()
                preset.trace_id = None
                return tid

        self._preset = preset
        # The decision is ours, made after the fact: the SDK records every span it is asked for.
        self.provider: TracerProvider = TracerProvider(resource=res, id_generator=_Ids(), sampler=ALWAYS_ON)
        self.exporter = exporter if exporter is not None else _exporter(self.protocol, endpoint)
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("edgekit")
        self.request_ratio = request_ratio
        self._closed = False

    # -- frames -----------------------------------------------------------------------------

    def export_frame(self, kept: Kept[FrameRecord], budget_ms: float | None = None) -> None:
        """The frame's root span and one child per stage, timed from its record; queued for export."""
        from opentelemetry.context import Context
        from opentelemetry.trace import set_span_in_context

        r = kept.record
        start = round(r.captured_at * 1e9)
        attrs: dict[str, Any] = {
            "edgekit.frame.index": r.index,
            "edgekit.candidate": r.candidate,
            "edgekit.latency_ms": r.latency_ms,
            "edgekit.met": r.met,
            "edgekit.kept_for": kept.reason,
            "edgekit.dropped_before": r.dropped_before,
            "edgekit.batch": r.batch,
        }
        if r.camera:
            attrs["edgekit.camera"] = r.camera
        if r.source_name:
            attrs["edgekit.source"] = r.source_name
        if budget_ms is not None:
            attrs["edgekit.budget_ms"] = budget_ms
        self._preset.trace_id = kept.trace_id
        root = self.tracer.start_span("frame", context=Context(), start_time=start, attributes=attrs)
        self._preset.trace_id = None
        ctx = set_span_in_context(root)
        at = start
        for stage, ms in r.stage_ms().items():
            end = at + round(ms * 1e6)
            self.tracer.start_span(stage, context=ctx, start_time=at).end(end_time=end)
            at = end
        root.end(end_time=start + round(r.latency_ms * 1e6))

    # -- requests ---------------------------------------------------------------------------

    def record_request_span(
        self,
        traceparent: str | None,
        stages: Sequence[tuple[str, float]] | Mapping[str, float],
        *,
        name: str = "request",
        end_time: float | None = None,
        budget_ms: float | None = None,
        attributes: Mapping[str, Any] | None = None,
        trace_id: int | None = None,
        kept_for: str | None = None,
        error: str | None = None,
    ) -> RequestTrace:
        """A served request's span and its stages' spans, continuing the caller's W3C ``traceparent``.

        ``stages``: (name, ms) in the order they ran (e.g. receive, queue, preprocess, infer,
        postprocess, respond); the request span runs from the first's start to the last's end,
        which is ``end_time`` (wall clock, s; now when left out).  Kept when the caller's trace is
        sampled (its flags), the request took longer than ``budget_ms``, or by ``request_ratio``
        on its trace id; its ids are returned either way (for the response's ``traceparent``).
        An invalid ``traceparent`` is ignored, as W3C asks: the request starts a trace of its own,
        ``trace_id`` when given (else a random one).

        ``kept_for``: the decision is already made (``TailSampler``, as ``edgekit serve --trace``
        makes it): exported, with ``edgekit.kept_for``.  ``error``: the request failed; its span's
        status says so, with this description.
        """
        import time

        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind, get_current_span, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        steps = list(stages.items()) if isinstance(stages, Mapping) else list(stages)
        total_ms = sum(ms for _, ms in steps)
        end = round((time.time() if end_time is None else end_time) * 1e9)
        start = end - round(total_ms * 1e6)
        ctx = Context()
        if traceparent:
            ctx = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        parent = get_current_span(ctx).get_span_context()
        if parent.is_valid:
            trace_id = parent.trace_id
        elif trace_id is None:
            trace_id = random.getrandbits(128) or 1
        kept = (
            kept_for is not None
            or (parent.is_valid and parent.trace_flags.sampled)
            or (budget_ms is not None and total_ms > budget_ms)
            or ratio_keeps(trace_id, self.request_ratio)
        )
        if not kept:
            return RequestTrace(trace_hex(trace_id), f"{random.getrandbits(64) or 1:016x}", False)
        attrs: dict[str, Any] = {"edgekit.latency_ms": total_ms, **(attributes or {})}
        if budget_ms is not None:
            attrs["edgekit.budget_ms"] = budget_ms
        if kept_for is not None:
            attrs["edgekit.kept_for"] = kept_for
        if not parent.is_valid:
            self._preset.trace_id = trace_id
        span = self.tracer.start_span(
            name, context=ctx, kind=SpanKind.SERVER, start_time=start, attributes=attrs
        )
        self._preset.trace_id = None
        child_ctx = set_span_in_context(span)
        at = start
        for stage, ms in steps:
            stop = at + round(ms * 1e6)
            self.tracer.start_span(stage, context=child_ctx, start_time=at).end(end_time=stop)
            at = stop
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end)
        sc = span.get_span_context()
        return RequestTrace(trace_hex(sc.trace_id), f"{sc.span_id:016x}", True)

    def flush(self, timeout_s: float = 10.0) -> bool:
        return bool(self.provider.force_flush(round(timeout_s * 1000)))

    def close(self) -> None:
        """Export what is queued, then stop the exporter (once)."""
        if self._closed:
            return
        self._closed = True
        self.provider.shutdown()
