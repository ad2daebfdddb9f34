"""MetaSchedule for TVM builds: tune a database on this CPU, apply one to a module, ship one.

What a database is and which one a build finds is :mod:`edgekit.convert.tvm_database`.

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
import shutil
import sys
import tempfile
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.convert.tvm_cpu import _cpu_name, _recorded, cpu_record
from edgekit.convert.tvm_database import (
    META_FILE,
    TABLES,
    TUNING_DIR,
    TuningDatabase,
    seal_database,
    target_arch,
    target_key,
)
from edgekit.core.elf import host_arch
from edgekit.errors import BuildError

Progress = Callable[[str, float], None]
"""``progress(message, fraction)``: what a long step is doing and how far it is, 0..1."""

LOGGER = "tvm.s_tir.meta_schedule"


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
        seal_database(staged, out.name)  # a later build reuses it only under this user's seal
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
            data = db.read_table(name)
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
