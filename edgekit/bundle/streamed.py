"""A bundle checked as it is read, before anything is written: its header, then every member.

The device's install uses this for a received bundle: ``read_header`` reads ``manifest.json``
and ``manifest.sig`` only (from the head of an archive, where ``pack`` writes them), so the
signature is checked before the bulk is even read; ``check_archive`` then streams the archive
once, admitting each member by the same rules ``unpack`` uses (``integrity.MemberRules``) plus
the signed manifest's listing, and hashing each file.  Both raise a ``BundleError``
(``UnsafeArchiveError``, ``VerificationError``) that names the problem.
"""

from __future__ import annotations

import gzip
import tarfile
import zlib
from pathlib import Path

from edgekit.bundle.archive import is_archive_name
from edgekit.bundle.integrity import (
    HEADER_FILES,
    MAX_UNPACKED_BYTES,
    REBUILD,
    Listing,
    MemberRules,
    digest_mismatch,
    digest_stream,
    header_too_big,
    plain_name,
    read_header_file,
)
from edgekit.bundle.manifest import MANIFEST_FILE, SIGNATURE_FILE, Manifest
from edgekit.errors import BundleError, VerificationError

HEADER_MEMBERS = 8  # edgekit's pack writes manifest.json and manifest.sig first
_DAMAGED = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile)


def read_header(bundle: Path) -> tuple[bytes, bytes | None]:
    """``manifest.json`` and ``manifest.sig`` (None if absent) of a bundle folder or archive."""
    if bundle.is_dir():
        data = read_header_file(bundle, MANIFEST_FILE)
        if data is None:
            raise BundleError(f"{bundle} has no {MANIFEST_FILE}: it is not a bundle", REBUILD)
        return data, read_header_file(bundle, SIGNATURE_FILE)
    if not bundle.is_file():
        raise BundleError(f"{bundle} does not exist", "pass a bundle folder or .tar.gz")
    if not is_archive_name(bundle) and not _looks_gzip(bundle):
        raise BundleError(f"{bundle} is neither a bundle folder nor a .tar.gz", REBUILD)
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(bundle, mode="r|*") as tar:
            for count, member in enumerate(tar, 1):
                name = plain_name(member.name)
                if name in HEADER_FILES and member.isreg():
                    if name in found:
                        raise BundleError(f"{bundle} holds {name} twice", REBUILD)
                    too_big = header_too_big(name, member.size)
                    if too_big is not None:
                        raise BundleError(too_big, REBUILD)
                    f = tar.extractfile(member)
                    found[name] = f.read() if f is not None else b""
                if len(found) == len(HEADER_FILES) or count >= HEADER_MEMBERS:
                    break
    except (*_DAMAGED, OSError) as err:
        raise BundleError(
            f"{bundle} is not a readable bundle archive ({err})", "fetch it again: it is damaged"
        ) from err
    if MANIFEST_FILE not in found:
        raise BundleError(
            f"{bundle} does not start with {MANIFEST_FILE} (edgekit's pack always writes it first)", REBUILD
        )
    return found[MANIFEST_FILE], found.get(SIGNATURE_FILE)


def _looks_gzip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(2) == b"\x1f\x8b"


def check_archive(archive: Path, manifest: Manifest, *, max_bytes: int = MAX_UNPACKED_BYTES) -> None:
    """Stream ``archive`` once: every member admitted by ``MemberRules`` against ``manifest``, every file hashed.

    The header files are not hashed here: their bytes are the ones ``read_header`` returned
    for the signature check (a second copy is refused as a duplicate).
    """
    listing = Listing(manifest)
    rules = MemberRules(archive.name, listing=listing, max_bytes=max_bytes)

    def bad(why: str) -> VerificationError:
        return VerificationError(f"{archive.name}: {why}; nothing was written", REBUILD)

    try:
        with tarfile.open(archive, mode="r|*") as tar:
            for member in tar:
                name = rules.admit(member)
                if member.isdir() or name in HEADER_FILES:
                    continue
                digest, size = digest_stream(tar.extractfile(member))
                why = digest_mismatch(digest, size, listing.files[name])
                if why is not None:
                    raise bad(f"{name}: {why}")
    except _DAMAGED as err:
        raise bad(f"the archive is damaged or truncated ({err or type(err).__name__})") from err
    except OSError as err:
        raise bad(f"the archive cannot be read ({err})") from err
    missing = listing.missing(rules.files)
    if missing:
        raise bad(
            f"missing from the archive: {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else "")
        )
