"""The install's first two steps: a received bundle's signature and hashes, checked before it touches the disk.

``signature``: ``manifest.json`` and ``manifest.sig`` (only those: read from the head of an
archive) judged against the state root's trusted keys.  ``hashes``: every file against the
signed manifest's SHA-256 and size, no file missing or extra, no link or odd member — for an
archive while streaming it.  The rules are the bundle package's (``edgekit.bundle.integrity``,
the same ones ``verify`` and ``unpack`` apply); this module only turns a refusal into
``StepFailed``, which ``edgekit.deploy.install`` turns into a failed result.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.bundle.integrity import REBUILD
from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    from edgekit.bundle.manifest import Manifest

__all__ = ["REBUILD", "StepFailed", "check_hashes", "check_signature"]


class StepFailed(Exception):
    """A step refused the bundle: unwinds to ``install``, which turns it into a failed result."""

    def __init__(self, step: str, reason: str, hint: str = "", health: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.step, self.reason, self.hint, self.health = step, reason, hint, health


def check_signature(bundle: Path, keys: list[Path]) -> tuple[bytes, bytes | None, Manifest]:
    """The manifest, once its signature by one of ``keys`` is checked; ``StepFailed`` otherwise."""
    from edgekit.bundle import key_id, load_public_key, parse_manifest
    from edgekit.bundle.integrity import judge_signature
    from edgekit.bundle.streamed import read_header

    if not keys:
        raise StepFailed(
            "signature",
            "this device trusts no signing key, so it accepts no bundle",
            "add the builder's public key: edgekit agent trust KEY.pub.pem",
        )
    try:
        data, sig = read_header(bundle)
        manifest = parse_manifest(data)
    except EdgekitError as err:
        raise StepFailed("signature", err.message, err.hint) from err
    trusted = {}
    for path in keys:
        try:
            key = load_public_key(path)
        except EdgekitError:
            continue  # one damaged key file must not lock the device out; status shows it
        trusted[key_id(key)] = key
    verdict = judge_signature(data, sig, manifest, list(trusted.items()))
    if verdict.status == "verified":
        return data, sig, manifest
    if verdict.status in ("unsigned", "missing") or manifest.signature is None:
        why = "" if verdict.status == "unsigned" else f" ({verdict.detail})"
        raise StepFailed(
            "signature",
            f"the bundle is not signed{why}; this device installs signed bundles only",
            "build it with --sign-key KEY.pem (edgekit keys generate makes one)",
        )
    if verdict.untrusted or verdict.status == "unchecked":
        raise StepFailed(
            "signature",
            f"signed by key {verdict.key_id}, which this device does not trust "
            f"(trusted: {', '.join(sorted(trusted)) or 'none'})",
            "sign with a trusted key, or trust this one: edgekit agent trust KEY.pub.pem",
        )
    raise StepFailed("signature", verdict.detail, REBUILD)


def check_hashes(bundle: Path, manifest: Manifest) -> None:
    """Every file of ``bundle`` against the signed ``manifest``; ``StepFailed`` (step ``hashes``) otherwise."""
    from edgekit.bundle.streamed import check_archive
    from edgekit.bundle.verify import file_checks

    if bundle.is_dir():
        failures = [c for c in file_checks(bundle, manifest) if c.status == "fail"]
        if failures:
            raise StepFailed(
                "hashes",
                "; ".join(f"{c.name}: {c.detail}" for c in failures),
                next((c.hint for c in failures if c.hint), REBUILD),
            )
        return
    try:
        check_archive(bundle, manifest)
    except EdgekitError as err:
        raise StepFailed("hashes", err.message, err.hint) from err
