"""The camera-to-label pipeline: sources, the capture thread, the frame loop and its budget."""

from __future__ import annotations

from edgekit.pipeline import gst_source  # noqa: F401  (adds GStreamer's RTSP opener to open_source)
from edgekit.pipeline.cameras import Camera
from edgekit.pipeline.loop import Pipeline
from edgekit.pipeline.policy import Policy
from edgekit.pipeline.records import Counters, FrameRecord, FrameResult
from edgekit.pipeline.run_stats import Summary
from edgekit.pipeline.seen import Seen
from edgekit.pipeline.sinks import Sink, sink
from edgekit.pipeline.sources import Source, SourceInfo, open_source
from edgekit.protocol.stages import STAGES

__all__ = [
    "STAGES",
    "Camera",
    "Counters",
    "FrameRecord",
    "FrameResult",
    "Pipeline",
    "Policy",
    "Seen",
    "Sink",
    "Source",
    "SourceInfo",
    "Summary",
    "open_source",
    "sink",
]
