"""A content-addressed cache of build steps, so a second build of the same thing takes seconds.

Each step's key is a hash of everything that decides its output: the input model's bytes,
the step name and parameters, the calibration data, and the versions of edgekit and of
the converter.  A hit copies the cached files into the output directory; a miss runs the
step in a scratch directory and stores its artifacts.  Entries are written under a
temporary name and renamed into place, so a crash never leaves an entry that looks whole.

Nothing read from the cache is trusted before it is checked (:mod:`edgekit.convert.cache_trust`):
each ``entry.json`` is sealed with an HMAC under this user's cache key, kept outside the
cache (``~/.config/edgekit/cache.key``, or ``$EDGEKIT_CACHE_KEY_FILE``), and records the
SHA-256 of every file it holds.  A hit copies each file into the build's own stage, hashing
it as it goes, and only those checked copies are used — so a cached TVM library is loaded
(by the accuracy gate and the latency measurement) only after its check, and a file changed
in the cache meanwhile never reaches the build.  An entry that is damaged (a flipped byte, a
missing file, a truncated or malformed ``entry.json``) or sealed under another key (written
by another user, or restored from a CI cache without the key that wrote it) is discarded
with a warning and the step built again.  A plain hash inside the entry would stop only bad
luck: whoever can rewrite a cached file can rewrite its hash too, but not the seal without
the key.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgekit._version import __version__
from edgekit.convert import cache_trust as trust
from edgekit.convert.artifact import Artifact
from edgekit.core.io import atomic_path
from edgekit.core.paths import cache_root

log = logging.getLogger(__name__)

ENTRY = "entry.json"


def step_key(step: str, inputs: Iterable[str], params: Mapping[str, Any]) -> str:
    """A stable key for one step from input hashes and JSON-able parameters."""
    h = hashlib.sha256()
    h.update(
        json.dumps(
            {
                "edgekit": __version__,
                "format": FORMAT,
                "step": step,
                "inputs": list(inputs),
                "params": params,
            },
            sort_keys=True,
            default=str,
        ).encode()
    )
    return h.hexdigest()[:24]


# What a cached step records of its artifacts; a new field is a new format, so that an entry
# written before it (which would read back without it) is never taken for a current one.
# 2: an artifact's variant and requires; 3: sealed (edgekit.convert.cache_trust).
FORMAT = trust.FORMAT


def _to_json(a: Artifact, base: Path) -> dict[str, Any]:
    return {
        "path": a.path.relative_to(base).as_posix(),
        "backend": a.backend,
        "precision": a.precision,
        "arch": a.arch,
        "files": [f.relative_to(base).as_posix() for f in a.all_files],
        "options": dict(a.options),
        "notes": dict(a.notes),
        "kind": a.kind,
        "variant": a.variant,
        "requires": list(a.requires),
    }


def _from_json(d: Mapping[str, Any], base: Path) -> Artifact:
    return Artifact(
        path=base / d["path"],
        backend=d["backend"],
        precision=d["precision"],
        arch=d["arch"],
        files=tuple(base / f for f in d["files"]),
        options=d["options"],
        notes=d["notes"],
        kind=d["kind"],
        variant=d.get("variant", ""),
        requires=tuple(d.get("requires", ())),
    )


class BuildCache:
    """Cached build steps under ``root/steps/<key>/``, each sealed under this user's cache key."""

    def __init__(self, root: Path | None = None, enabled: bool = True) -> None:
        self.root = (root or cache_root()) / "steps"
        self.enabled = enabled
        self.hits: list[str] = []
        self._key: bytes | None = None

    def _secret(self) -> bytes | None:
        """The cache key; None (and the cache off for this build, said once) when it cannot be trusted."""
        if self._key is None and self.enabled:
            try:
                self._key = trust.load_key()
            except trust.KeyUnusable as err:
                log.warning("build cache not used: its key %s; every step is built", err)
                self.enabled = False
        return self._key

    def run(
        self, step: str, key: str, out_dir: Path, produce: Callable[[Path], Sequence[Artifact]]
    ) -> list[Artifact]:
        """Artifacts of ``step`` in ``out_dir``: copied from the cache and checked, or produced (in scratch) and cached."""
        entry = self.root / key
        secret = self._secret()
        out_dir.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{step}-", dir=out_dir))
        try:
            # An entry is renamed into place whole: a folder without its entry.json is a damaged one.
            if secret is not None and (entry.exists() or entry.is_symlink()):
                try:
                    cached = self._checked_copy(secret, entry, key, step, scratch)
                except trust.Untrusted as why:
                    log.warning(
                        "build cache: the %s entry %s is not used (%s): building it again", step, entry, why
                    )
                    shutil.rmtree(scratch, ignore_errors=True)
                    scratch.mkdir()
                else:
                    self.hits.append(step)
                    return [self._place(a, scratch, out_dir) for a in cached]
            made = list(produce(scratch))
            if secret is not None:
                self._store(secret, made, scratch, entry, key, step)
            return [self._place(a, scratch, out_dir) for a in made]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    @staticmethod
    def _checked_copy(secret: bytes, entry: Path, key: str, step: str, scratch: Path) -> list[Artifact]:
        """The entry's artifacts as copies in ``scratch`` that match its sealed hashes, else :class:`trust.Untrusted`."""
        body = trust.open_sealed(secret, trust.read_entry(entry / ENTRY), key, step)
        for rel, want in body["files"].items():
            trust.copy_checked(entry / rel, scratch / rel, want)
        return [_from_json(d, scratch) for d in body["artifacts"]]

    def _store(
        self, secret: bytes, made: Sequence[Artifact], scratch: Path, entry: Path, key: str, step: str
    ) -> None:
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
        except OSError as err:
            log.warning(
                "build cache: %s cannot be written (%s): the %s step is not cached", entry.parent, err, step
            )
            return
        try:
            files: dict[str, Any] = {}
            for a in made:
                for f in a.all_files:
                    rel = f.relative_to(scratch).as_posix()
                    dest = tmp / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, dest)
                    files[rel] = trust.record(dest)
            body = {
                "format": FORMAT,
                "key": key,
                "step": step,
                "artifacts": [_to_json(a, scratch) for a in made],
                "files": files,
            }
            (tmp / ENTRY).write_bytes(trust.seal(secret, body))
            if entry.exists() or entry.is_symlink():
                if entry.is_symlink() or not entry.is_dir():
                    entry.unlink()
                else:
                    shutil.rmtree(entry)
            os.replace(tmp, entry)
        except OSError as err:
            log.warning("build cache: %s cannot be written (%s): the %s step is not cached", entry, err, step)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @staticmethod
    def _place(a: Artifact, base: Path, out_dir: Path) -> Artifact:
        files = []
        for f in a.all_files:
            dest = out_dir / f.relative_to(base)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(dest) as tmp:
                shutil.copy2(f, tmp)
            files.append(dest)
        return replace(a, path=out_dir / a.path.relative_to(base), files=tuple(files))
