"""The install's first two steps: a received bundle's signature and hashes, checked before it touches the disk.

``signature``: ``manifest.json`` and ``manifest.sig`` (only those: read from the head of an
archive) checked against the state root's trusted keys.  ``hashes``: every file against the
signed manifest's SHA-256 and size, no file missing or extra, no link or odd member — for an
archive while streaming it.  A refusal raises ``StepFailed``, which ``edgekit.deploy.install``
turns into a failed result.
"""

from __future__ import annotations

import gzip
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    from edgekit.bundle.manifest import Manifest

MAX_HEADER_BYTES = 4 << 20  # manifest.json of a bundle with dozens of artifacts is ~100 kB
HEADER_MEMBERS = 8  # edgekit's pack writes manifest.json and manifest.sig first

REBUILD = "fetch the bundle again from where it was built, or rebuild it with edgekit build"


class StepFailed(Exception):
    """A step refused the bundle: unwinds to ``install``, which turns it into a failed result."""

    def __init__(self, step: str, reason: str, hint: str = "", health: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.step, self.reason, self.hint, self.health = step, reason, hint, health


# -- signature ---------------------------------------------------------------------------


def _read_header(bundle: Path) -> tuple[bytes, bytes | None]:
    """``manifest.json`` and ``manifest.sig`` (None if absent) of a bundle folder or archive."""
    from edgekit.bundle import MANIFEST_FILE, SIGNATURE_FILE, is_archive_name

    if bundle.is_dir():
        found = {}
        for name in (MANIFEST_FILE, SIGNATURE_FILE):
            path = bundle / name
            if path.is_symlink() or (path.exists() and not path.is_file()):
                raise StepFailed("signature", f"{name} in {bundle} is not a plain file", REBUILD)
            if path.is_file():
                if path.stat().st_size > MAX_HEADER_BYTES:
                    raise StepFailed(
                        "signature", f"{name} is larger than {MAX_HEADER_BYTES:,} bytes", REBUILD
                    )
                found[name] = path.read_bytes()
        if MANIFEST_FILE not in found:
            raise StepFailed("signature", f"{bundle} has no {MANIFEST_FILE}: it is not a bundle", REBUILD)
        return found[MANIFEST_FILE], found.get(SIGNATURE_FILE)
    if not bundle.is_file():
        raise StepFailed("signature", f"{bundle} does not exist", "pass a bundle folder or .tar.gz")
    if not is_archive_name(bundle) and not _looks_gzip(bundle):
        raise StepFailed("signature", f"{bundle} is neither a bundle folder nor a .tar.gz", REBUILD)
    found = {}
    try:
        with tarfile.open(bundle, mode="r|*") as tar:
            for count, member in enumerate(tar, 1):
                name = _plain_name(member.name)
                if name in (MANIFEST_FILE, SIGNATURE_FILE) and member.isreg():
                    if name in found:
                        raise StepFailed("signature", f"{bundle} holds {name} twice", REBUILD)
                    if member.size > MAX_HEADER_BYTES:
                        raise StepFailed(
                            "signature", f"{name} is larger than {MAX_HEADER_BYTES:,} bytes", REBUILD
                        )
                    f = tar.extractfile(member)
                    found[name] = f.read() if f is not None else b""
                if len(found) == 2 or count >= HEADER_MEMBERS:
                    break
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, OSError) as err:
        raise StepFailed(
            "signature", f"{bundle} is not a readable bundle archive ({err})", "fetch it again: it is damaged"
        ) from err
    if MANIFEST_FILE not in found:
        raise StepFailed(
            "signature",
            f"{bundle} does not start with {MANIFEST_FILE} (edgekit's pack always writes it first)",
            REBUILD,
        )
    return found[MANIFEST_FILE], found.get(SIGNATURE_FILE)


def _looks_gzip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _plain_name(name: str) -> str:
    return "/".join(p for p in PurePosixPath(name).parts if p != ".")


