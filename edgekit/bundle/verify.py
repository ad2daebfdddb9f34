"""Check a bundle: its manifest, every file's SHA-256 and size, no file missing or extra, its signature.

A signature is only ever checked against public keys the caller trusts: a key shipped
inside a bundle would prove nothing, since whoever changed the bundle could change it too.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from edgekit.bundle.integrity import (
    REBUILD,
    Entry,
    Listing,
    SignatureStatus,
    extra_paths,
    file_problem,
    judge_signature,
    read_header_file,
)
from edgekit.bundle.keys import KeyPaths, key_files
from edgekit.bundle.manifest import MANIFEST_FILE, SIGNATURE_FILE, Manifest, parse_manifest
from edgekit.errors import BundleError, VerificationError

Status = Literal["ok", "warn", "fail"]

_SIGN_HINT = "make a key with `edgekit keys generate`, then build with `edgekit build ... --sign-key KEY.pem`"


@dataclass(frozen=True)
class Check:
    """One verification step: what was checked, how it went, and what to do when it failed."""

    name: str
    status: Status
    detail: str
    hint: str = ""


@dataclass(frozen=True)
class VerifyReport:
    """Every check made on one bundle, and the signature's standing.

    ``signature``: ``verified`` (by a trusted key), ``unsigned``, ``unchecked`` (signed,
    but no trusted key was given), ``invalid`` (no trusted key's signature matches) or
    ``missing`` (the manifest names a signer but ``manifest.sig`` is gone).
    """

    bundle: Path
    checks: tuple[Check, ...]
    signature: SignatureStatus | None = None
    key_id: str | None = None
    manifest: Manifest | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        """True when no check failed (warnings, like an unsigned bundle, do not fail it)."""
        return not self.failures

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status == "fail")

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``edgekit verify --json``."""
        return {
            "bundle": str(self.bundle),
            "ok": self.ok,
            "signature": {"status": self.signature, "key_id": self.key_id},
            "checks": [
                {"name": c.name, "status": c.status, "detail": c.detail, "hint": c.hint} for c in self.checks
            ],
        }

    def raise_if_failed(self) -> None:
        """``VerificationError`` listing every failed check, with the first one's hint; nothing if ok."""
        if self.ok:
            return
        lines = [f"{self.bundle} failed verification:"]
        lines += [f"  - {c.name}: {c.detail}" for c in self.failures]
        raise VerificationError("\n".join(lines), next((c.hint for c in self.failures if c.hint), ""))


def verify(
    bundle: Path,
    trusted_keys: KeyPaths | None = None,
    *,
    require_signature: bool = False,
    hash_files: Collection[str] | None = None,
) -> VerifyReport:
    """Check the bundle folder or archive ``bundle``; return a report (it raises only for bad input).

    Checks that the manifest parses; that every listed file is a plain file with the listed
    size and SHA-256; that no file is missing or extra; and that ``manifest.sig`` is a valid
    Ed25519 signature of ``manifest.json`` by one of ``trusted_keys`` (public key PEM files: one
    path or several).
    A signed bundle checked without keys is reported ``unchecked``, an unsigned one
    ``unsigned``; both fail only with ``require_signature``.  An unreadable key file or an
    unsafe archive raises (``KeyFileError``, ``UnsafeArchiveError``).

    ``hash_files`` (bundle-relative paths) hashes only those files; the others are checked
    for presence, kind and size.  ``edgekit.load`` passes none and hashes an artifact's files
    with ``check_files`` just before it loads them: a reference bundle holds ~110 MB of
    artifacts, of which one runs, and hashing them all was a tenth of a cold start.
    """
    from edgekit.bundle.archive import open_bundle

    keys = _load_keys(key_files(trusted_keys) if trusted_keys is not None else [])
    with open_bundle(bundle) as folder:
        return _verify_folder(folder, bundle, keys, require_signature, hash_files)


def check_files(folder: Path, manifest: Manifest, paths: Iterable[str]) -> None:
    """Hash ``paths`` of the bundle folder against ``manifest``; ``VerificationError`` naming each that differs."""
    listed = manifest.files()
    checks = []
    for rel in paths:
        entry = listed.get(rel)
        if entry is None:
            checks.append(Check(rel, "fail", "not listed in the manifest", REBUILD))
        else:
            checks.append(_file_check(folder, rel, entry, hash_it=True))
    VerifyReport(folder, tuple(checks)).raise_if_failed()


def _load_keys(paths: Sequence[Path]) -> list[tuple[str, Any]]:
    if not paths:
        return []
    from edgekit.bundle.keys import key_id, load_public_key

    keys = [load_public_key(p) for p in paths]
    return [(key_id(k), k) for k in keys]


def _verify_folder(
    folder: Path,
    shown: Path,
    keys: list[tuple[str, Any]],
    require_signature: bool,
    hash_files: Collection[str] | None = None,
) -> VerifyReport:
    checks: list[Check] = []
    try:
        data = read_header_file(folder, MANIFEST_FILE)
        sig = read_header_file(folder, SIGNATURE_FILE)
    except BundleError as err:
        checks.append(Check("manifest", "fail", err.message, err.hint))
        return VerifyReport(shown, tuple(checks))
    if data is None:
        checks.append(Check("manifest", "fail", f"no {MANIFEST_FILE}: it is not a bundle", REBUILD))
        return VerifyReport(shown, tuple(checks))
    try:
        manifest = parse_manifest(data)
    except BundleError as err:
        checks.append(Check("manifest", "fail", err.message, err.hint))
        return VerifyReport(shown, tuple(checks))
    checks.append(
        Check(
            "manifest",
            "ok",
            f"schema {manifest.schema_version}, {len(manifest.artifacts)} artifacts, {manifest.model.name}",
        )
    )
    checks += file_checks(folder, manifest, hash_files)
    sig_check, sig_status, signer = _signature_check(data, sig, manifest, keys, require_signature)
    checks.append(sig_check)
    return VerifyReport(shown, tuple(checks), sig_status, signer, manifest)


def _file_check(folder: Path, rel: str, entry: Entry, hash_it: bool) -> Check:
    why, found = file_problem(folder, rel, entry, hash_it=hash_it)
    return Check(rel, "ok", found) if why is None else Check(rel, "fail", why, REBUILD)


def file_checks(folder: Path, manifest: Manifest, hash_files: Collection[str] | None = None) -> list[Check]:
    """A check of each file ``manifest`` lists in the bundle ``folder``, and one for anything it does not list.

    ``hash_files``: as ``verify``'s.  The signature is not checked here.
    """
    listing = Listing(manifest)
    checks = [
        _file_check(folder, rel, entry, hash_files is None or rel in hash_files)
        for rel, entry in listing.files.items()
    ]
    extra = extra_paths(folder, listing)
    if extra:
        checks.append(
            Check(
                "extra files",
                "fail",
                f"not in the manifest: {', '.join(extra)}",
                "a bundle holds exactly what its manifest lists; remove them or rebuild the bundle",
            )
        )
    else:
        checks.append(Check("extra files", "ok", "none"))
    return checks


def _signature_check(
    data: bytes, sig: bytes | None, manifest: Manifest, keys: list[tuple[str, Any]], require: bool
) -> tuple[Check, SignatureStatus, str | None]:
    verdict = judge_signature(data, sig, manifest, keys)
    status, kid = verdict.status, verdict.key_id
    if status == "verified":
        return Check("signature", "ok", verdict.detail), status, kid
    if status == "unsigned":
        if require:
            detail = "the bundle is not signed and a signature is required"
            return Check("signature", "fail", detail, _SIGN_HINT), status, kid
        return Check("signature", "warn", verdict.detail, _SIGN_HINT), status, kid
    if status == "unchecked":
        detail = f"signed by key {kid}, not checked: pass --key with that key's .pub.pem"
        hint = "edgekit verify BUNDLE --key KEY.pub.pem"
        return Check("signature", "fail" if require else "warn", detail, hint), status, kid
    hint = "pass the public key of the key that signed it with --key" if verdict.untrusted else REBUILD
    return Check("signature", "fail", verdict.detail, hint), status, kid
