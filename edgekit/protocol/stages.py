"""The stages of a frame, in order: what the pipeline times, telemetry reports and the fleet shows.

The dashboard (``fleet/static``) reads them from ``/api/stages``-style payloads, and the
telemetry JSON Schema lists them; both follow this tuple.
"""

from __future__ import annotations

STAGES: tuple[str, ...] = ("capture_wait", "preprocess", "inference", "postprocess", "sink")