def check_signature(bundle: Path, keys: list[Path]) -> tuple[bytes, bytes | None, Manifest]:
    """The manifest, once its signature by one of ``keys`` is checked; ``StepFailed`` otherwise."""
    from edgekit.bundle import key_id, load_public_key, parse_manifest
    from edgekit.bundle.keys import signature_valid

    if not keys:
        raise StepFailed(
            "signature",
            "this device trusts no signing key, so it accepts no bundle",
            "add the builder's public key: edgekit agent trust KEY.pub.pem",
        )
    data, sig = _read_header(bundle)
    try:
        manifest = parse_manifest(data)
    except EdgekitError as err:
        raise StepFailed("signature", err.message, err.hint) from err
    if sig is None or manifest.signature is None:
        raise StepFailed(
            "signature",
            "the bundle is not signed; this device installs signed bundles only",
            "build it with --sign-key KEY.pem (edgekit keys generate makes one)",
        )
    signer = manifest.signature.key_id
    trusted = {}
    for path in keys:
        try:
            key = load_public_key(path)
        except EdgekitError:
            continue  # one damaged key file must not lock the device out; status shows it
        trusted[key_id(key)] = key
    if signer not in trusted:
        raise StepFailed(
            "signature",
            f"signed by key {signer}, which this device does not trust (trusted: {', '.join(sorted(trusted)) or 'none'})",
            "sign with a trusted key, or trust this one: edgekit agent trust KEY.pub.pem",
        )
    if not signature_valid(trusted[signer], data, sig):
        raise StepFailed(
            "signature",
            f"bad signature: manifest.json does not match key {signer}'s signature "
            "(changed after signing, or the signature is damaged)",
            REBUILD,
        )
    return data, sig, manifest


# -- hashes --------------------------------------------------------------------------------


def check_hashes(bundle: Path, manifest: Manifest, keys: list[Path]) -> None:
    """Every file of ``bundle`` against the signed manifest; ``StepFailed`` (step ``hashes``) otherwise."""
    if bundle.is_dir():
        from edgekit.bundle import verify

        try:
            report = verify(bundle, keys, require_signature=True)
        except EdgekitError as err:
            raise StepFailed("hashes", err.message, err.hint) from err
        if not report.ok:
            raise StepFailed(
                "hashes",
                "; ".join(f"{c.name}: {c.detail}" for c in report.failures),
                next((c.hint for c in report.failures if c.hint), REBUILD),
            )
        return
    _hash_archive(bundle, manifest)


def _hash_archive(archive: Path, manifest: Manifest) -> None:
    """Stream the archive once: every member a plain file the manifest lists, with its hash and size."""
    import hashlib

    from edgekit.bundle import MANIFEST_FILE, SIGNATURE_FILE

    listed = manifest.files()
    folders = {"/".join(p.split("/")[:i]) for p in listed for i in range(1, p.count("/") + 1)}
    seen: set[str] = set()

    def bad(why: str) -> StepFailed:
        return StepFailed("hashes", f"{archive.name}: {why}; nothing was written", REBUILD)

    try:
        with tarfile.open(archive, mode="r|*") as tar:
            for count, member in enumerate(tar, 1):
                raw = member.name
                if count > len(listed) + len(folders) + 3:
                    raise bad("it holds more members than its manifest lists")
                if raw.startswith("/") or (len(raw) > 1 and raw[1] == ":"):
                    raise bad(f"member {raw!r} has an absolute path")
                if ".." in PurePosixPath(raw).parts:
                    raise bad(f"member {raw!r} has a '..' component (it would land outside the bundle)")
                if member.issym() or member.islnk():
                    kind = "symlink" if member.issym() else "hard link"
                    raise bad(
                        f"member {raw!r} is a {kind} to {member.linkname!r}; a bundle holds plain files only"
                    )
                name = _plain_name(raw)
                if member.isdir():
                    if name and name not in folders:
                        raise bad(f"folder {raw!r} is not in the signed manifest")
                    continue
                if not member.isreg():
                    raise bad(f"member {raw!r} is a device, FIFO or other special file")
                if name in seen:
                    raise bad(f"member {raw!r} appears twice")
                seen.add(name)
                if name in (MANIFEST_FILE, SIGNATURE_FILE):
                    continue  # checked by the signature step; unpack writes the checked bytes' copy
                entry = listed.get(name)
                if entry is None:
                    raise bad(f"member {raw!r} is not in the signed manifest")
                if member.size != entry.size:
                    raise bad(f"{name} is {member.size:,} bytes, the manifest says {entry.size:,}")
                source = tar.extractfile(member)
                h = hashlib.sha256()
                got = 0
                while source is not None and (chunk := source.read(1 << 20)):
                    h.update(chunk)
                    got += len(chunk)
                if got != entry.size or h.hexdigest() != entry.sha256:
                    raise bad(f"{name} does not match the manifest's SHA-256 (tampered or damaged)")
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise bad(f"the archive is damaged or truncated ({err or type(err).__name__})") from err
    except OSError as err:
        raise bad(f"the archive cannot be read ({err})") from err
    missing = sorted(set(listed) - seen)
    if missing:
        raise bad(
            f"missing from the archive: {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else "")
        )
