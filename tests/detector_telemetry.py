"""A detector's telemetry without a broker, for the telemetry and fleet tests that build its windows.

``offline_publisher`` never connects (its broker is port 1): a test reads its payloads from
``telemetry_payload()`` and feeds them to a store or a collector itself. ``record`` is one frame
that met its budget with the given detections.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.detection.detector import Detection
from edgekit.pipeline.records import FrameRecord
from edgekit.telemetry import BrokerConfig, Spool, TelemetryPublisher
from edgekit.telemetry.window import MetricsWindow


def record(*detections: Detection, met: bool = True) -> FrameRecord:
    return FrameRecord(0, 0.0, 0, 0, 0.1, 1.0, 5.0, 0.3, 0.1, 6.5, met, 0, "x", detections=detections)


def offline_publisher(
    tmp: Path, window: MetricsWindow, device: str, *, frames: int = 0, **options: Any
) -> TelemetryPublisher:
    """A publisher for ``device`` in fleet ``lab`` whose counters say ``frames``; ``options`` go to it as they are."""
    return TelemetryPublisher(
        BrokerConfig.from_url("mqtt://127.0.0.1:1"),
        device_id=device,
        fleet="lab",
        window=window,
        spool=Spool(tmp / f"{device}.db"),
        counters=lambda: {"frames": frames},
        **options,
    )
