"""File helpers the bundle code shares: copying while hashing, temp folders beside a target, replacing a folder.

Hashing a file, atomic writes and removing a folder are in :mod:`edgekit.core.io`.
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
from pathlib import Path

from edgekit.bundle.manifest import MANIFEST_FILE
from edgekit.core.io import CHUNK
from edgekit.errors import BundleError


def copy_hashed(src: Path, dst: Path) -> tuple[str, int]:
    """Copy ``src`` to ``dst`` and return the hash and size of the bytes copied (read once)."""
    h = hashlib.sha256()
    size = 0
    with src.open("rb") as fin, dst.open("xb") as fout:
        while chunk := fin.read(CHUNK):
            h.update(chunk)
            fout.write(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def temp_beside(target: Path, tag: str) -> Path:
    """A fresh hidden folder next to ``target`` (same filesystem, so a rename into place is atomic)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{tag}-{secrets.token_hex(4)}"
    tmp.mkdir()
    return tmp


def check_replaceable(dest: Path) -> None:
    """Refuse a destination that is a file, or a non-empty folder that is not a bundle.

    Replacing deletes the old folder, so a mistyped ``-o ~`` must not delete a home directory.
    """
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise BundleError(
            f"{dest} exists and is not a folder", "pass a new path, or a bundle folder to replace"
        )
    if dest.is_dir() and any(dest.iterdir()) and not (dest / MANIFEST_FILE).is_file():
        raise BundleError(
            f"{dest} is a folder that holds files but is not a bundle; edgekit will not replace it",
            "pass a new or empty folder, or an existing bundle folder to replace",
        )


def replace_dir(new: Path, dest: Path) -> None:
    """Put the finished folder ``new`` at ``dest``, replacing an old one only once ``new`` is complete."""
    if not dest.exists():
        new.rename(dest)
        return
    old = dest.parent / f".{dest.name}.old-{secrets.token_hex(4)}"
    dest.rename(old)
    try:
        new.rename(dest)
    except OSError:
        old.rename(dest)
        raise
    shutil.rmtree(old, ignore_errors=True)
