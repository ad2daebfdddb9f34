"""A frame's trace id, derived, not drawn: ``frame_trace_id(session, camera, index)``.

Derived so that whoever knows which frame it was (the tracing sink, the telemetry window that
names its worst frames, a person reading ``--records``) can name its trace without any state
passed between them.  ``session`` tells two runs of the same camera apart (a fresh one per
tracer).  W3C Trace Context asks for 16 random-looking bytes, not all zero: a BLAKE2b digest is.
"""

from __future__ import annotations

import hashlib
import secrets


def new_session() -> str:
    """A fresh session id (16 hex digits): a run's frames get trace ids no other run gets."""
    return secrets.token_hex(8)


def frame_trace_id(session: str, camera: str, index: int) -> int:
    """The 128-bit trace id of frame ``index`` of ``camera`` in ``session`` (never 0)."""
    digest = hashlib.blake2b(f"{session}\0{camera}\0{index}".encode(), digest_size=16).digest()
    return int.from_bytes(digest, "big") or 1


def trace_hex(trace_id: int) -> str:
    """A trace id as W3C and OTLP tools write it: 32 lowercase hex digits."""
    return f"{trace_id:032x}"


def ratio_keeps(trace_id: int, ratio: float) -> bool:
    """Whether a ``ratio`` share (0..1) keeps ``trace_id``: its low 64 bits below ratio * 2**64.

    The rule of OpenTelemetry's ``TraceIdRatioBased``: a given trace id is kept or not the same
    way everywhere, and over many ids the share kept is ``ratio``.
    """
    return (trace_id & 0xFFFF_FFFF_FFFF_FFFF) < round(ratio * 2**64)
