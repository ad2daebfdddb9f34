"""A device's slow windows and the traces of their slowest frames, linked to a trace UI.

A traced device's telemetry window names the trace ids of its slowest frames (``traces``).  The
view keeps the last ``SLOW_WINDOWS`` windows of each device that missed a budget and name traces,
and the device page links each trace id to the trace UI the fleet was told of
(``edgekit fleet serve --trace-url``, a template with ``{trace_id}``: Jaeger's
``http://jaeger:16686/trace/{trace_id}``, Grafana Tempo's explore URL, ...).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from edgekit.errors import EdgekitError

#: The slow windows a device page lists (the newest).
SLOW_WINDOWS = 20
#: What a template must hold where the trace id goes.
PLACEHOLDER = "{trace_id}"


def check_template(template: str) -> str:
    """A trace UI template as given, once it is an http(s) URL with ``{trace_id}`` in it."""
    if not template.startswith(("http://", "https://")) or PLACEHOLDER not in template:
        raise EdgekitError(
            f"--trace-url {template!r} is not an http(s) URL with {PLACEHOLDER} in it",
            "e.g. --trace-url 'http://jaeger.local:16686/trace/{trace_id}'",
        )
    return template


def slow_entry(window: dict[str, Any]) -> dict[str, Any] | None:
    """What the page lists of ``window`` (a validated telemetry window), or ``None`` unless it missed
    a budget and names traces."""
    traces = window.get("traces")
    if not traces or not window.get("missed"):
        return None
    return {
        "start": window["start"],
        "end": window["end"],
        "frames": window["frames"],
        "missed": window["missed"],
        "traces": [dict(t) for t in traces],
    }


def linked(entry: dict[str, Any], template: str | None) -> dict[str, Any]:
    """``entry`` with each trace's ``url`` (``None`` without a template)."""
    traces = [
        {**t, "url": template.replace(PLACEHOLDER, quote(t["trace_id"])) if template else None}
        for t in entry["traces"]
    ]
    return {**entry, "traces": traces}
