"""Every rule a bundle is checked by, in one place: its archive's members, its files, its signature.

Two paths apply them and must never disagree.  ``verify`` checks a folder (an archive is
first unpacked by ``unpack``, which admits each member with ``MemberRules``).  The device's
install checks an archive while it streams it, before a byte is written
(``edgekit.bundle.streamed``): the same ``MemberRules``, given the signed manifest's
``Listing``.  A rule says why it refuses; each path words the failure for its reader (a
``Check`` line, ``UnsafeArchiveError``, a failed install step).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tarfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Literal

from edgekit.bundle.manifest import MANIFEST_FILE, SIGNATURE_FILE, EvalFrame, FileEntry, Manifest
from edgekit.core.io import CHUNK
from edgekit.errors import BundleError, UnsafeArchiveError

MAX_UNPACKED_BYTES = 2 << 30  # 2 GiB: far above any edge model bundle, far below a full disk
MAX_MEMBERS = 10_000
MAX_HEADER_BYTES = 4 << 20  # manifest.json of a bundle with dozens of artifacts is ~100 kB
HEADER_FILES = (MANIFEST_FILE, SIGNATURE_FILE)

REBUILD = "rebuild the bundle with edgekit build, or fetch it again from where it was built"
UNSAFE = "do not use this archive: a bundle written by edgekit never holds such a member"

Entry = FileEntry | EvalFrame
SignatureStatus = Literal["verified", "unsigned", "unchecked", "invalid", "missing"]


# -- what the manifest lists -----------------------------------------------------------------


class Listing:
    """What a bundle must hold, exactly: the files its manifest lists, the folders they sit in, its header."""

    def __init__(self, manifest: Manifest) -> None:
        self.files: dict[str, Entry] = manifest.files()
        self.folders = frozenset(
            "/".join(p.split("/")[:i]) for p in self.files for i in range(1, p.count("/") + 1)
        )

    @property
    def member_cap(self) -> int:
        """The most members an archive of this bundle has: every file and folder, the header, a ``.``."""
        return len(self.files) + len(self.folders) + len(HEADER_FILES) + 1

    def unlisted(self, rel: str, *, folder: bool) -> bool:
        """Whether ``rel`` (a file, or a ``folder``) is something the manifest does not account for."""
        if folder:
            return rel not in self.folders
        return rel not in self.files and rel not in HEADER_FILES

    def missing(self, found: Collection[str]) -> list[str]:
        """The listed files not in ``found``, sorted."""
        return sorted(set(self.files) - set(found))


def size_mismatch(size: int, entry: Entry) -> str | None:
    """Why a file of ``size`` bytes is not ``entry``; None when the size is right."""
    if size == entry.size:
        return None
    return f"tampered or damaged: {size:,} bytes, the manifest says {entry.size:,} bytes"


def digest_mismatch(digest: str, size: int, entry: Entry) -> str | None:
    """Why bytes with SHA-256 ``digest`` and ``size`` are not ``entry``'s; None when they are."""
    if digest == entry.sha256 and size == entry.size:
        return None
    return (
        f"tampered or damaged: SHA-256 {digest} ({size:,} bytes), "
        f"the manifest says {entry.sha256} ({entry.size:,} bytes)"
    )


def header_too_big(name: str, size: int) -> str | None:
    """Why a header file (``manifest.json``, ``manifest.sig``) of ``size`` bytes is refused unread; None if not."""
    if size <= MAX_HEADER_BYTES:
        return None
    return f"{name} is larger than {MAX_HEADER_BYTES:,} bytes"


def digest_stream(source: IO[bytes] | None) -> tuple[str, int]:
    """``(sha256, size)`` of what ``source`` reads until its end (an empty stream for None)."""
    h = hashlib.sha256()
    size = 0
    while source is not None and (chunk := source.read(CHUNK)):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


# -- archive members -------------------------------------------------------------------------


