"""MetaSchedule tuning databases for TVM builds: tune, cache, find, apply.

Untuned TVM code for a CPU is scalar loops (~35x slower than ONNX Runtime on
EfficientNet-Lite0).  MetaSchedule searches loop schedules per fused operator and keeps
the best ones in a database; a build that applies the database gets those schedules in
seconds.  A database directory holds MetaSchedule's two JSON tables (gzipped in the
repo: ~3.5 MB of JSON is ~0.2 MB) plus ``tuning.json`` saying what it was tuned for
(model SHA-256, target, trials, host, the CPU's flags).  They live in:

- the cache, ``<cache>/tvm-tuning/<sha256(onnx)[:16]>-<target key>/`` (``$EDGEKIT_CACHE``
  or ``~/.cache/edgekit``): written by every tuning run on this machine;
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

The lookup matches a workload on its TIR alone, so it is just as blind to the CPU within
one architecture: a schedule's tile sizes, vector width and loop order were chosen by
timing candidates on one particular CPU, for its vector registers and its cache sizes.
Applied on a CPU with wider vectors (AVX-512), int8/bf16 matrix units (VNNI, AMX) or
other caches, the same schedule is valid code but not the fast one for it: on a CPU with
AVX-512 and VNNI the shipped AMD EPYC (AVX2) schedules gave a tvm-fp32 library of 16.7 ms
p50, against 1.1-3 ms for the other runtimes on the same machine.  So every database records
the CPU it was tuned on (``tuned_on_cpu`` in ``tuning.json``: model name, architecture and
its notable instruction-set flags, :mod:`edgekit.runtime.cpu`), and :func:`schedule_note` compares
it with the CPU the artifact is for: the target's ``mcpu``/``mattr`` and, when the target
is the build host's architecture, the build host's own flags.  A difference goes into the
artifact's notes (``schedules``), which ``edgekit inspect`` shows, and ``edgekit bench``
compares the record with the CPU it measures on (:func:`runtime_caveat`).  Only the flags
are compared: two CPUs with the same ones but other caches are not told apart.

Pitfalls handled here (each a silent failure, measured with TVM 0.27 on x86_64): MetaSchedule's default
builder compiles in fresh worker processes whose import of ``tvm.s_tir.tensor_intrin``
outlives its 30 s timeout, so every candidate "fails" and nothing is tuned — candidates
are compiled by workers that live for the whole run (see :func:`_make_builder`); tasks are extracted after the ``zero`` pipeline
fused the graph (on the raw import they are trivial); the trial budget is split so
that every task gets trials; and a run that measured nothing raises instead of writing
an empty database.
"""

from __future__ import annotations

import gzip
import importlib
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit._core.elf import host_arch, normalize_arch
from edgekit._core.paths import cache_root
from edgekit.errors import BuildError
from edgekit.runtime.cpu import NOTABLE, CpuFeatures, target_flags, this_cpu

Progress = Callable[[str, float], None]
"""``progress(message, fraction)``: what a long step is doing and how far it is, 0..1."""

TUNING_DIR = "tvm-tuning"
META_FILE = "tuning.json"
WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
TABLES = (WORKLOAD_FILE, RECORD_FILE)
LOGGER = "tvm.s_tir.meta_schedule"


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

    def copy_tables(self, dest: Path) -> None:
        """Write both tables, uncompressed, into ``dest`` (a MetaSchedule work directory)."""
        for name in TABLES:
            src = self.table(name)
            if src.suffix == ".gz":
                with gzip.open(src, "rb") as f:
                    (dest / name).write_bytes(f.read())
            else:
                shutil.copyfile(src, dest / name)

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
    if (cached / RECORD_FILE).is_file():
        return read_database(cached, "cache")
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
    import hashlib

    return hashlib.sha256(db.table(RECORD_FILE).read_bytes()).hexdigest()[:16]


RETUNE = "tune on the device (edgekit build --tune-trials N)"


def cpu_record(cpu: CpuFeatures | None = None, model: str | None = None) -> dict[str, Any]:
    """What ``tuning.json`` says about the CPU a database was tuned on (``tuned_on_cpu``): this one by default."""
    cpu = cpu or this_cpu()
    return {
        "model": model if model is not None else _cpu_name(),
        "arch": cpu.arch,
        "flags": list(cpu.notable),
    }


