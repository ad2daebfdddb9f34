"""Writing files whole or not at all, hashing files, removing folders: the one copy of each.

An atomic write is a temp file beside the target (same folder, so same filesystem), written,
flushed and fsynced, ``os.replace``-d over the target, then the folder fsynced so the rename
itself survives a power loss.  Every temp name holds :data:`TMP_MARK` and starts with ".",
so a crash leaves only names a clean-up (the deploy agent's ``recover()``) knows to delete.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

CHUNK = 1 << 20
TMP_MARK = ".tmp-"  # every temp name of ours starts with "." and holds this
DEFAULT_MODE = 0o644  # a new file's mode when none is given (less what the umask takes away)


def temp_name(path: Path, suffix: str = "") -> Path:
    """A fresh hidden temp name beside ``path``: ``.NAME.tmp-XXXXXXXX[SUFFIX]``."""
    return path.with_name(f".{path.name}{TMP_MARK}{secrets.token_hex(4)}{suffix}")


def fsync_dir(path: Path) -> None:
    """Make a rename, a new file or a removal in the folder ``path`` durable (POSIX needs the folder synced)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """fsync the file at ``path`` (one written by someone else, e.g. an exporter given a path)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, mode: int | None = None, replace: bool = True) -> None:
    """Write ``path`` whole or not at all: a temp file beside it, fsync, ``os.replace``, fsync the folder.

    ``mode``: the new file is created with it (never wider, not even for a moment) and then
    set to exactly it, whatever the umask took away; None: ``0o644`` less the umask.
    ``replace=False`` refuses to write over an existing file (``FileExistsError``), with no
    check-then-write race: the temp file is hard-linked into place.
    """
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, DEFAULT_MODE if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)  # the umask may have taken bits away from O_CREAT's mode
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if path exists
            tmp.unlink()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_path(path: Path, *, suffix: str = "", mode: int | None = None) -> Iterator[Path]:
    """A temp path beside ``path`` for a writer that wants a file name (an exporter, a copy).

    When the block ends normally the file written there is fsynced (and given ``mode``, when
    set), renamed over ``path`` and the folder fsynced; when it raises, the temp is removed
    (whatever the writer left: a file or a folder).  ``suffix`` keeps an extension a writer
    looks at (``.onnx``).
    """
    tmp = temp_name(path, suffix)
    try:
        yield tmp
        if mode is not None:
            tmp.chmod(mode)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        remove_tree(tmp)
        raise
    fsync_dir(path.parent)


def digest_file(path: Path) -> tuple[str, int]:
    """``(hex SHA-256, size in bytes)`` of the file at ``path``, read in chunks."""
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of the file at ``path``, read in chunks (the hash a bundle manifest records)."""
    return digest_file(path)[0]


def remove_tree(path: Path) -> None:
    """Remove a folder (or a file or link) of ours; quick to be interrupted safely: rename first, then delete.

    A kill during ``rmtree`` leaves a half-deleted folder; renamed to a temp name first, it
    is one that a clean-up deletes, never one that looks like something else.  A missing
    ``path`` is not an error; nor is a file left undeletable inside the renamed folder.
    """
    if not path.exists() and not path.is_symlink():
        return
    if path.is_dir() and not path.is_symlink():
        trash = temp_name(path)
        path.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
