"""The stages of a frame, in order: what the pipeline times, telemetry reports and the fleet shows.

The dashboard takes them, in order, from the ``stage_names`` of ``/api/fleet`` and of each
device page (only their colours live in ``fleet/static/stages.js``), and the telemetry JSON
Schema lists them: all follow this tuple.
"""

from __future__ import annotations

STAGES: tuple[str, ...] = ("capture_wait", "preprocess", "inference", "postprocess", "sink")
