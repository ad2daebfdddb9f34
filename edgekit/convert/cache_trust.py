"""Whether a build-cache entry is one this user wrote, whole: a per-user key and a sealed entry.

A cache directory is often shared — a CI cache restored from a store other jobs write to, a
``$EDGEKIT_CACHE`` on a shared disk — so what is in it may have been damaged by bad luck or
written by someone else.  A hash of each file inside the entry catches the first but not the
second: whoever can rewrite a file can rewrite its hash beside it.  So each ``entry.json`` is
sealed with an HMAC-SHA256 under a key that lives *outside* the cache, in this user's config
directory (``$XDG_CONFIG_HOME/edgekit/cache.key``, ``~/.config/edgekit/cache.key``; or the file
``$EDGEKIT_CACHE_KEY_FILE`` names), created on first use with mode 0600.  The seal covers the
entry's cache key and step (so an entry cannot be moved to another key) and the SHA-256 and
size of every file it holds; a file is copied out of the cache, hashed as it is copied, and
used only when every copy matches.  An entry written under another key, damaged, or
malformed is not trusted, and the step is built again.

The key is trusted only when it is a regular file owned by this user that nobody else can
read or write.  Where it lives is the whole defence: a key saved and restored with the cache
(a file beside it in the same CI cache, even mode 0600) is one that whoever writes the cache
writes too — CI jobs run as one user, so file modes do not keep them apart.  A CI that
restores its cache from a store other jobs write keeps the key in its secrets and names the
file it writes it to in ``$EDGEKIT_CACHE_KEY_FILE`` (``.ci/run``); a cache restored without
its key is rebuilt, which costs time and trusts nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from edgekit.core.io import CHUNK, write_atomic
from edgekit.core.paths import config_root

log = logging.getLogger(__name__)

KEY_ENV = "EDGEKIT_CACHE_KEY_FILE"
KEY_NAME = "cache.key"
_KEY_BYTES = 32
_MAX_KEY_FILE = 4096
MAX_ENTRY = 1 << 20  # an entry lists a few artifacts in a few KiB; more is not one edgekit wrote
FORMAT = 3  # 3: sealed (a MAC over the entry, each file's SHA-256 and size)
_ARTIFACT_FIELDS: dict[str, type] = {
    "path": str,
    "backend": str,
    "precision": str,
    "arch": str,
    "files": list,
    "options": dict,
    "notes": dict,
    "kind": str,
    "variant": str,
    "requires": list,
}


class Untrusted(Exception):
    """A cache entry that is not used: why, in words for a warning."""


class KeyUnusable(Exception):
    """The cache key cannot be read, made or trusted: why, in words for a warning."""


def key_path() -> Path:
    """``$EDGEKIT_CACHE_KEY_FILE``, else ``cache.key`` in edgekit's config directory."""
    named = os.environ.get(KEY_ENV)
    return Path(named).expanduser() if named else config_root() / KEY_NAME


