"""Attach a pipeline to a broker: ``report(pipeline, "mqtt://broker.local", device_id="cam-7")``.

The pipeline knows nothing of MQTT: it offers observers, label sinks and closers, and this
module plugs a ``TelemetryPublisher`` into them.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.protocol.broker import BrokerConfig
from edgekit.telemetry.publisher import TelemetryPublisher
from edgekit.telemetry.window import MetricsWindow

if TYPE_CHECKING:
    from edgekit.pipeline import Pipeline


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
) -> TelemetryPublisher:
    """Report ``pipeline``'s measurements to the MQTT broker at ``mqtt`` (see ``edgekit.telemetry``).

    ``format`` is ``json`` (edgekit's topics) or ``sparkplug`` (Sparkplug B 3.0).

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
    window = MetricsWindow(detections=detector, cameras=cameras, health=pipeline.health)
    pipeline.add_observer(window.observe)
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
    pipeline.add_closer(publisher.stop)
    if labels_interval_s is not None:
        # The result sink hands over detections too; a pipeline without one (older frame loop) gives labels.
        add_result_sink = getattr(pipeline, "add_result_sink", None)
        if add_result_sink is not None:
            add_result_sink(lambda result: publisher.offer_result(result, detector))
        else:
            pipeline.add_label_sink(publisher.offer_labels)
    return publisher.start()
