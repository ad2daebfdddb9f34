"""Choose the backend a model runs on: a pure ranking, then one pass of loading with fallback.

``plan()`` is a pure function over plain data: which candidates can run here, in which
order.  ``load_first()`` walks that order once; each failure is logged with its cause and
the next candidate is tried; when none is left, one error lists every candidate and why it
did not run.  The session returned says which candidate it really runs on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from edgekit.backends import registry
from edgekit.backends.base import Availability, Session
from edgekit.core.cpu import this_cpu
from edgekit.device.profiles import Candidate
from edgekit.errors import EdgekitError, NoUsableBackendError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """Candidates that can run here, best first, and those dropped with the reason."""

    ordered: tuple[Candidate, ...]
    skipped: tuple[tuple[Candidate, str], ...]


def plan(
    candidates: Sequence[Candidate],
    availability: Callable[[Candidate], Availability],
    latency_ms: Mapping[str, float] | None = None,
) -> Plan:
    """Drop candidates that cannot run here and rank the rest.

    Without measurements the profile's order stands.  With ``latency_ms`` (candidate key ->
    measured p50), measured candidates come first, fastest first; unmeasured ones follow in
    profile order.  Ties break on profile position, so the same input gives the same order
    on every run.
    """
    usable: list[tuple[int, Candidate]] = []
    skipped: list[tuple[Candidate, str]] = []
    for index, cand in enumerate(candidates):
        avail = availability(cand)
        if avail.ok:
            usable.append((index, cand))
        else:
            skipped.append((cand, avail.reason + (f" ({avail.hint})" if avail.hint else "")))
    measured = latency_ms or {}

    def rank(item: tuple[int, Candidate]) -> tuple[int, float, int]:
        index, cand = item
        ms = measured.get(cand.key)
        return (0, ms, index) if ms is not None else (1, 0.0, index)

    return Plan(tuple(c for _, c in sorted(usable, key=rank)), tuple(skipped))


def backend_availability(cand: Candidate) -> Availability:
    """Whether this CPU has what the candidate needs, then its backend's answer for the candidate's options."""
    lacking = cand.missing(this_cpu())
    if lacking:
        return Availability(False, lacking)
    try:
        return registry.get(cand.backend).available(cand.options)
    except EdgekitError as err:  # an unknown backend or a plugin that fails to import
        return Availability(False, err.message, hint=err.hint)


def load_first(
    found: Plan,
    load: Callable[[Candidate], Session],
    availability: Callable[[Candidate], Availability] | None = None,
) -> Session:
    """Load the first candidate of ``found`` that succeeds; raise one error listing every cause if none does.

    With ``availability``, each candidate is probed only when its turn comes: probing a
    runtime imports it (``import tvm`` takes seconds), and the first candidate usually runs.
    """
    causes = [(c.key, why) for c, why in found.skipped]
    for i, cand in enumerate(found.ordered):
        if availability is not None:
            avail = availability(cand)
            if not avail.ok:
                causes.append((cand.key, avail.reason + (f" ({avail.hint})" if avail.hint else "")))
                continue
        try:
            session = load(cand)
        except EdgekitError as err:
            causes.append((cand.key, err.message))
            nxt = found.ordered[i + 1].key if i + 1 < len(found.ordered) else None
            log.warning("%s failed: %s%s", cand.key, err.message, f"; falling back to {nxt}" if nxt else "")
            continue
        session.candidate = cand.key
        session.fallbacks = tuple(causes)
        if causes:
            log.warning("running on %s after %d candidate(s) could not run", cand.key, len(causes))
        else:
            log.info("running on %s", cand.key)
        return session
    raise NoUsableBackendError(
        "no candidate backend could run this model:",
        causes,
        "install the runtime named above, or build an artifact for a backend this host has (edgekit doctor lists them)",
    )


def select(
    candidates: Sequence[Candidate],
    artifact_for: Callable[[Candidate], Path | None],
    latency_ms: Mapping[str, float] | None = None,
    opened: Session | None = None,
) -> Session:
    """Pick and load the best candidate that has an artifact and a runtime here.

    ``opened``: a session already loaded for one candidate (the one measuring found
    fastest), used as that candidate's load instead of loading it twice; closed here when
    another candidate is chosen.
    """

    def availability(cand: Candidate) -> Availability:
        if artifact_for(cand) is None:
            return Availability(False, f"no {cand.backend} {cand.precision} artifact for this host")
        return backend_availability(cand)

    def load(cand: Candidate) -> Session:
        nonlocal opened
        if opened is not None and opened.candidate == cand.key:
            session, opened = opened, None
            return session
        path = artifact_for(cand)
        assert path is not None  # plan() dropped candidates without an artifact
        return registry.get(cand.backend).load(path, cand.options)

    ranked = plan(candidates, lambda c: Availability(True), latency_ms)  # order only; probe lazily below
    try:
        return load_first(ranked, load, availability)
    finally:
        if opened is not None:
            opened.close()