def _recorded(record: Any) -> tuple[str, CpuFeatures] | None:
    """A ``tuned_on_cpu`` record as (model name, features), or ``None`` when absent or malformed."""
    if not isinstance(record, Mapping) or not isinstance(record.get("flags"), list) or not record.get("arch"):
        return None
    return str(record.get("model") or "an unnamed CPU"), CpuFeatures(
        str(record["arch"]), frozenset(str(f) for f in record["flags"])
    )


def _flag_list(flags: frozenset[str] | set[str], arch: str) -> str:
    """Flags in :data:`edgekit.runtime.cpu.NOTABLE` order (then any others, sorted)."""
    order = NOTABLE.get(arch, ())
    known = [f for f in order if f in flags]
    return ", ".join(known + sorted(f for f in flags if f not in order)) or "none of note"


def _describe(model: str, cpu: CpuFeatures) -> str:
    """``AMD EPYC (x86_64: sse4_2, avx, fma, avx2)``."""
    return f"{model} ({cpu.arch}: {_flag_list(cpu.flags, cpu.arch)})"


def _differences(
    tuned: CpuFeatures, other: frozenset[str], symmetric: bool
) -> tuple[frozenset[str], frozenset[str]]:
    """(flags ``other`` has that the tuning CPU lacked, flags it lacks that the tuning CPU had)."""
    notable = frozenset(NOTABLE.get(tuned.arch, ())) or tuned.flags | other
    more = (other - tuned.flags) & notable
    fewer = (tuned.flags - other) & notable if symmetric else frozenset()
    return frozenset(more), frozenset(fewer)


def _has_lacks(more: frozenset[str], fewer: frozenset[str], arch: str) -> str:
    parts = ([f"has {_flag_list(more, arch)}"] if more else []) + (
        [f"lacks {_flag_list(fewer, arch)}"] if fewer else []
    )
    return "; ".join(parts)


def schedule_note(
    db: TuningDatabase,
    target: Mapping[str, Any],
    cpu: CpuFeatures | None = None,
    cpu_name: str | None = None,
) -> str | None:
    """A sentence for the notes when ``db`` was not tuned on the CPU the build is for, else ``None``.

    Compared: the target key (``mcpu``) it was tuned for; the flags of the CPU it was tuned
    on (``tuned_on_cpu``) against those the target compiles for (``mcpu``/``mattr``: any
    flag the target has that the tuning CPU lacked) and, when the target is ``cpu``'s
    architecture, against ``cpu``'s own flags (any difference): ``cpu`` is the build
    host, this machine's CPU (:func:`edgekit.runtime.cpu.this_cpu`) unless given, named
    ``cpu_name``.  A database without the record says it was tuned on an unrecorded CPU.
    """
    key = target_key(target)
    recorded = _recorded(db.meta.get("tuned_on_cpu"))
    if db.tuned_on != key:
        on = f"; measured on {_describe(*recorded)}" if recorded else "; measured on an unrecorded CPU"
        if db.arch == target_arch(target):
            return f"schedules tuned on {db.tuned_on}, not on {key}: re-tune on the device for its best speed{on}"
        return (
            f"schedules tuned on {db.arch} ({db.tuned_on}), not on this CPU ({key}): a fallback that beats "
            f"untuned code but is not tuned for it; tune on a {target_arch(target)} machine for its best speed{on}"
        )
    if recorded is None:
        host = db.meta.get("host")
        named = (
            f" (tuning.json names the host {host['cpu']!r} but not its flags)"
            if isinstance(host, Mapping) and host.get("cpu")
            else ""
        )
        return (
            f"schedules tuned on an unrecorded CPU{named}: whether they suit this CPU is unknown; "
            f"if TVM is slow, {RETUNE}"
        )
    model, tuned = recorded
    arch = target_arch(target)
    found: list[str] = []
    wanted = target_flags(target)
    if wanted is not None and tuned.arch == arch:
        more, _ = _differences(tuned, wanted, symmetric=False)
        if more:
            found.append(f"the target ({key}) {_has_lacks(more, frozenset(), arch)}")
    cpu = cpu or this_cpu()
    if cpu.arch == arch:
        more, fewer = _differences(tuned, cpu.flags, symmetric=True)
        if more or fewer:
            name = cpu_name if cpu_name is not None else (_cpu_name() if cpu == this_cpu() else "")
            found.append(
                f"the build host's CPU{f' ({name})' if name else ''} {_has_lacks(more, fewer, arch)}"
            )
    if not found:
        return None
    return (
        f"schedules tuned on another CPU: {_describe(model, tuned)}, "
        f"{'; '.join(found)}: expect slower than tuned; {RETUNE}"
    )