def plain_name(name: str) -> str:
    """A member's name without ``.`` parts or repeated slashes (``./a//b`` is ``a/b``)."""
    return "/".join(p for p in PurePosixPath(name).parts if p != ".")


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why ``member`` on its own could land outside the folder or is no plain file; None if it is safe."""
    name = member.name
    if "\x00" in name or "\\" in name:
        return "has a NUL or backslash in its name"
    if name.startswith("/") or name[1:2] == ":":  # a Windows drive too ("C:..."), whatever the letter
        return "has an absolute path"
    if ".." in PurePosixPath(name).parts:
        return "has a '..' component (it would land outside the bundle)"
    if member.issym() or member.islnk():
        kind = "symlink" if member.issym() else "hard link"
        return f"is a {kind} (to {member.linkname!r}); a bundle holds plain files only"
    if not (member.isreg() or member.isdir()):
        return "is a device file, FIFO or other special file"
    return None


class MemberRules:
    """Admits an archive's members one at a time, in order; ``UnsafeArchiveError`` at the first bad one.

    Every member: safe on its own (``member_problem``), a name (only a folder may be the
    archive's ``.``), not twice and not clashing with another (a file where a folder is, a
    file under a file), at most ``max_members`` members and ``max_bytes`` bytes in all, and accepted by the
    standard library's ``data_filter`` where it has one.  Given the signed manifest's
    ``listing``, also: each file is one it lists (or the header), with its size; each folder
    holds a listed file; and no more members than that accounts for.  Read in streaming
    mode, the caps stop a tar bomb before its bulk is even decompressed.
    """

    def __init__(
        self,
        where: str,
        *,
        listing: Listing | None = None,
        max_members: int = MAX_MEMBERS,
        max_bytes: int = MAX_UNPACKED_BYTES,
        into: Path | None = None,
    ) -> None:
        self.where, self.listing, self.max_bytes = where, listing, max_bytes
        self.max_members = max_members if listing is None else min(max_members, listing.member_cap)
        # data_filter judges a name against a folder; before one exists, any absolute path serves.
        self.into = str(into) if into is not None else "/edgekit-bundle"
        self.count = self.total = 0
        self.files: set[str] = set()
        self.dirs: set[str] = set()

    def refuse(self, why: str, hint: str = UNSAFE) -> UnsafeArchiveError:
        return UnsafeArchiveError(f"{self.where}: {why}; nothing was written", hint)

    def admit(self, member: tarfile.TarInfo) -> str:
        """``member``'s normalised name once it passes every rule (``""`` for the archive's own ``.``)."""
        raw = member.name
        why = member_problem(member)
        if why is not None:
            raise self.refuse(f"member {raw!r} {why}")
        self.count += 1
        if self.count > self.max_members:
            said = "its manifest lists" if self.listing is not None else "a bundle holds"
            raise self.refuse(
                f"it holds more than {self.max_members} members (more than {said})",
                "a bundle holds a handful of files: do not use this archive",
            )
        self.total += member.size
        if self.total > self.max_bytes:
            raise self.refuse(
                f"it unpacks to more than {self.max_bytes:,} bytes",
                "a bundle this large is not one edgekit wrote: do not use this archive",
            )
        self._second_opinion(member)
        name = plain_name(raw)
        if not name:
            if member.isdir():
                return ""
            raise self.refuse(f"member {raw!r} is a file with no name")
        parents = {"/".join(name.split("/")[:i]) for i in range(1, name.count("/") + 1)}
        if name in self.files or (member.isreg() and name in self.dirs) or parents & self.files:
            raise self.refuse(f"member {name!r} appears twice or clashes with another")
        if self.listing is not None:
            self._listed(member, name)
        if member.isdir():
            self.dirs.add(name)
        else:
            self.files.add(name)
            self.dirs.update(parents)
        return name

    def _second_opinion(self, member: tarfile.TarInfo) -> None:
        data_filter = getattr(tarfile, "data_filter", None)  # Python 3.12, 3.11.4+, 3.10.12+
        if data_filter is None:
            return
        try:  # the standard library's own rules, after ours
            data_filter(member, self.into)
        except tarfile.FilterError as err:
            raise self.refuse(f"member {member.name!r} refused: {err}", "do not use this archive") from err

    def _listed(self, member: tarfile.TarInfo, name: str) -> None:
        assert self.listing is not None
        what = "folder" if member.isdir() else "member"
        if self.listing.unlisted(name, folder=member.isdir()):
            raise self.refuse(f"{what} {member.name!r} is not in the signed manifest", REBUILD)
        if member.isdir():
            return
        if name in HEADER_FILES:
            why = header_too_big(name, member.size)
            if why is not None:
                raise self.refuse(why, REBUILD)
            return
        why = size_mismatch(member.size, self.listing.files[name])
        if why is not None:
            raise self.refuse(f"{name}: {why}", REBUILD)


# -- a bundle folder's files -------------------------------------------------------------------


def open_plain(path: Path) -> int | None:
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


def read_header_file(folder: Path, name: str) -> bytes | None:
    """``folder/name`` (``manifest.json`` or ``.sig``): None if absent; ``BundleError`` if no plain file or too big."""
    path = folder / name
    fd = open_plain(path)
    if fd is None:
        if path.is_symlink() or path.exists():
            raise BundleError(f"{name} in {folder} is not a plain file", REBUILD)
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_HEADER_BYTES + 1)
    why = header_too_big(name, len(data))
    if why is not None:
        raise BundleError(why, REBUILD)
    return data


def inside(folder: Path, rel: str) -> bool:
    """Whether ``folder/rel`` lies inside ``folder`` with no link on the way (a linked folder would leave it)."""
    return Path(os.path.realpath(folder / rel)) == Path(os.path.realpath(folder)).joinpath(*rel.split("/"))


def file_problem(folder: Path, rel: str, entry: Entry, *, hash_it: bool) -> tuple[str | None, str]:
    """``(why it fails, what was found)`` for the listed file ``folder/rel``; why is None when it passes."""
    path = folder / rel
    try:
        st = path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return "missing: the manifest lists it but the bundle does not hold it", ""
    if not stat.S_ISREG(st.st_mode) or not inside(folder, rel):
        return "is a link or special file (or under a linked folder), not a plain file", ""
    if not hash_it:
        found = f"{st.st_size:,} bytes (not hashed: hashed when loaded)"
        return size_mismatch(st.st_size, entry), found
    fd = open_plain(path)
    if fd is None:
        return "is a link or special file, not a plain file", ""
    with os.fdopen(fd, "rb") as f:
        digest, size = digest_stream(f)
    return digest_mismatch(digest, size, entry), f"sha256 {digest[:16]}…, {size:,} bytes"


def extra_paths(folder: Path, listing: Listing) -> list[str]:
    """What ``folder`` holds that the manifest does not list: files, links, and folders (with a ``/``)."""
    extra = []
    for root, dirs, files in os.walk(folder):
        for name in files:
            rel = Path(root, name).relative_to(folder).as_posix()
            if listing.unlisted(rel, folder=False):
                extra.append(rel)
        for name in dirs:
            rel = Path(root, name).relative_to(folder).as_posix()
            if Path(root, name).is_symlink():
                if listing.unlisted(rel, folder=False):
                    extra.append(rel)
            elif listing.unlisted(rel, folder=True):
                extra.append(rel + "/")
    return sorted(extra)


# -- the signature -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SignatureVerdict:
    """How a manifest's signature stands against the trusted keys; ``detail`` says why, neutrally worded.

    ``untrusted``: signed, but by a key that is not among those trusted (callers name the
    remedy their reader has: ``--key``, or ``edgekit agent trust``).
    """

    status: SignatureStatus
    key_id: str | None
    detail: str
    untrusted: bool = False


def judge_signature(
    data: bytes, sig: bytes | None, manifest: Manifest, keys: Sequence[tuple[str, Any]]
) -> SignatureVerdict:
    """The one rule: ``sig`` is a valid signature of ``data`` by the trusted key the manifest names.

    ``keys`` are ``(key id, public key)`` pairs; none gives ``unchecked`` for a signed bundle.
    """
    signer = manifest.signature.key_id if manifest.signature else None
    if sig is None and signer is None:
        return SignatureVerdict("unsigned", None, "unsigned: nothing proves who built it")
    if sig is None:
        why = f"the manifest says key {signer} signed it, but {SIGNATURE_FILE} is missing"
        return SignatureVerdict("missing", signer, why)
    if signer is None:
        why = f"{SIGNATURE_FILE} is present but the manifest names no signer (edgekit never writes that)"
        return SignatureVerdict("invalid", None, why)
    if not keys:
        return SignatureVerdict("unchecked", signer, f"signed by key {signer}, not checked against any key")

    from edgekit.bundle.keys import signature_valid

    for kid, key in keys:
        if signature_valid(key, data, sig):
            if kid != signer:
                why = f"valid signature by key {kid}, but the manifest names key {signer}"
                return SignatureVerdict("invalid", kid, why)
            return SignatureVerdict("verified", kid, f"valid Ed25519 signature by trusted key {kid}")
    ids = [k for k, _ in keys]
    if signer in ids:
        why = (
            f"bad signature: {MANIFEST_FILE} does not match key {signer}'s signature "
            "(changed after signing, or the signature is damaged)"
        )
        return SignatureVerdict("invalid", signer, why)
    why = f"signed by key {signer}, which is not a trusted key (given: {', '.join(ids)})"
    return SignatureVerdict("invalid", signer, why, untrusted=True)
