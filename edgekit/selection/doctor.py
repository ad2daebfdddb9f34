"""What ``edgekit doctor`` reports, as data (tools/perf_report.py records the backends' versions from it)."""

from __future__ import annotations

import platform
from typing import Any

from edgekit._version import __version__
from edgekit.backends import registry
from edgekit.core.cpu import this_cpu
from edgekit.device.host import detect, rank_profiles
from edgekit.device.latency_os import read_latency_os
from edgekit.device.profiles import all_profiles
from edgekit.device.video_decode import decode_report
from edgekit.errors import EdgekitError
from edgekit.selection.plan import backend_availability
from edgekit.selection.precision import compute_precision


def doctor_report() -> dict[str, Any]:
    """What ``edgekit doctor`` reports, as plain data: the host, its CPU, the profile it matches,
    every backend (available, version, why not), that profile's candidates in order, what the
    OS does to latency between frames (``latency_os``: clock and idle-state policy, advice) and
    how video is decoded (``video_decode``: GStreamer, the decoder per codec, what hardware needs)."""
    host = detect()
    cpu = this_cpu()
    backends: dict[str, Any] = {}
    for name in registry.names():
        try:
            a = registry.get(name).available()
        except EdgekitError as err:
            backends[name] = {
                "available": False,
                "version": None,
                "reason": err.message,
                "hint": err.hint,
                "devices": [],
            }
            continue
        backends[name] = {
            "available": a.ok,
            "version": a.version,
            "reason": a.reason,
            "hint": a.hint,
            "devices": list(a.devices),
        }
    ranked = rank_profiles(host, all_profiles().values())
    profile = ranked[0] if ranked else None
    candidates = []
    for cand in profile.candidates if profile else ():
        a = backend_availability(cand)
        candidates.append(
            {
                "name": cand.key,
                "backend": cand.backend,
                "precision": cand.precision,
                "variant": cand.variant,
                "requires": list(cand.requires),
                "computes_in": compute_precision(cand, cpu),
                "available": a.ok,
                "reason": a.reason,
            }
        )
    return {
        "edgekit": __version__,
        "python": platform.python_version(),
        "host": host.to_dict(),
        "cpu": cpu.to_dict(),
        "profile": profile.name if profile else None,
        "also_matches": [p.name for p in ranked[1:]],
        "backends": backends,
        "candidates": candidates,
        # The profile's budget is its frame period: the idle gap the cores sleep through between frames.
        "video_decode": decode_report(profile.decoder if profile else "software"),
        "latency_os": (
            read_latency_os(frame_ms=profile.budget_ms) if profile else read_latency_os()
        ).to_dict(),
    }
