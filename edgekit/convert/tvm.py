"""Compile an ONNX model to a TVM Relax library for a device profile's target.

Tuned schedules make the difference between ~35x slower than ONNX Runtime and close to
it: see :mod:`edgekit.convert.tvm_tuning` for tuning and :mod:`edgekit.convert.tvm_database`
for the cache and shipped databases.  The library is written with its ``.io.json`` beside
it (the VM does not keep input shapes).  Both are written to temporary names and renamed
into place, so a failed or interrupted compile never leaves a file that looks valid.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.backends.tvm import io_path
from edgekit.convert.artifact import Artifact
from edgekit.errors import BuildError

if TYPE_CHECKING:
    from edgekit.convert.tvm_database import TuningDatabase
    from edgekit.convert.tvm_tuning import Progress

# A cross compiler per target triple; the host compiler handles the host's own triple.
CROSS_COMPILERS = {
    "aarch64-linux-gnu": "aarch64-linux-gnu-gcc",
    "arm-linux-gnueabihf": "arm-linux-gnueabihf-gcc",
}
# Why a device profile gets no TVM int8 library (measured on EfficientNet-Lite0, x86_64 AVX2,
# TVM 0.27; tools/profile_tvm.py): the Relax ONNX importer turns a QDQ model's
# DequantizeLinear/QuantizeLinear into relax.dequantize/quantize around *float* conv2d (and
# refuses QOperator models: no QLinearConv, QLinearAdd, QGemm converters), and no Relax pass
# rewrites that pattern into integer convolutions.  The library compiled from edgekit's
# onnxruntime-int8 model passed the accuracy gate, but ran 469 ms against 57 ms for tvm-fp32
# (one thread): fp32 arithmetic plus rounding, with 38 of 48 fused functions off the tuned
# schedules.  The builder records this in the tvm-fp32 artifact's notes (``no-tvm-int8``),
# which ``edgekit bench`` shows in place of a tvm int8 row.
INT8_NOT_BUILT = (
    "TVM 0.27 Relax has no integer lowering for quantized ONNX: it imports the int8 QDQ model as "
    "fp32 conv2d between quantize/dequantize ops (QLinearConv models do not import at all), so a "
    "TVM int8 library computes in fp32 with int8 rounding; measured ~8x slower than tvm-fp32"
)
_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 10: "float16", 11: "float64"}


def _compiler(target: Mapping[str, Any]) -> str | None:
    """The C compiler to link with, or ``None`` for the host's default."""
    import platform

    triple = str(target.get("mtriple", ""))
    if not triple or triple.startswith(platform.machine()):
        return None
    cc = CROSS_COMPILERS.get(triple)
    if cc is None or shutil.which(cc) is None:
        raise BuildError(
            f"no cross compiler for {triple}" + (f" ({cc} is not on PATH)" if cc else ""),
            "on Debian/Ubuntu: apt-get install gcc-aarch64-linux-gnu"
            if "aarch64" in triple
            else "install a cross gcc for that triple",
        )
    return cc


def _io(model: Any) -> dict[str, list[dict[str, Any]]]:
    init = {i.name for i in model.graph.initializer}

    def spec(v: Any) -> dict[str, Any]:
        t = v.type.tensor_type
        return {
            "name": v.name,
            "shape": [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim],
            "dtype": _ONNX_DTYPES.get(t.elem_type, "float32"),
        }

    return {
        "inputs": [spec(v) for v in model.graph.input if v.name not in init],
        "outputs": [spec(v) for v in model.graph.output],
    }