def runtime_caveat(notes: Mapping[str, Any], cpu: CpuFeatures) -> str | None:
    """What to say next to a TVM artifact's timings measured on ``cpu``, from the artifact's notes; ``None``: nothing.

    For ``edgekit bench``: the artifact's schedules were tuned on the CPU in its notes
    (``schedules_tuned_on_cpu``, written by :func:`edgekit.convert.tvm.compile_onnx`); on a
    CPU with other flags its timings are not what the tuned schedules can do.
    """
    if "tuning_database" in notes and notes["tuning_database"] is None:
        return "untuned schedules: plain loops, tens of times slower than tuned code"
    if "tuning_database" not in notes and "schedules_tuned_on" not in notes:
        return None  # not a TVM build's notes
    recorded = _recorded(notes.get("schedules_tuned_on_cpu"))
    if recorded is None:
        return "schedules tuned on an unrecorded CPU: may not suit this one"
    model, tuned = recorded
    if tuned.arch != cpu.arch:
        return f"schedules tuned on another CPU ({model}, {tuned.arch}), not on this {cpu.arch} one"
    more, fewer = _differences(tuned, cpu.flags, symmetric=True)
    if not (more or fewer):
        return None
    return (
        f"schedules tuned on another CPU ({model}: {_flag_list(tuned.flags, tuned.arch)}; "
        f"this one {_has_lacks(more, fewer, cpu.arch)})"
    )


def check_can_tune(target: Mapping[str, Any]) -> None:
    """Refuse to tune for a CPU this host cannot measure on."""
    arch, here = target_arch(target), host_arch()
    if arch != here:
        raise BuildError(
            f"cannot tune TVM schedules for {arch} on this {here} host: MetaSchedule measures every "
            f"candidate on the CPU it tunes for, and edgekit has no RPC runner to an {arch} device",
            f"build without --tune-trials to apply the shipped schedules, or run the same build with "
            f"--tune-trials on a {arch} machine and copy its database "
            f"({TUNING_DIR}/<model>-{target_key(target)}/ in its edgekit cache) "
            f"to models/<name>/{TUNING_DIR}/{target_key(target)}/",
        )


def _load_cpu_intrinsics() -> None:
    """Register only the CPU tensor intrinsics, so tuning does not parse every GPU one.

    ``TuneContext`` imports ``tvm.s_tir.tensor_intrin``, whose package import parses
    TVMScript for CUDA, ROCm and Hexagon intrinsics: 100 s of CPU on this 2-core machine,
    none of it used by CPU schedule rules.  Putting the package in ``sys.modules`` with its
    real ``__path__`` makes that import a no-op while ``tensor_intrin.cuda`` and friends
    still import on demand.
    """
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        return
    import tvm.s_tir

    package = types.ModuleType(name, "CPU tensor intrinsics only (edgekit); submodules import on demand")
    package.__path__ = [str(Path(tvm.s_tir.__file__).parent / "tensor_intrin")]
    package.__package__ = name
    sys.modules[name] = package
    tvm.s_tir.tensor_intrin = package
    for sub in ("x86", "arm_cpu"):
        setattr(package, sub, importlib.import_module(f"{name}.{sub}"))


def prepare(mod: Any, target: Any) -> Any:
    """Legalize and fuse a Relax module as tuning and application both need it.

    Tasks must be extracted from (and databases applied to) the same fused module, with
    the weights marked as layout-free so that tuned schedules may pre-pack them.
    """
    import tvm
    from tvm import relax

    with target:
        return tvm.transform.Sequential(
            [
                relax.transform.DecomposeOpsForInference(),
                relax.transform.CanonicalizeBindings(),
                relax.get_pipeline("zero"),
                relax.transform.AttachAttrLayoutFreeBuffers(),
            ]
        )(mod)


