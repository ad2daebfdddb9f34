"""TVM builds: tuning databases are tuned, cached, found, applied, and said where they came from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.bundle import read_manifest
from edgekit.convert import tvm_cpu
from edgekit.convert import tvm_database as tdb
from edgekit.convert import tvm_tuning as tt
from edgekit.convert.artifact import Artifact
from edgekit.convert.build_records import BuildResult
from edgekit.core.elf import elf_arch, host_arch
from edgekit.core.io import sha256_file
from edgekit.device.profiles import get_profile
from edgekit.errors import BuildError

from conftest import TinyArtifacts

MODEL_DIR = Path(__file__).resolve().parents[1] / "models" / "efficientnet-lite0"
X86 = dict(get_profile("x86_64-cpu").tvm_target)
RPI5 = dict(get_profile("rpi5").tvm_target)
CHELSEA, COFFEE = 0, 3  # indices in the smoke set
EGYPTIAN_CAT, ESPRESSO = 285, 967


def _fake_db(path: Path, key: str, trials: int, sha: str = "0" * 64) -> Path:
    path.mkdir(parents=True)
    for name in (tdb.WORKLOAD_FILE, tdb.RECORD_FILE):
        (path / name).write_text("", encoding="utf-8")
    meta = {"target_key": key, "trials": trials, "onnx_sha256": sha}
    (path / tdb.META_FILE).write_text(json.dumps(meta), encoding="utf-8")
    return path


def test_target_keys_name_the_cpu_family() -> None:
    assert tdb.target_key(X86) == "x86_64-haswell"
    assert tdb.target_key(RPI5) == "aarch64-cortex-a76"
    assert tdb.target_key(get_profile("arm64-cpu").tvm_target) == "aarch64-generic"
    assert tdb.target_arch(RPI5) == "aarch64"


def test_lookup_prefers_cache_then_exact_cpu_then_same_arch_then_declared_foreign(tmp_path: Path) -> None:
    sha = "ab" * 32
    models, cache = tmp_path / "model", tmp_path / "cache"
    _fake_db(models / tdb.TUNING_DIR / "x86_64-haswell", "x86_64-haswell", 900, sha)
    a78 = _fake_db(models / tdb.TUNING_DIR / "aarch64-cortex-a78", "aarch64-cortex-a78", 50)

    found = tdb.find_database(sha, X86, cache_dir=cache, model_dir=models)
    assert found is not None and (found.source, found.tuned_on) == ("shipped", "x86_64-haswell")
    # Its tuning.json does not say on which CPU (see test_tvm_schedules_cpu.py for those that do).
    assert "tuned on an unrecorded CPU" in (tvm_cpu.schedule_note(found, X86) or "")

    # Another aarch64 CPU's schedules beat x86_64 ones for a Raspberry Pi 5, and say so.
    found = tdb.find_database(sha, RPI5, cache_dir=cache, model_dir=models)
    assert found is not None and found.path == a78
    assert "tuned on aarch64-cortex-a78, not on aarch64-cortex-a76" in (
        tvm_cpu.schedule_note(found, RPI5) or ""
    )

    # Only x86_64 schedules: used as a declared fallback, or refused when foreign=False.
    shutil.rmtree(a78)
    found = tdb.find_database(sha, RPI5, cache_dir=cache, model_dir=models)
    assert found is not None and found.arch == "x86_64"
    assert "not on this CPU" in (tvm_cpu.schedule_note(found, RPI5) or "")
    assert tdb.find_database(sha, RPI5, cache_dir=cache, model_dir=models, foreign=False) is None

    # This model's cache entry wins over anything shipped.
    cached = _fake_db(tdb.cache_location(sha, X86, cache), "x86_64-haswell", 8, sha)
    tdb.seal_database(cached)  # as tuning does: a cache database is used only under this user's seal
    found = tdb.find_database(sha, X86, cache_dir=cache, model_dir=models)
    assert found is not None and (found.source, found.path) == ("cache", cached)


def test_a_directory_without_tables_is_not_a_database(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="not a TVM tuning database"):
        tdb.read_database(tmp_path)


def test_trial_rounds_cover_every_task() -> None:
    assert tt.trials_per_iter(8, 6) == 8
    assert tt.trials_per_iter(900, 35) == 12
    assert tt.trials_per_iter(100_000, 35) == 64


@pytest.mark.skipif(host_arch() == "aarch64", reason="this host is aarch64: it can tune for aarch64")
def test_tuning_for_a_cpu_not_here_is_refused_clearly(tiny: TinyArtifacts, tmp_path: Path) -> None:
    pytest.importorskip("tvm")
    from edgekit.convert.tvm import compile_onnx

    with pytest.raises(BuildError) as err:
        compile_onnx(tiny.onnx, tmp_path / "t.so", RPI5, tune_trials=8, cache_dir=tmp_path)
    assert f"cannot tune TVM schedules for aarch64 on this {host_arch()} host" in err.value.message
    assert "without --tune-trials" in err.value.hint
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def tiny_tuned(tiny: TinyArtifacts, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Artifact]:
    """The tiny model tuned with 8 trials into a fresh cache: (cache directory, artifact)."""
    pytest.importorskip("tvm")
    pytest.importorskip("xgboost")
    from edgekit.convert.tvm import compile_onnx

    cache, out = tmp_path_factory.mktemp("tvm-cache"), tmp_path_factory.mktemp("tuned") / "tuned.so"
    return cache, compile_onnx(tiny.onnx, out, X86, tune_trials=8, cache_dir=cache)


@pytest.mark.slow
def test_tuning_writes_a_database_into_the_cache(
    tiny: TinyArtifacts, tiny_tuned: tuple[Path, Artifact]
) -> None:
    cache, first = tiny_tuned
    entry = tdb.cache_location(sha256_file(tiny.onnx), X86, cache)
    meta = json.loads((entry / tdb.META_FILE).read_text())
    assert first.notes["tuning_database"] == f"tuned:{entry}"
    assert meta["trials"] == 8 and meta["trials_failed"] < 8 and meta["target_key"] == "x86_64-haswell"
    assert meta["tuned_on_cpu"] == tvm_cpu.cpu_record()  # this machine: its schedules were timed here
    # 8 trials tune the first task of six: the notes say how much is left as plain loops.
    assert 1 <= first.notes["tuned_functions"] < first.notes["functions"]
    assert "untuned_functions" in first.notes
    assert (first.backend, first.kind, first.arch) == ("tvm", "tvm-so", host_arch())
    assert first.files == (first.path, first.path.with_name("tuned.io.json"))


@pytest.mark.slow
def test_a_second_build_reuses_the_cached_tuning(
    tiny: TinyArtifacts, tiny_tuned: tuple[Path, Artifact], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgekit.backends import open_session
    from edgekit.convert.tvm import compile_onnx

    cache, first = tiny_tuned

    def no_tuning(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("tuned again although the cache holds enough trials")

    monkeypatch.setattr(tt, "tune", no_tuning)
    again = compile_onnx(tiny.onnx, tmp_path / "b.so", X86, tune_trials=8, cache_dir=cache)
    assert again.notes["tuning_database"] == first.notes["tuning_database"].replace("tuned:", "cache:")
    assert again.notes["tuned_functions"] == first.notes["tuned_functions"]
    with open_session(again.path) as session:
        np.testing.assert_allclose(session.run(tiny.input_nchw)[0], tiny.expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_aarch64_build_uses_x86_64_schedules_only_as_a_declared_fallback(
    tiny: TinyArtifacts, tiny_tuned: tuple[Path, Artifact], tmp_path: Path, aarch64_cc: str
) -> None:
    from edgekit.convert.tvm import compile_onnx

    cache, _ = tiny_tuned
    tuned = tdb.read_database(tdb.cache_location(sha256_file(tiny.onnx), X86, cache), "cache")
    shipped = tt.ship(tuned, tmp_path / "model")
    assert shipped.name == "x86_64-haswell" and (shipped / f"{tdb.RECORD_FILE}.gz").is_file()

    art = compile_onnx(tiny.onnx, tmp_path / "a64.so", RPI5, cache_dir=cache, model_dir=tmp_path / "model")
    assert elf_arch(art.path) == "aarch64" and art.arch == "aarch64"
    assert art.notes["tuning_database"] == f"shipped:{shipped}"
    assert art.notes["schedules_tuned_on"] == "x86_64-haswell" and art.notes["tuned_functions"] >= 1
    assert "not on this CPU (aarch64-cortex-a76)" in art.notes["schedules"]

    plain = compile_onnx(
        tiny.onnx,
        tmp_path / "p.so",
        RPI5,
        cache_dir=cache,
        model_dir=tmp_path / "model",
        foreign_schedules=False,
    )
    assert plain.notes["tuning_database"] is None and plain.notes["schedules"].startswith("untuned")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """The reference model's folded fp32 ONNX (as edgekit's export makes it) and its smoke batch."""
    pytest.importorskip("tvm")
    pytest.importorskip("torch")
    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("skimage")
    from edgekit.convert.images import smoke_set
    from edgekit.convert.model_sources import load_pytorch
    from edgekit.convert.modelcard import read_card
    from edgekit.convert.onnx_export import export_pytorch, fold

    card = read_card(MODEL_DIR)
    d = tmp_path_factory.mktemp("ref")
    raw = export_pytorch(load_pytorch(card), card.preprocess, d / "raw.onnx")
    fp32 = fold(raw, d / "efficientnet-lite0-fp32.onnx", card.preprocess.input_shape)
    return fp32, smoke_set().batch(card.preprocess)


@pytest.mark.slow
def test_default_x86_64_build_applies_the_shipped_database(
    reference: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    from edgekit.backends import open_session
    from edgekit.convert.tvm import compile_onnx

    onnx_path, batch = reference
    shipped = tdb.read_database(MODEL_DIR / tdb.TUNING_DIR / "x86_64-haswell", "shipped")
    art = compile_onnx(onnx_path, tmp_path / "m.so", X86, cache_dir=tmp_path / "empty", model_dir=MODEL_DIR)
    notes = art.notes
    assert notes["tuning_database"] == f"shipped:{shipped.path}"
    assert notes["schedules_tuned_on"] == "x86_64-haswell"
    assert notes["schedules_tuned_on_cpu"] == shipped.meta["tuned_on_cpu"]
    # Tuned on an AVX2 EPYC: a note on a build host with other flags (AVX-512 ...), none on its like.
    assert notes.get("schedules") == tvm_cpu.schedule_note(shipped, X86)
    assert notes["tuning_trials"] == shipped.trials > 0
    # Every fused convolution has a tuned schedule (at most the odd reshape is left as it is).
    assert notes["tuned_functions"] >= notes["functions"] - 2 > 30
    assert notes["database_model_matches"] == (shipped.meta["onnx_sha256"] == sha256_file(onnx_path))

    x = batch[[CHELSEA, COFFEE]]
    with open_session(art.path, num_threads=2) as tvm_s, open_session(onnx_path) as ort_s:
        got = np.concatenate([tvm_s.run(x[i : i + 1])[0] for i in range(2)])
        want = np.concatenate([ort_s.run(x[i : i + 1])[0] for i in range(2)])
    assert EGYPTIAN_CAT in np.argsort(-got[0])[:3]
    assert int(np.argmax(got[1])) == ESPRESSO
    assert float(np.abs(got - want).max()) < 1e-3


def test_tvm_imports_an_int8_qdq_model_as_float_convolutions(tiny: TinyArtifacts, tmp_path: Path) -> None:
    """Why no profile gets a TVM int8 library (edgekit.convert.tvm.INT8_NOT_BUILT): its convolutions stay fp32.

    If a TVM release lowers quantized ONNX to integer convolutions, this fails: then a
    tvm-int8 recipe is worth building and the note should go.
    """
    pytest.importorskip("tvm")
    import onnx
    from onnxruntime.quantization import QuantFormat, quantize_static
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    from edgekit.convert.onnx_int8 import _Reader
    from edgekit.convert.tvm import INT8_NOT_BUILT

    qdq = tmp_path / "tiny-int8.onnx"
    calib = np.repeat(tiny.input_nchw, 4, axis=0).astype(np.float32)
    input_name = onnx.load(str(tiny.onnx)).graph.input[0].name
    quantize_static(str(tiny.onnx), str(qdq), _Reader(calib, input_name), quant_format=QuantFormat.QDQ)
    mod = from_onnx(onnx.load(str(qdq)), keep_params_in_input=False)
    conv_inputs: list[str] = []
    ops: set[str] = set()

    import tvm

    def visit(e: object) -> None:
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
            ops.add(e.op.name)
            if e.op.name == "relax.nn.conv2d":
                conv_inputs.extend(str(a.ty.dtype) for a in e.args)

    relax.analysis.post_order_visit(mod["main"], visit)
    assert {"relax.quantize", "relax.dequantize"} <= ops
    assert conv_inputs and set(conv_inputs) == {"float32"}
    assert "fp32" in INT8_NOT_BUILT


def _tiny_build(
    tiny: TinyArtifacts,
    out: Path,
    device: str,
    backends: tuple[str, ...] = ("onnxruntime", "tvm"),
    **options: Any,
) -> BuildResult:
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import card_for_file

    card = card_for_file(tiny.onnx, mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0))
    return build(
        BuildRequest(
            card=card,
            device=device,
            out=out,
            onnx=tiny.onnx,
            backends=backends,
            precisions=("fp32",),
            use_cache=False,
            measure_latency=False,
            **options,
        )
    )


def test_an_untuned_library_for_this_host_is_left_out_unless_asked_for(
    tiny: TinyArtifacts, tmp_path: Path
) -> None:
    from edgekit.convert.recipes import UNTUNED_TVM

    # The tiny model has no shipped schedules and this run's cache none: plain loops, never chosen.
    result = _tiny_build(tiny, tmp_path / "default", "x86_64-cpu")
    reports = {r.recipe: r for r in result.reports}
    assert reports["tvm-fp32"].artifact is None and reports["tvm-fp32"].skipped == UNTUNED_TVM
    assert "--tune-trials N" in UNTUNED_TVM and "--tvm-untuned" in UNTUNED_TVM
    assert [a.name for a in read_manifest(result.bundle).artifacts] == ["onnxruntime-fp32"]
    assert "compile" not in {s.stage for s in result.stages}
    with pytest.raises(BuildError, match="no artifact to bundle: tvm-fp32: no tuned schedules") as err:
        _tiny_build(tiny, tmp_path / "tvm-only", "x86_64-cpu", backends=("tvm",))
    assert not (tmp_path / "tvm-only").exists() and "--backends" in err.value.hint

    asked = _tiny_build(tiny, tmp_path / "untuned", "x86_64-cpu", tvm_untuned=True)
    lib = next(r for r in asked.reports if r.recipe == "tvm-fp32")
    assert lib.artifact is not None and lib.artifact.arch == host_arch()
    assert str(lib.artifact.notes["schedules"]).startswith("untuned")
    assert lib.accuracy is not None and lib.accuracy.passed  # built on request: gated as any other
    assert ("compile", "tvm-fp32") in {(s.stage, s.artifact) for s in asked.stages}


def test_a_library_for_another_arch_is_built_untuned_all_the_same(
    tiny: TinyArtifacts, tmp_path: Path, aarch64_cc: str
) -> None:
    # It cannot run here anyway, and whatever schedules it gets are its only chance on the device.
    result = _tiny_build(tiny, tmp_path / "rpi5", "rpi5")
    lib = next(r for r in result.reports if r.recipe == "tvm-fp32")
    assert lib.artifact is not None and lib.artifact.arch == "aarch64" and not lib.skipped
    assert lib.accuracy is None and lib.not_measured.startswith("built for aarch64")
