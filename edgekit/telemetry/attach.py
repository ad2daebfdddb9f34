"""Attach a pipeline to a broker: ``report(pipeline, "mqtt://broker.local", device_id="cam-7")``.

The pipeline knows nothing of MQTT: it tells its sinks each finished frame, and this module
adds one inline sink that feeds a ``TelemetryPublisher`` (and stops it when the pipeline closes).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.pipeline.sinks import sink
from edgekit.protocol.broker import BrokerConfig
from edgekit.telemetry.publisher import TelemetryPublisher
from edgekit.telemetry.window import MetricsWindow

if TYPE_CHECKING:
    from edgekit.pipeline import Pipeline
    from edgekit.pipeline.records import FrameResult
    from edgekit.telemetry.tracing import FrameTracer


def report(
    pipeline: Pipeline,
    mqtt: str,
    *,
    device_id: str | None = None,
    fleet: str = "default",
    interval_s: float = 5.0,
    spool: str | Path | None = None,
    labels_interval_s: float | None = None,
    ca_file: Path | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    protocol: str = "3.1.1",
    format: str = "json",
    tracer: FrameTracer | None = None,
) -> TelemetryPublisher:
    """Report ``pipeline``'s measurements to the MQTT broker at ``mqtt`` (see ``edgekit.telemetry``).

    ``format`` is ``json`` (edgekit's topics) or ``sparkplug`` (Sparkplug B 3.0).

    ``tracer`` (``trace(pipeline)``): each window names the trace ids of its slowest frames.

    Starts at once (connecting in the background); stops with the pipeline.  The frame
    loop only adds each frame to a window; everything else happens on the publisher's thread.
    """
    broker = BrokerConfig.from_url(
        mqtt, ca_file=ca_file, cert_file=cert_file, key_file=key_file, protocol=protocol
    )
    detector = pipeline.model.manifest.model.task == "detection"
    # A classifier's windows stay as they were; a pipeline of many cameras names them up front, so
    # every window (and a Sparkplug birth) lists each, and a single source's (none) has no cameras.
    cameras = list(pipeline.per_camera)
    # Each window closes with how the sources kept delivering (asked on the publisher's thread).
    window = MetricsWindow(
        detections=detector,
        cameras=cameras,
        health=pipeline.health,
        traces=tracer.worst if tracer is not None else None,
    )
    publisher = TelemetryPublisher(
        broker,
        device_id=device_id or socket.gethostname(),
        fleet=fleet,
        interval_s=interval_s,
        window=window,
        counters=pipeline.counters.to_dict,
        birth=pipeline.birth(),
        spool=spool,
        labels_interval_s=labels_interval_s,
        format=format,
    )
    labels = publisher if labels_interval_s is not None else None

    def told(result: FrameResult) -> None:
        # Inline: a count into the window and a reference swap; the publisher's thread does the rest.
        window.observe(result.record)
        if labels is not None:
            labels.offer_result(result, detector)

    pipeline.add_sink(sink("telemetry", told, close=publisher.stop))
    # Zone and line events (``pipeline.add_events``, before or after this): queued for the
    # publisher's thread, spooled, sent at least once on the events topic.
    pipeline.on_event(publisher.publish_event)
    return publisher.start()