def apply(mod: Any, target: Any, db: TuningDatabase | None) -> tuple[Any, int, int]:
    """Apply ``db`` to a :func:`prepare`-d module: ``(module, functions tuned, functions)``.

    Weight layouts that tuned schedules ask for are computed at compile time (the weights
    are constants), so the library's interface stays ``main(input)``.
    """
    import tvm
    from tvm import relax
    from tvm.tirx import PrimFunc

    def primfuncs(m: Any) -> list[Any]:
        return [f for f in m.functions.values() if isinstance(f, PrimFunc)]

    total = len(primfuncs(mod))
    if db is None:
        return mod, 0, total
    with target, db.open():
        mod = relax.transform.MetaScheduleApplyDatabase()(mod)
    tuned = sum(bool(f.attrs and f.attrs.get("tirx.is_scheduled", False)) for f in primfuncs(mod))
    with target:
        mod = tvm.transform.Sequential(
            [
                relax.transform.SplitLayoutRewritePreproc(),
                relax.transform.FoldConstant(),
                relax.transform.DeadCodeElimination(),
            ]
        )(mod)
    return mod, tuned, total


def tuning_target(target: Mapping[str, Any]) -> dict[str, Any]:
    """The target used while tuning: MetaSchedule needs ``num-cores`` to choose parallel extents."""
    tuned = dict(target)
    tuned.setdefault("num-cores", len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    return tuned


@dataclass
class _Tally:
    trials: int = 0
    ok: int = 0
    errors: list[str] = field(default_factory=list)
    joins: int = 0
    stopped_early: bool = False


BUILD_TIMEOUT_S = 60.0


def _build_candidate(mod: Any, target: Any, scratch: str) -> str:
    """Compile one candidate schedule (in a builder worker); return the path of its archive."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
    from tvm.support.tar import tar

    # As MetaSchedule's default builder: measure without the weight layout rewrite.
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    lib = tvm.compile(mod, target=target)
    path = Path(tempfile.mkdtemp(prefix="candidate-", dir=scratch)) / f"candidate.{tar.output_format}"
    lib.export_library(str(path), fcompile=tar)
    return str(path)


def _make_builder(scratch: Path, workers: int) -> Any:
    """A MetaSchedule builder whose worker processes live for the whole tuning run.

    MetaSchedule's ``LocalBuilder`` starts fresh workers for every batch and each one
    imports ``tvm.s_tir.tensor_intrin`` inside its 30 s build timeout, which it outlives
    here: every candidate then "fails" and nothing is tuned.  Compiling in the tuning
    process instead has no timeout at all, and one mutated schedule (a huge unrolled
    loop) can keep LLVM busy for many minutes.  So: workers started once (TVM imported
    once, no GPU intrinsics), each candidate killed after ``BUILD_TIMEOUT_S``.
    """
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

    @derived_object
    class WorkerPoolBuilder(PyBuilder):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            # Recycled now and then: TVM notes that its pool workers leak memory over many uses.
            self.pool = PopenPoolExecutor(
                max_workers=workers, timeout=BUILD_TIMEOUT_S, maximum_process_uses=200
            )

        def build(self, build_inputs: list[Any]) -> list[Any]:
            results = []
            jobs = [(item.mod, item.target, str(scratch)) for item in build_inputs]
            for done in self.pool.map_with_error_catching(lambda job: _build_candidate(*job), jobs):
                if done.status == StatusKind.COMPLETE:
                    results.append(BuilderResult(done.value, None))
                elif done.status == StatusKind.TIMEOUT:
                    results.append(BuilderResult(None, f"build timed out after {BUILD_TIMEOUT_S:.0f} s"))
                else:
                    results.append(BuilderResult(None, f"build failed: {done.value}"))
            return results

    return WorkerPoolBuilder()


class _TimeLimitReached(Exception):
    """Raised from a measure callback to end a tuning run whose time is up."""


def _make_counter(
    tally: _Tally, total: int, tasks: int, deadline: float | None, progress: Progress | None
) -> Any:
    """A measure callback that counts trials and failures, reports progress, and stops at ``deadline``.

    MetaSchedule first measures every task once and only then collects the results, so a
    time limit can only act after that first round: there, every task is terminated (the
    scheduler then stops cleanly); later, terminating the task being collected would trip
    the scheduler's own checks, so the run is ended with an exception that :func:`tune`
    expects (every result collected so far is already in the database).
    """
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class Counter(PyMeasureCallback):  # type: ignore[misc]
        def apply(
            self, scheduler: Any, _task: int, _candidates: list[Any], built: list[Any], ran: list[Any]
        ) -> None:
            tally.joins += 1
            for b, r in zip(built, ran, strict=True):
                tally.trials += 1
                error = b.error_msg or r.error_msg
                if error:
                    tally.errors.append(str(error).strip().splitlines()[-1][:300])
                else:
                    tally.ok += 1
            if progress is not None:
                progress(f"tuning: {tally.trials}/{total} trials", min(1.0, tally.trials / max(total, 1)))
            if deadline is None or tally.stopped_early or time.monotonic() < deadline:
                return
            if tally.joins < tasks:
                return  # still collecting the first round: keep every task's results
            tally.stopped_early = True
            if tally.joins == tasks:
                for task_id, record in enumerate(scheduler.tasks_):
                    if not record.is_terminated:
                        scheduler.terminate_task(task_id)
                return
            raise _TimeLimitReached(f"tuning stopped after {tally.trials} trials: time limit reached")

    return Counter()


def trials_per_iter(trials: int, tasks: int) -> int:
    """Candidates measured per task per round.

    Small enough that every task gets about two rounds, so the gradient scheduler can
    give the rest to the tasks that still improve; at least 8 (or the whole budget), as
    each round costs a search of fixed cost whatever its size.
    """
    return max(min(8, trials), min(64, trials // max(1, 2 * tasks)))


def tune(
    mod: Any,
    target: Mapping[str, Any],
    trials: int,
    out: Path,
    *,
    onnx_sha256: str,
    seed: TuningDatabase | None = None,
    progress: Progress | None = None,
    per_iter: int | None = None,
    time_limit_s: float | None = None,
) -> TuningDatabase:
    """Tune a :func:`prepare`-d module with ``trials`` measurements; write the pruned database to ``out``.

    ``seed`` (a database for the same target key) starts the search from its best
    schedules; its trials count towards the total recorded.  ``per_iter`` overrides
    :func:`trials_per_iter`; ``time_limit_s`` stops tuning after that long (the
    schedules found so far are kept).  ``out`` is replaced atomically and holds only the
    best record per workload, so it stays small enough to ship.
    """
    import logging

    import tvm
    from tvm.s_tir import meta_schedule as ms

    check_can_tune(target)
    _load_cpu_intrinsics()
    ms_target = tvm.target.Target(tuning_target(target))
    # MetaSchedule prints its task tables and cost-model lines to stdout unless its
    # logger has a level; they still go to the log files in the work directory.
    if logging.getLogger(LOGGER).level == logging.NOTSET:
        logging.getLogger(LOGGER).setLevel(logging.WARNING)
    if progress is not None:
        progress("extracting tuning tasks", 0.0)
    tasks = ms.relax_integration.extract_tasks(mod, ms_target)
    if not tasks:
        raise BuildError("the model has no operators for TVM to tune", "build without --tune-trials")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}-work-", dir=out.parent))
    try:
        if seed is not None:
            seed.copy_tables(work)
        per_iter = per_iter or trials_per_iter(trials, len(tasks))
        # The evolutionary search keeps a population of candidates scored by the cost model
        # and measures the best ``per_iter`` of them; its cost is per round and grows with
        # the population, so it is sized to the round (TVM's 512 for rounds of 32 and more).
        population = min(512, max(64, 16 * per_iter))
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            tasks,
            str(work),
            strategy=ms.search_strategy.EvolutionarySearch(
                population_size=population, init_min_unmeasured=min(50, population)
            ),
            num_threads=int(ms_target.attrs["num-cores"]),
            seed=0,
        )
        tally = _Tally()
        started = time.monotonic()
        deadline = started + time_limit_s if time_limit_s else None
        database = ms.database.JSONDatabase(work_dir=str(work))
        builder = _make_builder(work, int(ms_target.attrs["num-cores"]))
        try:
            ms.tune_tasks(
                tasks=contexts,
                task_weights=weights,
                work_dir=str(work),
                max_trials_global=trials,
                num_trials_per_iter=per_iter,
                builder=builder,
                # One runner process stays up for the whole run; 120 s covers its start
                # (importing TVM) on a busy machine.
                runner=ms.runner.LocalRunner(timeout_sec=120),
                measure_callbacks=[
                    *ms.measure_callback.MeasureCallback.create("default"),
                    _make_counter(tally, trials, len(contexts), deadline, progress),
                ],
                database=database,
            )
        except Exception:  # our _TimeLimitReached, as MetaSchedule re-raises it through C++
            if not tally.stopped_early:
                raise
        finally:
            builder.pool.shutdown(wait=False)
        if tally.ok == 0:
            first = tally.errors[0] if tally.errors else "no candidate was measured"
            raise BuildError(
                f"TVM tuning measured none of its {tally.trials} candidates successfully: {first}",
                "check that xgboost, psutil and cloudpickle are installed and apache-tvm-ffi is "
                "0.1.14.post1 (pip install 'edgekit[tvm,build]'); MetaSchedule's logs are in the "
                "work directory while it runs",
            )
        staged = Path(tempfile.mkdtemp(prefix=f".{out.name}-db-", dir=out.parent))
        database.dump_pruned(ms.database.JSONDatabase(work_dir=str(staged)))
        meta = {
            "onnx_sha256": onnx_sha256,
            "target": dict(target),
            "target_key": target_key(target),
            "tuning_target": tuning_target(target),
            "trials": tally.trials + (seed.trials if seed else 0),
            "trials_failed": tally.trials - tally.ok,
            "tasks": len(tasks),
            "trials_per_iter": per_iter,
            "population": population,
            "seconds": round(
                time.monotonic() - started + float(seed.meta.get("seconds", 0) if seed else 0), 1
            ),
            "runs": 1 + (int(seed.meta.get("runs", 1)) if seed else 0),
            "stopped_at_time_limit": tally.stopped_early,
            "tvm": tvm.__version__,
            "host": {"machine": platform.machine(), "cpu": _cpu_name()},
            # What schedule_note compares with the CPU a build is for (a seed's other CPU is not kept:
            # re-tuning re-measures every schedule it keeps on this one).
            "tuned_on_cpu": cpu_record(),
            "seeded_from": f"{seed.source}:{seed.path.name}" if seed else None,
        }
        (staged / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        staged.chmod(0o755)  # mkdtemp makes it private
        if out.exists():
            shutil.rmtree(out)
        os.replace(staged, out)
        return TuningDatabase(out, "tuned", meta)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for stale in out.parent.glob(f".{out.name}-db-*"):
            shutil.rmtree(stale, ignore_errors=True)


def ship(db: TuningDatabase, model_dir: Path, *, cpu: Mapping[str, Any] | None = None) -> Path:
    """Copy a tuned database beside a model card, gzipped: ``<model_dir>/tvm-tuning/<target key>/``.

    Its ``tuning.json`` says which CPU it was tuned on (``tuned_on_cpu``): as recorded by
    :func:`tune`, else ``cpu`` (a :func:`cpu_record`), else this machine's when the
    database was tuned here (its ``host`` names this CPU model and architecture); a
    database tuned elsewhere without a record stays without one rather than get this one.
    """
    meta = dict(db.meta)
    if cpu is not None:
        meta["tuned_on_cpu"] = dict(cpu)
    elif _recorded(meta.get("tuned_on_cpu")) is None:
        host = meta.get("host")
        if isinstance(host, Mapping) and host == {"machine": platform.machine(), "cpu": _cpu_name()}:
            meta["tuned_on_cpu"] = cpu_record()
    dest = model_dir / TUNING_DIR / db.tuned_on
    dest.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        for name in TABLES:
            src = db.table(name)
            data = gzip.decompress(src.read_bytes()) if src.suffix == ".gz" else src.read_bytes()
            # mtime=0: the same database gives the same bytes, so the repo sees no change.
            (staged / f"{name}.gz").write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
        (staged / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        staged.chmod(0o755)  # mkdtemp makes it private; a shipped directory is for everyone
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(staged, dest)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return dest


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
