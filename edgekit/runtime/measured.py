"""What ``edgekit bench`` measured, as ``load()`` uses it: the measured order and thread count.

``measured_order`` turns a bundle's recorded selection into what
``edgekit.runtime.selection.plan`` takes: measured latencies per candidate, used only on a
host of the same architecture and profile as the one measured.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from edgekit.runtime.matching import artifact_for

if TYPE_CHECKING:
    from edgekit.bundle.manifest import Manifest
    from edgekit.runtime.profiles import Candidate

log = logging.getLogger(__name__)

#: The option that sets a backend's CPU threads (what ``edgekit bench --threads`` sweeps).
THREAD_OPTION = {
    "onnxruntime": "intra_op_threads",
    "openvino": "num_threads",
    "litert": "num_threads",
    "tvm": "num_threads",
}


def measured_order(
    manifest: Manifest, profile: str, candidates: Sequence[Candidate], arch: str
) -> tuple[dict[str, float], dict[str, int]]:
    """Measured p90 per candidate key, and the measured thread count per key, when the selection fits.

    Empty unless the bundle carries a selection measured on a host of this architecture
    and this profile: a ranking measured on one kind of device says nothing about another.
    """
    sel = manifest.selection
    if sel is None:
        return {}, {}
    if sel.profile != profile or sel.host.arch != arch:
        log.info(
            "bundle selection was measured on %s/%s, this is %s/%s: using the profile's order",
            sel.host.arch,
            sel.profile,
            arch,
            profile,
        )
        return {}, {}
    # The fastest thread count per artifact (and backend: one file may run on two).
    best: dict[tuple[str, str], tuple[float, int]] = {}
    for m in sel.candidates:
        k = (m.artifact, m.backend)
        if k not in best or m.p90_ms < best[k][0]:
            best[k] = (m.p90_ms, m.threads)
    latency: dict[str, float] = {}
    threads: dict[str, int] = {}
    for c in candidates:
        art = artifact_for(c, manifest.artifacts)
        hit = best.get((art.name, c.backend)) if art is not None else None
        if hit is not None:
            latency[c.key], threads[c.key] = hit
    return latency, threads


def with_threads(candidate: Candidate, threads: int | None) -> Candidate:
    """``candidate`` with its backend's thread option set to ``threads`` unless its profile sets one."""
    option = THREAD_OPTION.get(candidate.backend)
    if threads is None or option is None or option in candidate.options:
        return candidate
    return replace(candidate, options=MappingProxyType({**candidate.options, option: threads}))