def load_key(path: Path | None = None) -> bytes:
    """This user's cache key, made (mode 0600) when there is none yet; :class:`KeyUnusable` otherwise."""
    path = path or key_path()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return _make_key(path)
    except OSError as err:
        raise KeyUnusable(f"{path} cannot be read ({err.strerror})") from err
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise KeyUnusable(f"{path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise KeyUnusable(f"{path} belongs to another user (uid {st.st_uid})")
        if st.st_mode & 0o077:
            raise KeyUnusable(f"{path} can be read or written by others (chmod 600 {path})")
        text = f.read(_MAX_KEY_FILE).strip()
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != _KEY_BYTES:
        # Our own file (owner and mode checked), damaged: a new key only costs a rebuild of each entry.
        log.warning(
            "the build cache key %s is damaged: a new one is made and cached steps are built again", path
        )
        key = secrets.token_bytes(_KEY_BYTES)
        write_atomic(path, key.hex().encode() + b"\n", mode=0o600)
    return key


def _make_key(path: Path) -> bytes:
    key = secrets.token_bytes(_KEY_BYTES)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(path, key.hex().encode() + b"\n", mode=0o600, replace=False)
    except FileExistsError:
        return load_key(path)  # another build made it first: use that one
    except OSError as err:
        raise KeyUnusable(f"{path} cannot be made ({err.strerror})") from err
    log.info("made the build cache key %s", path)
    return key


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def seal(key: bytes, body: Mapping[str, Any]) -> bytes:
    """``entry.json``'s bytes: ``body`` and its MAC under ``key``."""
    mac = hmac.new(key, _canonical(body), hashlib.sha256).hexdigest()
    return json.dumps({**body, "mac": mac}, indent=1).encode()


def read_entry(path: Path) -> bytes:
    """An entry's bytes, at most :data:`MAX_ENTRY`, from a regular file (never a link's target or a pipe)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise Untrusted(f"{path.name} cannot be read ({err.strerror})") from err
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise Untrusted(f"{path.name} is not a regular file")
        raw = f.read(MAX_ENTRY + 1)
    if len(raw) > MAX_ENTRY:
        raise Untrusted(f"{path.name} is larger than {MAX_ENTRY} bytes")
    return raw


def unseal(key: bytes, raw: bytes, name: str, expect: Mapping[str, Any]) -> dict[str, Any]:
    """The body of the sealed file ``name`` (its bytes ``raw``) if ``key`` sealed it and it says ``expect``; else :class:`Untrusted`.

    Its ``files`` (path -> SHA-256 and size) are checked for shape; the caller checks the files.
    """
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as err:
        raise Untrusted(f"{name} is not whole JSON ({err})") from err
    if not isinstance(doc, dict) or not isinstance(doc.get("mac"), str):
        raise Untrusted(f"{name} is not sealed (written by an older edgekit, or not by edgekit)")
    body = {k: v for k, v in doc.items() if k != "mac"}
    want = hmac.new(key, _canonical(body), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, doc["mac"]):
        raise Untrusted(
            f"{name} is not sealed with this user's cache key (written by someone else, or altered)"
        )
    if any(body.get(k) != v for k, v in expect.items()):
        raise Untrusted(f"{name} is sealed for something else")
    files = body.get("files")
    if not isinstance(files, dict):
        raise Untrusted(f"{name} lists no files")
    for rel, rec in files.items():
        _check_rel(rel)
        if not (
            isinstance(rec, dict)
            and isinstance(rec.get("sha256"), str)
            and len(rec["sha256"]) == 64
            and isinstance(rec.get("size"), int)
        ):
            raise Untrusted(f"{name} records no hash for {rel}")
    return body


def open_sealed(key: bytes, raw: bytes, entry_key: str, step: str) -> dict[str, Any]:
    """The body of a step's ``entry.json`` sealed under ``key`` for ``entry_key`` and ``step``, checked; else :class:`Untrusted`."""
    body = unseal(key, raw, "entry.json", {"format": FORMAT, "key": entry_key, "step": step})
    files, artifacts = body["files"], body.get("artifacts")
    if not isinstance(artifacts, list) or not artifacts:
        raise Untrusted("entry.json lists no artifacts")
    for a in artifacts:
        if not isinstance(a, dict) or any(not isinstance(a.get(k), t) for k, t in _ARTIFACT_FIELDS.items()):
            raise Untrusted("entry.json holds a malformed artifact")
        for rel in [a["path"], *a["files"]]:
            if not isinstance(rel, str) or rel not in files:
                raise Untrusted(f"entry.json names a file it holds no hash of: {rel!r}")
    return body


def _check_rel(rel: object) -> None:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or ".." in rel.split("/"):
        raise Untrusted(f"entry.json names a file outside the entry: {rel!r}")


def record(path: Path) -> dict[str, Any]:
    """What an entry records of one file: its SHA-256 and size."""
    h, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return {"sha256": h.hexdigest(), "size": size}


def _open_cached(src: Path) -> BinaryIO:
    """``src`` opened for reading, never through a link nor blocking on a FIFO, or :class:`Untrusted`."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError as err:
        raise Untrusted(f"{src.name} is missing") from err
    except OSError as err:
        raise Untrusted(f"{src.name} cannot be read ({err.strerror})") from err
    return os.fdopen(fd, "rb")


def copy_checked(src: Path, dest: Path, want: Mapping[str, Any]) -> None:
    """Copy ``src`` to ``dest`` and check the copy's hash and size against ``want``, or :class:`Untrusted`.

    The copy (in a folder of ours) is what is hashed and then used, so a file swapped in the
    cache after the check never reaches the build.  A file of the wrong size is refused before
    it is read.
    """
    with _open_cached(src) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(f"{src.name} is not a regular file")
        if st.st_size != want["size"]:
            raise Untrusted(f"{src.name} is {st.st_size} bytes, the entry recorded {want['size']}")
        h = hashlib.sha256()
        dest.parent.mkdir(parents=True, exist_ok=True)
        with dest.open("wb") as out:
            while chunk := f.read(CHUNK):
                h.update(chunk)
                out.write(chunk)
    if not hmac.compare_digest(h.hexdigest(), want["sha256"]):
        dest.unlink(missing_ok=True)
        raise Untrusted(f"{src.name} does not match the hash its entry recorded")


def read_checked(src: Path, want: Mapping[str, Any]) -> bytes:
    """The bytes of ``src`` if their hash and size are ``want``'s (read once: what is checked is what is used)."""
    with _open_cached(src) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size != want["size"]:
            raise Untrusted(f"{src.name} is not the file its seal recorded")
        data = f.read(want["size"] + 1)
    if not hmac.compare_digest(hashlib.sha256(data).hexdigest(), want["sha256"]):
        raise Untrusted(f"{src.name} does not match the hash its seal recorded")
    return data
