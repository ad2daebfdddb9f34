"""Telemetry: what a device measured, reported over MQTT from its own thread (see ``publisher``)."""

from __future__ import annotations

from edgekit.protocol.broker import BrokerConfig
from edgekit.protocol.topics import topic
from edgekit.telemetry.attach import report
from edgekit.telemetry.otel_export import RequestTrace, Tracing
from edgekit.telemetry.publisher import TelemetryPublisher
from edgekit.telemetry.request_tracing import RequestTracer, trace_requests
from edgekit.telemetry.spool import Spool
from edgekit.telemetry.tracing import FrameTracer, trace
from edgekit.telemetry.window import MetricsWindow

__all__ = [
    "BrokerConfig",
    "FrameTracer",
    "MetricsWindow",
    "RequestTrace",
    "RequestTracer",
    "Spool",
    "TelemetryPublisher",
    "Tracing",
    "report",
    "topic",
    "trace",
    "trace_requests",
]
