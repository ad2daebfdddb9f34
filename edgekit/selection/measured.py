"""What was measured, as ``load()`` uses it: the bundle's selection, or this host's own measurement.

``measured_order`` turns a bundle's recorded selection (``edgekit bench --write-selection``)
into what ``edgekit.selection.plan.plan`` takes: measured latencies per candidate, used
only on a host of the same architecture and profile as the one measured.

``choose_here`` is the default when the bundle carries no selection that fits: on the first
load of a bundle on this host it measures the candidates at the camera rate (bounded:
``MeasureLimits``), likely fastest first by the build's own figures, ranks those the time left
no room for by those figures (``edgekit.selection.candidate_timing``), keeps the result in the
state folder (``edgekit.selection.choice_cache``) and hands back the latencies; every later load
reads them back without measuring, unless the host was busy (the choice is provisional) or a
running pipeline contradicted it (stale): then the next load measures again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from edgekit.errors import InputError
from edgekit.selection.candidate_timing import MeasureLimits
from edgekit.selection.matching import artifact_for

if TYPE_CHECKING:
    from pathlib import Path

    import numpy as np

    from edgekit.backends.base import Session
    from edgekit.bundle.manifest import Manifest
    from edgekit.device.profiles import Candidate, DeviceProfile

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


Progress = Callable[[str], None]
#: ``0``/``no``/``false``/``off`` turns the first-load measurement off for every load that does not
#: ask for it (``measure=True`` or ``edgekit run --measure`` still measure): for a fleet that wants
#: the profile's order everywhere, or a test suite that checks it.
MEASURE_ENV = "EDGEKIT_MEASURE"


def measure_by_default() -> bool:
    """Whether a load that says nothing measures: yes, unless ``$EDGEKIT_MEASURE`` says no."""
    import os

    value = os.environ.get(MEASURE_ENV, "").strip().lower()
    if value in ("", "1", "yes", "true", "on"):
        return True
    if value in ("0", "no", "false", "off"):
        return False
    raise InputError(
        f"{MEASURE_ENV}={value!r} is neither yes nor no",
        f"set {MEASURE_ENV}=0 to keep the profile's order, or unset it to measure on the first load",
    )


#: How ``load()`` ordered the candidates: measured here now, read back from that measurement,
#: the bundle's own selection, or the profile's order (``measure=False``, nothing to compare).
How = Literal["measured", "cached", "bundle", "profile"]


@dataclass(frozen=True)
class CandidateChoice:
    """Which candidate ``load()`` runs, how it came to be first, and what was measured.

    ``latency_ms``: p90 per candidate key, paced at ``fps`` (measured, cached) or as the
    bundle's selection recorded it (bundle); empty for the profile's order.  ``p50_ms``: the
    paced p50 of those measured here.  ``estimated_ms``: p90 estimated from the build's figures
    for candidates the measurement had no time for.  ``provisional``: measured on a busy host
    (``busy`` says why), measured again on the next load.  ``bundle_sha256``: the kept record's
    key (measured, cached), for marking it stale.
    """

    how: How
    candidate: str = ""
    latency_ms: Mapping[str, float] = field(default_factory=dict)
    measured_at: datetime | None = None
    fps: float | None = None
    p50_ms: Mapping[str, float] = field(default_factory=dict)
    estimated_ms: Mapping[str, float] = field(default_factory=dict)
    provisional: bool = False
    busy: str = ""
    bundle_sha256: str = ""

    @property
    def measured_ms(self) -> float | None:
        """The p90 measured for the candidate in use (None: not measured)."""
        return self.latency_ms.get(self.candidate)

    def ranking(self) -> dict[str, float]:
        """What ``selection.plan`` ranks by: the measured p90s and the estimates of the untimed."""
        return {**self.estimated_ms, **self.latency_ms}

    def describe(self) -> str:
        """One line for a person: which candidate, and why."""
        ms = f", p90 {self.measured_ms:.2f} ms" if self.measured_ms is not None else ""
        at = f" at {self.fps:.3g} fps" if self.fps else ""
        why = {
            "measured": f"measured the fastest here now{at}{ms}",
            "cached": f"the fastest here{at}{ms}, measured {self.measured_at:%Y-%m-%d %H:%M} UTC"
            if self.measured_at
            else "cached",
            "bundle": f"the bundle's selection (edgekit bench --write-selection){ms}",
            "profile": "the device profile's order (not measured)",
        }[self.how]
        if self.estimated_ms:
            why += (
                f" (measured: {', '.join(self.latency_ms)}; "
                f"from the build's figures: {', '.join(self.estimated_ms)})"
            )
        if self.provisional:
            why += f"; provisional, the host was busy ({self.busy}): the next load measures again"
        return f"{self.candidate}: {why}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"how": self.how, "candidate": self.candidate}
        if self.measured_ms is not None:
            out["measured_ms"] = round(self.measured_ms, 4)
        if self.fps:
            out["fps"] = round(self.fps, 3)
        if self.measured_at is not None:
            out["measured_at"] = self.measured_at.isoformat()
        if self.latency_ms:
            out["candidates_ms"] = {k: round(v, 4) for k, v in self.latency_ms.items()}
        if self.estimated_ms:
            out["estimated_ms"] = {k: round(v, 4) for k, v in self.estimated_ms.items()}
        if self.provisional:
            out["provisional"] = True
            out["busy"] = self.busy
        return out


def gate_passed(candidate: Candidate, manifest: Manifest) -> bool:
    """Whether the candidate's artifact passed the build's accuracy gate (no verdict counts as passed).

    One shipped under ``--allow-accuracy-drop`` did not pass: measuring may never put it first.
    """
    art = artifact_for(candidate, manifest.artifacts)
    if art is None:
        return False
    return art.accuracy is None or (art.accuracy.passed and not art.accuracy.allowed_drop)


def choose_here(
    bundle: Path,
    manifest: Manifest,
    profile: DeviceProfile,
    candidates: Sequence[Candidate],
    open_session: Callable[[Candidate], Session],
    make_input: Callable[[Session], Sequence[np.ndarray]],
    limits: MeasureLimits,
    progress: Progress | None = None,
) -> tuple[CandidateChoice, Session | None]:
    """This host's ranking of ``candidates``: read back from the state folder, else measured now and kept.

    Only candidates whose artifact passed the accuracy gate are ranked; the rest keep their
    profile place after them.  With fewer than two such candidates there is nothing to
    compare: the profile's order stands and nothing is written.  A kept choice that is
    provisional (busy host) or stale (contradicted by a running pipeline) is measured again.
    """
    from edgekit.device.pacing import fps_for_budget
    from edgekit.selection.candidate_timing import (
        build_figures,
        busy_reason,
        load_per_core,
        measure_candidates,
        timing_order,
    )
    from edgekit.selection.choice_cache import (
        MAX_ATTEMPTS,
        CachedChoice,
        host_fingerprint,
        manifest_sha256,
        now,
        read_choice,
        write_choice,
    )
    from edgekit.selection.plan import backend_availability

    def say(line: str) -> None:
        log.info("%s", line)
        if progress is not None:
            progress(line)

    eligible = [c for c in candidates if gate_passed(c, manifest)]
    if len(eligible) < 2:
        return CandidateChoice("profile"), None
    sha = manifest_sha256(bundle)
    host = host_fingerprint(profile.name, {c.backend for c in eligible})
    cached = read_choice(sha, host)
    keys = {c.key for c in eligible}
    if cached is not None and set(cached.p90_ms) | set(cached.estimated_ms) <= keys:
        if cached.stale:
            say(f"the kept choice was contradicted by a later run ({cached.stale}): measuring again")
        elif cached.provisional:
            say(f"the kept choice was measured on a busy host ({cached.busy}): measuring again")
        else:
            return CandidateChoice(
                "cached",
                "",
                cached.p90_ms,
                cached.measured_at,
                cached.fps,
                cached.p50_ms,
                cached.estimated_ms,
                bundle_sha256=sha,
            ), None
    runnable = [c for c in eligible if backend_availability(c).ok]
    if len(runnable) < 2:
        return CandidateChoice("profile"), None
    fps = limits.fps or fps_for_budget(profile.budget_ms)
    load = load_per_core()  # before measuring: the measurement itself adds to it
    figures = build_figures(runnable, manifest)
    found, best = measure_candidates(
        timing_order(runnable, figures), open_session, make_input, fps, limits, progress, figures
    )
    if not found.p90_ms:
        return CandidateChoice("profile"), best
    spread = {k: (found.p50_ms[k], found.p90_ms[k]) for k in found.p90_ms}
    busy = busy_reason(spread, 1e3 / fps, load, limits.busy_load)
    attempt = cached.attempt + 1 if cached is not None and cached.provisional else 1
    provisional = bool(busy) and attempt < MAX_ATTEMPTS
    if busy:
        say(
            f"the host is busy ({busy}): "
            + (
                "the choice is provisional, the next load measures again"
                if provisional
                else f"kept as it is after {attempt} measurements on a busy host"
            )
        )
    when = now()
    kept = CachedChoice(
        sha,
        host,
        fps,
        when,
        found.p90_ms,
        found.p50_ms,
        found.estimated_ms,
        None if load is None else round(load, 3),
        busy,
        provisional,
        min(attempt, MAX_ATTEMPTS),
    )
    where = write_choice(kept)
    if where is not None:
        say(f"kept the ranking in {where}: later loads of this bundle here use it")
    return CandidateChoice(
        "measured", "", found.p90_ms, when, fps, found.p50_ms, found.estimated_ms, provisional, busy, sha
    ), best
