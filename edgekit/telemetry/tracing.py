"""Trace a pipeline's slow frames: ``trace(pipeline)``, with OTLP configured the standard way.

One more sink on the pipeline's one frame path: the ``traces`` sink is queued (its own thread),
so the frame loop only puts each finished frame in its queue.  On that thread the sampler
decides after the fact (``TailSampler``: every missed budget, each window's slowest, a small
share of the rest, under a rate cap), and only a kept frame becomes spans (``Tracing``).

With telemetry on the same pipeline (``report(pipeline, ..., tracer=tracer)``) the telemetry
window closes the sampler's window: each message names its slowest frames' trace ids, and those
traces are exported.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from edgekit.telemetry.otel_export import Tracing
from edgekit.telemetry.trace_ids import new_session
from edgekit.telemetry.trace_sampler import Kept, TailSampler

if TYPE_CHECKING:
    from edgekit.model import Model
    from edgekit.pipeline import Pipeline
    from edgekit.pipeline.records import FrameRecord, FrameResult

log = logging.getLogger(__name__)

#: Frames the traces sink may hold before it loses one (counted in ``pipeline.sinks.dropped``).
QUEUE_DEPTH = 256


class FrameTracer:
    """The ``traces`` sink: a queued sink that keeps the frames ``sampler`` chooses as traces."""

    name = "traces"
    depth = QUEUE_DEPTH

    def __init__(
        self,
        tracing: Tracing,
        sampler: TailSampler[FrameRecord],
        budgets: Mapping[str, float],
        budget_ms: float,
    ) -> None:
        self.tracing = tracing
        self.sampler = sampler
        self._budgets = dict(budgets)  # per camera ("" for a single source)
        self._budget_ms = budget_ms

    def frame(self, result: FrameResult) -> None:
        self._export(self.sampler.offer(result.record))

    def worst(self) -> list[dict[str, Any]]:
        """Close the sampler's window with telemetry's: export its slowest, return their trace refs."""
        kept, refs = self.sampler.take()
        self._export(kept)
        return refs

    def _export(self, kept: list[Kept[FrameRecord]]) -> None:
        for k in kept:
            self.tracing.export_frame(k, self._budgets.get(k.record.camera, self._budget_ms))

    def close(self) -> None:
        try:
            self._export(self.sampler.flush())
        finally:
            self.tracing.close()
        log.info("traces: %s", self.sampler.counts.to_dict())


def bundle_resource(pipeline: Pipeline, device_id: str | None = None) -> dict[str, str]:
    """The resource attributes a device's traces carry: its id, profile, bundle hash and model."""
    return model_resource(pipeline.model, device_id)


def model_resource(model: Model, device_id: str | None = None) -> dict[str, str]:
    """``bundle_resource`` of a loaded model (a server's, which has no pipeline)."""
    from edgekit.selection.choice_cache import manifest_sha256

    m = model.manifest
    try:
        sha = manifest_sha256(model.root)
    except OSError:
        sha = ""
    return {
        "device.id": device_id or socket.gethostname(),
        "edgekit.device.profile": m.device.profile,
        "edgekit.bundle.sha256": sha,
        "edgekit.model.name": m.model.name,
    }


def open_tracing(
    resource: Mapping[str, Any], endpoint: str | None, protocol: str | None, ratio: float, exporter: Any
) -> Tracing | None:
    """The exporting side of a tracer, or ``None`` (with one warning) where no endpoint is configured."""
    if exporter is None and not endpoint_configured(endpoint):
        log.warning("traces: no OTLP endpoint configured (OTEL_EXPORTER_OTLP_ENDPOINT), not tracing")
        return None
    return Tracing(
        resource=resource, endpoint=endpoint, protocol=protocol, request_ratio=ratio, exporter=exporter
    )


def endpoint_configured(endpoint: str | None = None) -> bool:
    """Whether traces have somewhere to go: ``endpoint``, or the environment's OTLP (traces) endpoint."""
    return bool(
        endpoint
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def trace(
    pipeline: Pipeline,
    *,
    endpoint: str | None = None,
    protocol: str | None = None,
    device_id: str | None = None,
    ratio: float = 0.01,
    slowest: int = 1,
    window_s: float = 5.0,
    max_per_s: float = 10.0,
    exporter: Any = None,
) -> FrameTracer | None:
    """Export OpenTelemetry traces of ``pipeline``'s slow frames over OTLP; stops with the pipeline.

    Kept: every frame over its budget and the ``slowest`` of each ``window_s`` (or of each
    telemetry window, with ``report(..., tracer=)``), plus ``ratio`` of the rest; misses and the
    ratio's frames at most ``max_per_s`` a second.  ``endpoint`` and ``protocol`` default to
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` (then
    ``http/protobuf``); ``exporter``: any SDK span exporter instead.

    With no endpoint at all (neither ``endpoint`` nor ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
    ``..._TRACES_ENDPOINT``) and no ``exporter``, nothing is traced and ``None`` is returned: no
    sink, no SDK import, no exporter retrying against a ``localhost`` where nothing listens (a
    fleet may switch ``EDGEKIT_TRACE`` on everywhere before every device has a collector).
    """
    tracing = open_tracing(bundle_resource(pipeline, device_id), endpoint, protocol, ratio, exporter)
    if tracing is None:
        return None
    sampler: TailSampler[FrameRecord] = TailSampler(
        new_session(), ratio=ratio, slowest=slowest, window_s=window_s, max_per_s=max_per_s
    )
    tracer = FrameTracer(tracing, sampler, pipeline.budgets, pipeline.budget_ms)
    pipeline.add_sink(tracer)
    return tracer
