"""TVM tuning databases: what one is, where they live, and which one a build applies.

Untuned TVM code for a CPU is scalar loops (~35x slower than ONNX Runtime on
EfficientNet-Lite0).  MetaSchedule searches loop schedules per fused operator and keeps
the best ones in a database; a build that applies the database gets those schedules in
seconds.  A database directory holds MetaSchedule's two JSON tables (gzipped in the
repo: ~3.5 MB of JSON is ~0.2 MB) plus ``tuning.json`` saying what it was tuned for
(model SHA-256, target, trials, host, the CPU's flags).  They live in:

- the cache, ``<cache>/tvm-tuning/<sha256(onnx)[:16]>-<target key>/`` (``$EDGEKIT_CACHE``
  or ``~/.cache/edgekit``): written by every tuning run on this machine, and sealed
  (``seal.json``: an HMAC under this user's cache key over each file's SHA-256, as build
  steps are, :mod:`edgekit.convert.cache_trust`).  Schedules decide the code compiled into
  the library the build then loads and signs, so a cached database that is not sealed by
  this user, or whose files changed, is not used (a warning says why);
- next to a model card, ``models/<name>/tvm-tuning/<target key>/``: shipped in the repo.

Database lookup in TVM ignores the target (a workload matches on its TIR alone), so
applying an x86_64 database to an aarch64 build "works" with schedules tuned for the
wrong CPU.  Here every database says which target it was tuned on, exact target keys are
preferred, and a database of another CPU family is only used as a declared fallback
recorded in the artifact's notes (``foreign=False`` refuses it).  It is on by default
because untuned code is single-threaded scalar loops, while an x86_64 (AVX2) schedule
applied to a Cortex-A76 is still tiled, parallel and vectorized: LLVM splits its 8-lane
vectors into pairs of 4-lane NEON operations, the register budget it was tiled for is
the same size (16 x 32 B on AVX2, 32 x 16 B on NEON), its tiles fit the A76's larger L1,
and its parallel loops spread over however many cores the device has.  So it should be
far faster than untuned code, though slower than schedules tuned on the device.  That is
reasoning, not a measurement: there is no ARM CPU here to time it on.

Tuning a database is :mod:`edgekit.convert.tvm_tuning`; comparing the CPU it was tuned on
with the one a build is for is :mod:`edgekit.convert.tvm_cpu`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.convert import cache_trust as trust
from edgekit.core.elf import host_arch, normalize_arch
from edgekit.core.paths import cache_root
from edgekit.errors import BuildError

log = logging.getLogger(__name__)

TUNING_DIR = "tvm-tuning"
META_FILE = "tuning.json"
WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
TABLES = (WORKLOAD_FILE, RECORD_FILE)
SEAL_FILE = "seal.json"
_SEAL = {"format": 1, "kind": "tvm-tuning"}


def target_arch(target: Mapping[str, Any]) -> str:
    """The CPU architecture a target dict compiles for (from ``mtriple``; the host's without one)."""
    triple = str(target.get("mtriple", ""))
    return normalize_arch(triple.split("-", 1)[0]) if triple else host_arch()


def target_key(target: Mapping[str, Any]) -> str:
    """A short stable name for a target's CPU family: ``x86_64-haswell``, ``aarch64-cortex-a76``."""
    cpu = str(target.get("mcpu", "")) or "generic"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{target_arch(target)}-{cpu}")


def cache_location(onnx_sha256: str, target: Mapping[str, Any], cache_dir: Path | None = None) -> Path:
    """Where the tuning database for this model and target lives in the cache."""
    return (cache_dir or cache_root()) / TUNING_DIR / f"{onnx_sha256[:16]}-{target_key(target)}"


@dataclass(frozen=True)
class TuningDatabase:
    """A MetaSchedule database directory and what it was tuned for.

    ``source`` says where it was found: ``"cache"``, ``"shipped"`` (next to a model card),
    ``"given"`` (passed by the caller) or ``"tuned"`` (made by this build).
    """

    path: Path
    source: str
    meta: Mapping[str, Any] = field(default_factory=dict)
    # A cache database: each file's SHA-256 as its checked seal recorded, so what is read later
    # is what was checked (a file swapped in the cache meanwhile is refused).
    sealed: Mapping[str, str] = field(default_factory=dict)

    @property
    def tuned_on(self) -> str:
        """The target key its schedules were measured on (``"unknown"`` without ``tuning.json``)."""
        return str(self.meta.get("target_key", "unknown"))

    @property
    def arch(self) -> str:
        return self.tuned_on.split("-", 1)[0]

    @property
    def trials(self) -> int:
        return int(self.meta.get("trials", 0))

    def table(self, name: str) -> Path:
        """The file of one of MetaSchedule's tables: ``name`` or, as shipped, ``name.gz``."""
        plain = self.path / name
        return plain if plain.is_file() else self.path / f"{name}.gz"

    def raw_table(self, name: str) -> bytes:
        """One table's file as it is stored (gzipped when shipped so); a sealed one as its seal recorded."""
        src = self.table(name)
        data = src.read_bytes()
        if self.sealed and self.sealed.get(src.name) != hashlib.sha256(data).hexdigest():
            raise BuildError(
                f"{src} changed in the cache after its seal was checked",
                "something else is writing the build cache: build again",
            )
        return data

    def read_table(self, name: str) -> bytes:
        """One table, uncompressed."""
        data = self.raw_table(name)
        return gzip.decompress(data) if self.table(name).suffix == ".gz" else data

    def copy_tables(self, dest: Path) -> None:
        """Write both tables, uncompressed, into ``dest`` (a MetaSchedule work directory)."""
        for name in TABLES:
            (dest / name).write_bytes(self.read_table(name))

    def open(self) -> Any:
        """The database as a MetaSchedule ``JSONDatabase`` (read into memory; files left as they are)."""
        from tvm.s_tir import meta_schedule as ms

        # JSONDatabase reads both tables when it is made and appends to them on commit:
        # give it a private copy so a shipped or cached database is never written to.
        with tempfile.TemporaryDirectory(prefix="edgekit-tvm-db-") as scratch:
            self.copy_tables(Path(scratch))
            return ms.database.JSONDatabase(work_dir=scratch, allow_missing=False)


def read_database(path: Path, source: str = "given") -> TuningDatabase:
    """Read a database directory; a bad one is a :class:`BuildError` naming the file."""
    for name in TABLES:
        if not (path / name).is_file() and not (path / f"{name}.gz").is_file():
            raise BuildError(
                f"{path} is not a TVM tuning database ({name} is missing)",
                "pass a directory written by edgekit's TVM tuning (it holds database_*.json and tuning.json)",
            )
    meta: dict[str, Any] = {}
    if (path / META_FILE).is_file():
        try:
            meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
        except ValueError as err:
            raise BuildError(f"{path / META_FILE} is not valid JSON ({err})", "delete it or re-tune") from err
    return TuningDatabase(path, source, meta)


def shipped_databases(model_dir: Path) -> list[TuningDatabase]:
    """The databases shipped beside a model card (``<model_dir>/tvm-tuning/<target key>/``)."""
    root = model_dir / TUNING_DIR
    if not root.is_dir():
        return []
    return [read_database(d, "shipped") for d in sorted(root.iterdir()) if (d / META_FILE).is_file()]


def find_database(
    onnx_sha256: str,
    target: Mapping[str, Any],
    *,
    cache_dir: Path | None = None,
    model_dir: Path | None = None,
    foreign: bool = True,
) -> TuningDatabase | None:
    """The best database to apply to a build without tuning, or ``None``.

    Order: this model's cache entry for this target; a shipped database for this target
    key; a shipped one for another CPU of the same architecture; and, only when
    ``foreign`` is true, one tuned on another architecture (the caller records that).
    """
    cached = cache_location(onnx_sha256, target, cache_dir)
    if cached.exists() or cached.is_symlink():
        ours = cached_database(cached)
        if ours is not None:
            return ours
    if model_dir is None:
        return None
    shipped = shipped_databases(model_dir)
    key, arch = target_key(target), target_arch(target)
    for accept in (
        lambda db: db.tuned_on == key,
        lambda db: db.arch == arch,
        lambda db: foreign,
    ):
        found = [db for db in shipped if accept(db)]
        if found:
            # Prefer the database tuned for this very model, then the one with most trials.
            return max(found, key=lambda db: (db.meta.get("onnx_sha256") == onnx_sha256, db.trials))
    return None


def fingerprint(db: TuningDatabase | None) -> str | None:
    """A short hash of a database's records, for cache keys of builds that apply it."""
    if db is None:
        return None
    return hashlib.sha256(db.raw_table(RECORD_FILE)).hexdigest()[:16]


def seal_database(path: Path, name: str | None = None) -> None:
    """Seal a database written into the cache (``seal.json``) so later builds here trust it.

    ``name``: the folder name it will have (a database is written under a temp name and
    renamed into place); the seal names it, so it cannot be moved to another model or target.
    """
    try:
        key = trust.load_key()
    except trust.KeyUnusable as err:
        log.warning(
            "the TVM tuning database %s is not sealed (cache key: %s): builds will not reuse it", path, err
        )
        return
    files = {f: trust.record(path / f) for f in (*TABLES, META_FILE) if (path / f).is_file()}
    (path / SEAL_FILE).write_bytes(trust.seal(key, {**_SEAL, "name": name or path.name, "files": files}))


def cached_database(path: Path) -> TuningDatabase | None:
    """The cache's database at ``path`` if this user's cache key sealed it and its files are as sealed; else a warning and None."""
    try:
        key = trust.load_key()
        if not (path / SEAL_FILE).exists():
            raise trust.Untrusted(
                f"it is not sealed (no {SEAL_FILE}: written by an older edgekit, or by someone else)"
            )
        body = trust.unseal(key, trust.read_entry(path / SEAL_FILE), SEAL_FILE, {**_SEAL, "name": path.name})
        files = body["files"]
        if not all(t in files for t in (*TABLES, META_FILE)):
            raise trust.Untrusted(f"{SEAL_FILE} does not cover the tables and {META_FILE}")
        checked = {f: trust.read_checked(path / f, rec) for f, rec in files.items()}
        try:
            meta = json.loads(checked[META_FILE])
        except ValueError as err:
            raise trust.Untrusted(f"{META_FILE} is not JSON") from err
        if not isinstance(meta, dict):
            raise trust.Untrusted(f"{META_FILE} is not a JSON object")
    except (trust.KeyUnusable, trust.Untrusted) as why:
        log.warning("the cached TVM tuning database %s is not used (%s)", path, why)
        return None
    return TuningDatabase(path, "cache", meta, sealed={f: rec["sha256"] for f, rec in files.items()})
