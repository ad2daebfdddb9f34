"""Check a bundle: its manifest, every file's SHA-256 and size, no file missing or extra, its signature.

A signature is only ever checked against public keys the caller trusts: a key shipped
inside a bundle would prove nothing, since whoever changed the bundle could change it too.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from edgekit._core.io import CHUNK
from edgekit.bundle.errors import BundleError, VerificationError
from edgekit.bundle.keys import KeyPaths, key_files
from edgekit.bundle.manifest import (
    MANIFEST_FILE,
    SIGNATURE_FILE,
    EvalFrame,
    FileEntry,
    Manifest,
    parse_manifest,
)

Status = Literal["ok", "warn", "fail"]
SignatureStatus = Literal["verified", "unsigned", "unchecked", "invalid", "missing"]

_SIGN_HINT = "make a key with `edgekit keys generate`, then build with `edgekit build ... --sign-key KEY.pem`"
_REBUILD = "rebuild the bundle with edgekit build, or fetch it again from where it was built"


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
            checks.append(Check(rel, "fail", "not listed in the manifest", _REBUILD))
        else:
            checks.append(_file_check(folder, rel, entry, hash_it=True))
    VerifyReport(folder, tuple(checks)).raise_if_failed()


def _load_keys(paths: Sequence[Path]) -> list[tuple[str, Any]]:
    if not paths:
        return []
    from edgekit.bundle.keys import key_id, load_public_key

    keys = [load_public_key(p) for p in paths]
    return [(key_id(k), k) for k in keys]


def _open_plain(path: Path) -> int | None:
    """A read-only descriptor of ``path`` if it is a regular file, opened without following a link; else None.

    ``O_NOFOLLOW`` and an ``fstat`` of the descriptor itself: what is checked is what is read,
    even if the name is swapped for a link in between.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:  # the last component is a link
            return None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _read_plain(path: Path) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (never through a link), else None."""
    fd = _open_plain(path)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _inside(folder: Path, rel: str) -> bool:
    """Whether ``folder/rel`` lies inside ``folder`` with no link on the way (a linked folder would leave it)."""
    return Path(os.path.realpath(folder / rel)) == Path(os.path.realpath(folder)).joinpath(*rel.split("/"))


def _digest_plain(path: Path) -> tuple[str, int] | None:
    """``(sha256, size)`` of ``path`` read through a descriptor opened without following links; None if not a plain file."""
    fd = _open_plain(path)
    if fd is None:
        return None
    h = hashlib.sha256()
    size = 0
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def _verify_folder(
    folder: Path,
    shown: Path,
    keys: list[tuple[str, Any]],
    require_signature: bool,
    hash_files: Collection[str] | None = None,
) -> VerifyReport:
    checks: list[Check] = []
    data = _read_plain(folder / MANIFEST_FILE)
    if data is None:
        checks.append(Check("manifest", "fail", f"no {MANIFEST_FILE} (or it is not a plain file)", _REBUILD))
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
    checks += _file_checks(folder, manifest, hash_files)
    sig_check, sig_status, signer = _signature_check(folder, data, manifest, keys, require_signature)
    checks.append(sig_check)
    return VerifyReport(shown, tuple(checks), sig_status, signer, manifest)


def _file_check(folder: Path, rel: str, entry: FileEntry | EvalFrame, hash_it: bool) -> Check:
    path = folder / rel
    try:
        st = path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return Check(rel, "fail", "missing: the manifest lists it but the bundle does not hold it", _REBUILD)
    if not stat.S_ISREG(st.st_mode) or not _inside(folder, rel):
        return Check(
            rel, "fail", "is a link or special file (or under a linked folder), not a plain file", _REBUILD
        )
    if not hash_it:
        if st.st_size != entry.size:
            return Check(
                rel,
                "fail",
                f"tampered or damaged: {st.st_size:,} bytes, manifest says {entry.size:,} bytes",
                _REBUILD,
            )
        return Check(rel, "ok", f"{st.st_size:,} bytes (not hashed: hashed when loaded)")
    got = _digest_plain(path)
    if got is None:
        return Check(rel, "fail", "is a link or special file, not a plain file", _REBUILD)
    digest, size = got
    if digest != entry.sha256 or size != entry.size:
        return Check(
            rel,
            "fail",
            f"tampered or damaged: sha256 {digest} ({size:,} bytes), manifest says {entry.sha256} ({entry.size:,} bytes)",
            _REBUILD,
        )
    return Check(rel, "ok", f"sha256 {digest[:16]}…, {size:,} bytes")


def _file_checks(folder: Path, manifest: Manifest, hash_files: Collection[str] | None = None) -> list[Check]:
    listed = manifest.files()
    checks = [
        _file_check(folder, rel, entry, hash_files is None or rel in hash_files)
        for rel, entry in listed.items()
    ]
    extra = []
    for root, dirs, files in os.walk(folder):
        for name in [*files, *(d for d in dirs if Path(root, d).is_symlink())]:
            rel = Path(root, name).relative_to(folder).as_posix()
            if rel not in listed and rel not in (MANIFEST_FILE, SIGNATURE_FILE):
                extra.append(rel)
    if extra:
        checks.append(
            Check(
                "extra files",
                "fail",
                f"not in the manifest: {', '.join(sorted(extra))}",
                "a bundle holds exactly what its manifest lists; remove them or rebuild the bundle",
            )
        )
    else:
        checks.append(Check("extra files", "ok", "none"))
    return checks


def _signature_check(
    folder: Path, data: bytes, manifest: Manifest, keys: list[tuple[str, Any]], require: bool
) -> tuple[Check, SignatureStatus, str | None]:
    from_manifest = manifest.signature.key_id if manifest.signature else None
    sig = _read_plain(folder / SIGNATURE_FILE)
    if sig is None and from_manifest is None:
        if require:
            return (
                Check(
                    "signature", "fail", "the bundle is not signed and a signature is required", _SIGN_HINT
                ),
                "unsigned",
                None,
            )
        return (
            Check("signature", "warn", "unsigned: nothing proves who built it", _SIGN_HINT),
            "unsigned",
            None,
        )
    if sig is None:
        detail = f"the manifest says key {from_manifest} signed it, but {SIGNATURE_FILE} is missing"
        return Check("signature", "fail", detail, _REBUILD), "missing", from_manifest
    if from_manifest is None:
        detail = f"{SIGNATURE_FILE} is present but the manifest names no signer (edgekit never writes that)"
        return Check("signature", "fail", detail, _REBUILD), "invalid", None
    if not keys:
        detail = f"signed by key {from_manifest}, not checked: pass --key with that key's .pub.pem"
        status: Status = "fail" if require else "warn"
        return (
            Check("signature", status, detail, "edgekit verify BUNDLE --key KEY.pub.pem"),
            "unchecked",
            from_manifest,
        )

    from edgekit.bundle.keys import signature_valid

    for kid, key in keys:
        if signature_valid(key, data, sig):
            if kid != from_manifest:
                detail = f"valid signature by key {kid}, but the manifest names key {from_manifest}"
                return Check("signature", "fail", detail, _REBUILD), "invalid", kid
            return Check("signature", "ok", f"valid Ed25519 signature by trusted key {kid}"), "verified", kid
    ids = ", ".join(k for k, _ in keys)
    if from_manifest in {k for k, _ in keys}:
        detail = (
            f"bad signature: {MANIFEST_FILE} does not match key {from_manifest}'s signature "
            "(changed after signing, or the signature is damaged)"
        )
        return Check("signature", "fail", detail, _REBUILD), "invalid", from_manifest
    detail = f"signed by key {from_manifest}, which is not a trusted key (given: {ids})"
    return (
        Check("signature", "fail", detail, "pass the public key of the key that signed it with --key"),
        "invalid",
        from_manifest,
    )
