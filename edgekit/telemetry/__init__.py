"""Telemetry: what a device measured, reported over MQTT from its own thread (see ``publisher``)."""

from __future__ import annotations

from edgekit.telemetry.broker import BrokerConfig
from edgekit.telemetry.publisher import TelemetryPublisher, topic
from edgekit.telemetry.spool import Spool
from edgekit.telemetry.window import MetricsWindow

__all__ = ["BrokerConfig", "MetricsWindow", "Spool", "TelemetryPublisher", "topic"]
