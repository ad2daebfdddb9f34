"""A bundle as one ``.tar.gz`` file, and the only way edgekit opens one: a checked, capped unpack.

``unpack`` trusts nothing in an archive: it extracts regular files and folders only, each
admitted by ``edgekit.bundle.integrity.MemberRules`` before a byte is written (no absolute
names, no ``..``, no links of any kind, no device files, no duplicates, capped size and
member count against tar bombs), and writes into a temp folder that is renamed into place
only when everything is out.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from edgekit.bundle._fs import check_replaceable, replace_dir, temp_beside
from edgekit.bundle.integrity import MAX_MEMBERS, MAX_UNPACKED_BYTES, MemberRules
from edgekit.bundle.manifest import MANIFEST_FILE, read_manifest
from edgekit.core.io import CHUNK, atomic_path, remove_tree
from edgekit.errors import BundleError

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")


def is_archive_name(path: Path) -> bool:
    """True when ``path`` is named like a bundle archive (``.tar.gz`` or ``.tgz``)."""
    return path.name.endswith(ARCHIVE_SUFFIXES)


def _members(bundle_dir: Path) -> list[tuple[str, Path]]:
    out = []
    for root, dirs, files in os.walk(bundle_dir):
        dirs.sort()
        for name in [*sorted(files), *(d for d in dirs if Path(root, d).is_symlink())]:
            path = Path(root, name)
            rel = path.relative_to(bundle_dir).as_posix()
            mode = path.lstat().st_mode
            if not stat.S_ISREG(mode):
                raise BundleError(
                    f"{path} is not a regular file (a link or a device); a bundle holds plain files only",
                    "rebuild the bundle with edgekit build",
                )
            out.append((rel, path))
    return out


def pack(bundle_dir: Path, out_tar: Path) -> Path:
    """Write the bundle folder ``bundle_dir`` as the gzip'd tar ``out_tar`` (atomically); return it.

    Members sit at the archive's top level (``manifest.json``, ``artifacts/...``) with
    owner, permissions and times normalised, so one bundle always packs to the same bytes.
    """
    manifest = read_manifest(bundle_dir)  # refuse to pack something that is not a bundle
    out_tar = out_tar.absolute()
    if out_tar.is_relative_to(bundle_dir.absolute()):
        raise BundleError(f"{out_tar} is inside the bundle {bundle_dir}", "write the archive somewhere else")
    mtime = int(manifest.build.created.timestamp())
    members = _members(bundle_dir)
    out_tar.parent.mkdir(parents=True, exist_ok=True)
    with (
        atomic_path(out_tar, mode=0o644) as tmp,
        tmp.open("xb") as raw,
        # Level 1: model weights barely compress (87 -> 82 MB at level 9), and level 9 spent
        # five of a deploy's fourteen seconds here. Still deterministic.
        # filename="": the temp name must not go into the gzip header (same bundle, same bytes).
        gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0, compresslevel=1) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for rel, path in members:
            info = tarfile.TarInfo(rel)
            info.size = path.stat().st_size
            info.mode = 0o644
            info.mtime = mtime
            with path.open("rb") as f:
                tar.addfile(info, f)
    return out_tar


def unpack(
    archive: Path,
    dest: Path,
    *,
    max_bytes: int = MAX_UNPACKED_BYTES,
    max_members: int = MAX_MEMBERS,
) -> Path:
    """Unpack the bundle archive ``archive`` into the folder ``dest``, safely and all or nothing.

    ``dest`` must be new, empty, or an existing bundle (which is replaced once the new one
    is complete).  Raises ``UnsafeArchiveError`` for any member that is a link, a device
    file, absolute, has ``..``, or appears twice, and when the members add up to more than
    ``max_bytes`` bytes or ``max_members`` entries.  Nothing is left behind on failure.
    """
    if not archive.is_file():
        if not (archive.exists() or archive.is_symlink()):
            where = "" if archive.is_absolute() else f" (looked for in {Path.cwd()})"
            raise BundleError(
                f"{archive} does not exist{where}", "pass a bundle folder or .tar.gz written by edgekit build"
            )
        raise BundleError(f"{archive} is not a file", "pass a bundle .tar.gz made by edgekit build or pack")
    dest = dest.absolute()
    check_replaceable(dest)
    tmp = temp_beside(dest, "unpack")
    try:
        _extract(archive, tmp, max_bytes, max_members)
        if not (tmp / MANIFEST_FILE).is_file():
            raise BundleError(
                f"{archive} holds no top-level {MANIFEST_FILE}: it is not a bundle",
                "pass a bundle archive made by edgekit build or edgekit.bundle.pack",
            )
        replace_dir(tmp, dest)
    except BaseException:
        remove_tree(tmp)
        raise
    return dest


def _extract(archive: Path, into: Path, max_bytes: int, max_members: int) -> None:
    rules = MemberRules(str(archive), max_members=max_members, max_bytes=max_bytes, into=into)
    try:
        with tarfile.open(archive, mode="r|*") as tar:  # streaming: each header once, in order
            for member in tar:
                name = rules.admit(member)
                if not name:
                    continue  # the archive's own "." entry
                target = into / name
                if not target.resolve().is_relative_to(into.resolve()):  # what the names imply, on disk
                    raise rules.refuse(f"member {name!r} leaves the folder")
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                if source is None:  # pragma: no cover - isreg() members always have data
                    raise rules.refuse(f"member {name!r} has no data")
                _copy(source, target, member.size)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise BundleError(
            f"{archive} is not a readable bundle archive ({err})", "pass a .tar.gz written by edgekit"
        ) from err


def _copy(source: IO[bytes], target: Path, size: int) -> None:
    written = 0
    with target.open("xb") as out:
        while chunk := source.read(min(CHUNK, size - written)):
            out.write(chunk)
            written += len(chunk)
    target.chmod(0o644)  # never keep an archive's modes (setuid, world-writable)


@contextlib.contextmanager
def open_bundle(bundle: Path) -> Iterator[Path]:
    """Yield a bundle folder for ``bundle``: the folder itself, or an archive unpacked to a temp folder."""
    if bundle.is_dir():
        yield bundle
        return
    with tempfile.TemporaryDirectory(prefix="edgekit-bundle-") as tmp:
        yield unpack(bundle, Path(tmp) / "bundle")
