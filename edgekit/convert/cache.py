"""A content-addressed cache of build steps, so a second build of the same thing takes seconds.

Each step's key is a hash of everything that decides its output: the input model's bytes,
the step name and parameters, the calibration data, and the versions of edgekit and of
the converter.  A hit copies the cached files into the output directory; a miss runs the
step in a scratch directory and stores its artifacts.  Entries are written under a
temporary name and renamed into place, so a crash never leaves an entry that looks whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgekit._core.io import atomic_path
from edgekit._core.paths import cache_root
from edgekit._version import __version__
from edgekit.convert.artifact import Artifact

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
FORMAT = 2  # 2: an artifact's variant and requires


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
    """Cached build steps under ``root/steps/<key>/``."""

    def __init__(self, root: Path | None = None, enabled: bool = True) -> None:
        self.root = (root or cache_root()) / "steps"
        self.enabled = enabled
        self.hits: list[str] = []

    def run(
        self, step: str, key: str, out_dir: Path, produce: Callable[[Path], Sequence[Artifact]]
    ) -> list[Artifact]:
        """Artifacts of ``step`` in ``out_dir``: copied from the cache, or produced (in scratch) and cached."""
        entry = self.root / key
        if self.enabled and (entry / ENTRY).is_file():
            self.hits.append(step)
            cached = [_from_json(d, entry) for d in json.loads((entry / ENTRY).read_text())["artifacts"]]
            return [self._place(a, entry, out_dir) for a in cached]
        out_dir.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{step}-", dir=out_dir))
        try:
            made = list(produce(scratch))
            if self.enabled:
                self._store(made, scratch, entry, step)
            return [self._place(a, scratch, out_dir) for a in made]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _store(self, made: Sequence[Artifact], scratch: Path, entry: Path, step: str) -> None:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
        try:
            for a in made:
                for f in a.all_files:
                    dest = tmp / f.relative_to(scratch)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, dest)
            (tmp / ENTRY).write_text(
                json.dumps({"step": step, "artifacts": [_to_json(a, scratch) for a in made]}, indent=1)
            )
            if entry.exists():
                shutil.rmtree(entry)
            os.replace(tmp, entry)
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