def compile_onnx(
    onnx_path: Path,
    out: Path,
    target: Mapping[str, Any],
    *,
    tune_trials: int = 0,
    database: Path | None = None,
    cache_dir: Path | None = None,
    model_dir: Path | None = None,
    foreign_schedules: bool = True,
    progress: Progress | None = None,
) -> Artifact:
    """Compile ``onnx_path`` for ``target`` (a TVM target dict) into the library ``out``.

    Schedules come from a MetaSchedule database (see :mod:`edgekit.convert.tvm_database`):

    - ``tune_trials > 0``: tune on this host with that many measurements (seeded from any
      database already known for this target), cache the result under
      ``<cache_dir>/tvm-tuning/<sha256(onnx)[:16]>-<target key>/`` and apply it.  A cached
      database with at least that many trials is reused without tuning.  Only the host's
      own architecture can be tuned.
    - ``tune_trials == 0``: apply ``database`` if given, else this model's cache entry,
      else one shipped in ``<model_dir>/tvm-tuning/<target key>/``; with
      ``foreign_schedules`` a database of another CPU is a declared fallback (see notes).

    Returns the artifact (``.so`` + ``.io.json``); its notes say which database was applied,
    how many of the model's functions got tuned schedules, and on which CPU they were tuned
    (``schedules_tuned_on_cpu``); ``schedules`` says when that is not the CPU the target is
    for or, for a target of this host's architecture, not this host's CPU
    (:func:`edgekit.convert.tvm_cpu.schedule_note`).
    """
    import onnx
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    from edgekit.convert import tvm_database as tdb
    from edgekit.convert import tvm_tuning as tt
    from edgekit.convert.onnx_export import pin_batch
    from edgekit.core.io import sha256_file

    if tune_trials < 0:
        raise BuildError(
            f"tune_trials must be 0 or more, got {tune_trials}", "use --tune-trials N with N >= 0"
        )
    if tune_trials and database is not None:
        raise BuildError(
            "give either a tuning database to apply or a trial budget to tune, not both",
            "drop --tune-trials to apply the database as it is",
        )
    if tune_trials:
        tt.check_can_tune(target)
    cc = _compiler(target)
    # A free batch (the build's fp32 graph) is compiled for one frame: TVM's code is for one shape.
    model = pin_batch(onnx.load(str(onnx_path)))
    for spec in _io(model)["inputs"]:
        if None in spec["shape"]:
            raise BuildError(
                f"{onnx_path}: input {spec['name']} has a dynamic shape {spec['shape']}",
                "TVM needs static shapes: export the model with a fixed input size",
            )
    sha = sha256_file(onnx_path)
    tvm_target = tvm.target.Target(dict(target))
    say = progress or (lambda _message, _fraction: None)
    say("importing the ONNX model into TVM", 0.0)
    try:
        mod = tt.prepare(from_onnx(model, keep_params_in_input=False), tvm_target)
    except Exception as err:
        raise BuildError(
            f"TVM could not import {onnx_path} for {dict(target)}: {err}",
            "check that every operator is supported by TVM's ONNX importer",
        ) from err

    db = _database(sha, target, mod, tune_trials, database, cache_dir, model_dir, foreign_schedules, progress)
    say("compiling with TVM" + (f" ({db.source} schedules)" if db else " (no tuned schedules)"), 0.0)
    try:
        mod, tuned, functions = tt.apply(mod, tvm_target, db)
        executable = relax.build(mod, tvm_target)
    except Exception as err:
        raise BuildError(
            f"TVM could not compile {onnx_path} for {dict(target)}: {err}",
            "check that every operator is supported by TVM's ONNX importer",
        ) from err
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}.so")
    try:
        executable.export_library(str(tmp), **({"cc": cc} if cc else {}))
        io_tmp = tmp.with_suffix(".json")
        # The target travels with the library: its machine code may use any instruction the
        # target names (dotprod, AVX-512), and the backend refuses it on a CPU without them.
        io = {**_io(model), "target": dict(target)}
        io_tmp.write_text(json.dumps(io, indent=2), encoding="utf-8")
        os.replace(io_tmp, io_path(out))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_suffix(".json").unlink(missing_ok=True)
    say("compiled", 1.0)
    return Artifact(
        path=out,
        backend="tvm",
        precision="fp32",
        arch=tdb.target_arch(target),
        files=(out, io_path(out)),
        notes=_notes(db, target, tuned, functions, sha),
        kind="tvm-so",
    )


def _database(
    sha: str,
    target: Mapping[str, Any],
    mod: Any,
    tune_trials: int,
    database: Path | None,
    cache_dir: Path | None,
    model_dir: Path | None,
    foreign: bool,
    progress: Progress | None,
) -> TuningDatabase | None:
    """The database to apply: given, tuned now (or reused from the cache), or found."""
    from edgekit.convert import tvm_database as tdb
    from edgekit.convert import tvm_tuning as tt

    if database is not None:
        return tdb.read_database(database, "given")
    if not tune_trials:
        return tdb.find_database(sha, target, cache_dir=cache_dir, model_dir=model_dir, foreign=foreign)
    cached = tdb.cache_location(sha, target, cache_dir)
    known = tdb.find_database(sha, target, cache_dir=cache_dir, model_dir=model_dir, foreign=False)
    if known is not None and known.source == "cache" and known.trials >= tune_trials:
        return known  # tuned here before with at least this budget
    seed = known if known is not None and known.tuned_on == tdb.target_key(target) else None
    try:
        return tt.tune(mod, target, tune_trials, cached, onnx_sha256=sha, seed=seed, progress=progress)
    except BuildError:
        raise
    except Exception as err:  # TVM's boundary: any tuning failure becomes one BuildError
        raise BuildError(
            f"TVM tuning failed for {tdb.target_key(target)}: {str(err).strip().splitlines()[-1][:300]}",
            "build without --tune-trials to use shipped or cached schedules; check the TVM packages "
            "(pip install 'edgekit[tvm,build]': apache-tvm-ffi 0.1.14.post1, xgboost, psutil, cloudpickle)",
        ) from err


def _notes(
    db: TuningDatabase | None, target: Mapping[str, Any], tuned: int, functions: int, sha: str
) -> dict[str, Any]:
    from edgekit.convert import tvm_cpu
    from edgekit.convert import tvm_database as tdb

    notes: dict[str, Any] = {
        "target": dict(target),
        "target_key": tdb.target_key(target),
        "tuned_functions": tuned,
        "functions": functions,
        "tuning_database": f"{db.source}:{db.path}" if db else None,
        "tuning_records_sha256": tdb.fingerprint(db),
    }
    if db is None:
        notes["schedules"] = (
            "untuned: no tuning database for this model and target, so plain loops "
            "(tens of times slower than tuned code; tune with --tune-trials)"
        )
        return notes
    notes["tuning_trials"] = db.trials
    notes["schedules_tuned_on"] = db.tuned_on
    # The CPU its schedules were timed on (None: not recorded), for edgekit bench to compare with its own.
    notes["schedules_tuned_on_cpu"] = db.meta.get("tuned_on_cpu")
    notes["database_model_matches"] = db.meta.get("onnx_sha256") == sha
    warning = tvm_cpu.schedule_note(db, target)
    if warning:
        notes["schedules"] = warning
    if tuned < functions:
        notes["untuned_functions"] = (
            f"{functions - tuned} of {functions} functions have no tuned schedule and run as plain loops"
        )
    return notes
