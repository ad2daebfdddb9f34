"""Choose by measurement: write what ``edgekit bench`` measured into a bundle, and read it back at load.

``write_selection`` records the fastest candidate that passed the accuracy gate, by the p90 of
the scenario the device will run (paced at its camera rate; SingleStream when bench ran with
``--fps 0``), with that scenario's numbers for every measured candidate that passed it, in the manifest's ``selection``; a signed
bundle is signed again (the manifest changed), so a bundle is never left with a
signature that no longer matches, and an unsigned one stays unsigned.  ``measured_order``
turns a selection into what ``edgekit.selection.plan.plan`` takes: measured latencies per
candidate, used only on a host of the same architecture and profile as the one measured.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    from edgekit.bench.report import Report
    from edgekit.bundle.manifest import Selection

log = logging.getLogger(__name__)


class SelectionError(EdgekitError):
    """The measured selection cannot be written into this bundle."""


def selection_from(report: Report) -> Selection:
    """The manifest ``selection`` for a bench report; ``SelectionError`` when nothing qualifies."""
    from edgekit._version import __version__
    from edgekit.bundle.manifest import BuildHost, MeasuredCandidate, Selection

    best = report.fastest()
    if best is None or best.summary is None:
        failed = "; ".join(
            f"{r.candidate.key}: {r.error or 'below the accuracy gate'}" for r in report.results
        )
        raise SelectionError(
            "no candidate both ran and passed the accuracy gate, so there is nothing to select"
            + (f" ({failed})" if failed else ""),
            "run edgekit bench without --write-selection to see each candidate, or rebuild the bundle",
        )
    measured = []
    # Only what passed the accuracy gate: ``load()`` tries every measured candidate fastest first,
    # so one recorded below the gate (a detector finding faces that are not there) would be run
    # before the chosen one.
    for r in report.gated():
        if r.summary is None:
            continue
        # The numbers of the scenario the ranking used: ``load()`` orders candidates by this p90,
        # so it must be the camera-rate p90 when that is what chose.
        paced = r.camera_rate
        if paced is not None:
            p50, p90, p99, count = paced.p50_ms, paced.p90_ms, paced.p99_ms, paced.queries
        else:
            p = r.summary.percentiles
            p50, p90, p99, count = p["p50"], p["p90"], p["p99"], r.summary.count
        measured.append(
            MeasuredCandidate(
                artifact=r.candidate.artifact,
                backend=r.candidate.backend,
                precision=r.candidate.precision,
                threads=r.candidate.threads,
                p50_ms=p50,
                p90_ms=p90,
                p99_ms=p99,
                queries=count,
                top1_agreement=r.agreement,
            )
        )
    measured.sort(key=lambda m: m.p90_ms)
    return Selection(
        by=f"edgekit bench {__version__}, ranked by {report.ranked_by}",
        measured=datetime.fromisoformat(report.started),
        profile=report.profile,
        host=BuildHost(arch=report.host["arch"], cpu=report.host.get("cpu", "")),
        chosen=best.candidate.artifact,
        threads=best.candidate.threads,
        candidates=tuple(measured),
    )


def write_selection(bundle: Path, selection: Selection, sign_key: Path | None = None) -> Path:
    """Write ``selection`` into the manifest of ``bundle`` (a folder or ``.tar.gz``) and re-sign it.

    A signed bundle needs ``sign_key`` (its manifest changes, so its signature must be made
    again).  The folder's new ``manifest.json`` and ``manifest.sig`` are written beside the
    old ones and renamed over them; an archive is repacked to a temp file and renamed.
    """
    from edgekit.bundle.archive import is_archive_name, pack, unpack

    bundle = Path(bundle)
    if is_archive_name(bundle) and bundle.is_file():
        work = Path(tempfile.mkdtemp(prefix=".edgekit-select-", dir=bundle.parent))
        try:
            root = unpack(bundle, work / "bundle")
            _rewrite(root, selection, sign_key)
            pack(root, bundle)  # atomic: a temp file renamed over the archive
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return bundle
    if not (bundle / "manifest.json").is_file():
        raise SelectionError(
            f"{bundle} is not a bundle (no manifest.json)",
            "give a bundle folder or a .tar.gz from edgekit build",
        )
    _rewrite(bundle, selection, sign_key)
    return bundle


def _rewrite(root: Path, selection: Selection, sign_key: Path | None) -> None:
    from edgekit.bundle.keys import key_id, load_private_key, sign
    from edgekit.bundle.manifest import (
        MANIFEST_FILE,
        SIGNATURE_FILE,
        SignatureInfo,
        parse_manifest,
        read_manifest,
    )
    from edgekit.core.io import write_atomic

    manifest = read_manifest(root)
    # The selection must name artifacts this bundle has: check before anything else.
    parse_manifest(manifest.model_copy(update={"selection": selection}).to_bytes(), str(root / MANIFEST_FILE))
    signed = manifest.signature is not None or (root / SIGNATURE_FILE).exists()
    if signed and sign_key is None:
        raise SelectionError(
            f"{root} is signed, and recording the selection changes its manifest, so it must be signed again",
            "pass --sign-key with the private key that signs your bundles (edgekit keys generate)",
        )
    key = load_private_key(sign_key) if sign_key is not None else None
    new = manifest.model_copy(
        update={
            "selection": selection,
            "signature": SignatureInfo(key_id=key_id(key.public_key())) if key is not None else None,
        }
    )
    data = new.to_bytes()
    write_atomic(root / MANIFEST_FILE, data)
    if key is not None:
        write_atomic(root / SIGNATURE_FILE, sign(key, data))
    log.info("recorded selection %s (threads %d) in %s", selection.chosen, selection.threads, root)
