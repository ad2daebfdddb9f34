"""TVM schedules know the CPU they were tuned on: the build's note, the bench's caveat, inspect.

Every CPU here is described by hand, so these pass on any machine (AVX2-only, AVX-512, ARM).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from edgekit.convert import tvm_cpu
from edgekit.convert import tvm_database as tdb
from edgekit.convert import tvm_tuning as tt
from edgekit.core.cpu import CpuFeatures, target_flags
from edgekit.device.profiles import get_profile

MODEL_DIR = Path(__file__).resolve().parents[1] / "models" / "efficientnet-lite0"
X86 = dict(get_profile("x86_64-cpu").tvm_target)  # mcpu haswell
RPI5 = dict(get_profile("rpi5").tvm_target)

EPYC = {"model": "AMD EPYC 7B13", "arch": "x86_64", "flags": ["sse4_2", "avx", "fma", "avx2"]}
AVX2 = CpuFeatures("x86_64", frozenset({"sse4_2", "avx", "fma", "avx2", "bmi2"}))
XEON = CpuFeatures(
    "x86_64",
    frozenset(
        {
            "sse4_2",
            "avx",
            "fma",
            "avx2",
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512_vnni",
            "amx_tile",
            "amx_int8",
        }
    ),
)
A76 = CpuFeatures("aarch64", frozenset({"asimd", "asimddp", "fphp", "asimdhp"}))


def _db(key: str = "x86_64-haswell", cpu: dict[str, Any] | None = EPYC, **meta: Any) -> tdb.TuningDatabase:
    return tdb.TuningDatabase(
        Path("/nowhere"),
        "shipped",
        {"target_key": key, "trials": 10, **({"tuned_on_cpu": cpu} if cpu else {}), **meta},
    )


def test_the_same_flags_say_nothing() -> None:
    assert tvm_cpu.schedule_note(_db(), X86, AVX2, "AMD EPYC 7B13") is None
    # Tuned on an AVX-512 machine for a haswell target, applied there: the target asks for nothing more.
    xeon = {"model": "Xeon", "arch": "x86_64", "flags": sorted(XEON.flags)}
    assert tvm_cpu.schedule_note(_db(cpu=xeon), X86, XEON) is None


def test_a_build_host_with_other_flags_is_another_cpu() -> None:
    note = tvm_cpu.schedule_note(_db(), X86, XEON, "Intel Xeon")
    assert note is not None and "another CPU" in note
    assert "tuned on another CPU: AMD EPYC 7B13 (x86_64: sse4_2, avx, fma, avx2)" in note
    assert (
        "the build host's CPU (Intel Xeon) has avx512f, avx512bw, avx512vl, avx512_vnni, amx_tile, amx_int8"
        in note
    )
    assert "expect slower than tuned" in note and "--tune-trials" in note
    # ... and one with fewer flags than the tuning CPU too.
    avx = CpuFeatures("x86_64", frozenset({"sse4_2", "avx"}))
    assert "lacks fma, avx2" in (tvm_cpu.schedule_note(_db(), X86, avx) or "")


def test_a_target_asking_for_more_than_the_tuning_cpu_had_is_another_cpu() -> None:
    # Cross-built on an ARM host: only the target's mcpu/mattr speak for the CPU.
    target = {**X86, "mcpu": "haswell", "mattr": ["+avx512f", "+avx512vnni"]}
    note = tvm_cpu.schedule_note(_db(), target, A76)
    assert note is not None and "another CPU" in note
    assert "the target (x86_64-haswell) has avx512f, avx512_vnni" in note and "build host" not in note
    assert tvm_cpu.schedule_note(_db(), X86, A76) is None


def test_a_database_without_the_record_says_so() -> None:
    note = tvm_cpu.schedule_note(_db(cpu=None, host={"machine": "x86_64", "cpu": "AMD EPYC"}), X86, AVX2)
    assert note is not None and "tuned on an unrecorded CPU" in note and "'AMD EPYC'" in note


def test_foreign_schedules_name_the_cpu_they_were_measured_on() -> None:
    note = tvm_cpu.schedule_note(_db(), RPI5, XEON) or ""
    assert "not on this CPU (aarch64-cortex-a76)" in note and "measured on AMD EPYC 7B13" in note


def test_target_flags_come_from_mcpu_and_mattr() -> None:
    assert target_flags(X86) == frozenset({"sse4_2", "avx", "fma", "avx2"})
    assert target_flags(RPI5) == frozenset({"asimd", "asimddp", "fphp", "asimdhp"})
    assert target_flags(get_profile("arm64-cpu").tvm_target) == frozenset({"asimd"})
    no_avx2 = {"kind": "llvm", "mcpu": "haswell", "mattr": "-avx2,+avx512f"}
    assert target_flags(no_avx2) == frozenset({"sse4_2", "avx", "fma", "avx512f"})
    assert target_flags({"kind": "llvm", "mcpu": "some-future-cpu"}) is None


def test_the_shipped_x86_64_database_records_an_avx2_epyc() -> None:
    db = tdb.read_database(MODEL_DIR / tdb.TUNING_DIR / "x86_64-haswell", "shipped")
    cpu = db.meta["tuned_on_cpu"]
    assert cpu["model"].startswith("AMD EPYC") and cpu["arch"] == "x86_64"
    assert set(cpu["flags"]) == {"sse4_2", "avx", "fma", "avx2"}
    assert tvm_cpu.schedule_note(db, X86, AVX2) is None
    assert "another CPU" in (tvm_cpu.schedule_note(db, X86, XEON) or "")


def test_ship_records_the_cpu_only_when_it_knows_it(tmp_path: Path) -> None:
    def fake(name: str, **meta: Any) -> tdb.TuningDatabase:
        path = tmp_path / name
        path.mkdir()
        for table in tdb.TABLES:
            (path / table).write_text("", encoding="utf-8")
        return tdb.TuningDatabase(path, "cache", {"target_key": name, **meta})

    here = {"machine": __import__("platform").machine(), "cpu": tvm_cpu._cpu_name()}
    shipped = tt.ship(fake("x86_64-haswell", host=here), tmp_path / "m1")
    assert json.loads((shipped / tdb.META_FILE).read_text())["tuned_on_cpu"] == tvm_cpu.cpu_record()
    shipped = tt.ship(fake("x86_64-znver3", host={"machine": "x86_64", "cpu": "elsewhere"}), tmp_path / "m2")
    assert "tuned_on_cpu" not in json.loads((shipped / tdb.META_FILE).read_text())
    shipped = tt.ship(fake("x86_64-skylake", host={"cpu": "elsewhere"}), tmp_path / "m3", cpu=EPYC)
    assert json.loads((shipped / tdb.META_FILE).read_text())["tuned_on_cpu"] == EPYC


# ---------------------------------------------------------------- edgekit bench


def _notes(cpu: dict[str, Any] | None = EPYC) -> dict[str, Any]:
    return {
        "tuning_database": "shipped:/x",
        "schedules_tuned_on": "x86_64-haswell",
        **({"schedules_tuned_on_cpu": cpu} if cpu else {}),
    }


def test_bench_caveat_compares_the_record_with_the_bench_cpu() -> None:
    from edgekit.bench.runner import caveat

    assert caveat("tvm", _notes(), AVX2) is None
    got = caveat("tvm", _notes(), XEON) or ""
    assert got.startswith("schedules tuned on another CPU (AMD EPYC 7B13: sse4_2, avx, fma, avx2;")
    assert "this one has avx512f" in got
    assert "another CPU" in (caveat("tvm", _notes(), A76) or "")
    assert "unrecorded CPU" in (caveat("tvm", _notes(cpu=None), AVX2) or "")
    assert "untuned" in (caveat("tvm", {"tuning_database": None}, AVX2) or "")
    assert caveat("onnxruntime", _notes(), XEON) is None


def _report(caveat: str | None) -> dict[str, Any]:
    from edgekit.bench.loadgen import summarize
    from edgekit.bench.report import BenchCandidate as Candidate
    from edgekit.bench.report import Report, Result, Settings

    results = []
    for name, ms in (("onnxruntime-fp32", 2.0), ("tvm-fp32", 16.7)):
        backend = name.split("-")[0]
        cand = Candidate(name, backend, "fp32", 2, {}, caveat=caveat if backend == "tvm" else None)
        lat = [ms + 0.01 * i for i in range(50)]
        results.append(Result(cand, latencies_ms=lat, duration_s=sum(lat) / 1e3, cold_start_s=[0.5]))
        results[-1].summary = summarize(lat, results[-1].duration_s)
    report = Report(
        "b",
        "efficientnet-lite0",
        "x86_64-cpu",
        33.0,
        {"arch": "x86_64", "cpu": "Intel(R) Xeon(R) Processor", "cores": 2},
        Settings(),
        results,
        [],
        0.98,
        "2026-12-01T00:00:00+00:00",
    )
    return report.to_dict()


def test_bench_marks_the_tvm_row_within_80_columns_and_in_json() -> None:
    from edgekit.bench.render import table

    text = "schedules tuned on another CPU (AMD EPYC 7B13: sse4_2, avx, fma, avx2; this one has avx512f, avx512_vnni)"
    data = _report(text)
    tvm = next(c for c in data["candidates"] if c["backend"] == "tvm")
    assert tvm["caveat"] == text
    assert next(c for c in data["candidates"] if c["backend"] == "onnxruntime")["caveat"] is None

    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(table(data))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any(line.lstrip().startswith("tvm-fp32 †") for line in lines)
    assert not any(line.lstrip().startswith("onnxruntime-fp32 †") for line in lines)
    shown = " ".join(line.strip() for line in lines)
    assert "† tvm-fp32: schedules tuned on another CPU (AMD EPYC 7B13" in shown and "avx512_vnni)" in shown

    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(table(_report(None)))
    assert "†" not in out.getvalue()


# ---------------------------------------------------------------- edgekit inspect


def test_inspect_shows_the_schedules_note(tmp_path: Path) -> None:
    pytest.importorskip("pydantic")
    from dataclasses import replace

    from test_bundle import _artifacts, _meta

    from edgekit.bundle import read_manifest
    from edgekit.commands import bundle as bundle_cmd
    from edgekit.commands.common import console
    from edgekit.convert.bundle_writer import write_bundle

    note = tvm_cpu.schedule_note(_db(), X86, XEON, "Intel Xeon")
    assert note is not None
    arts = _artifacts(tmp_path / "src")
    arts[0] = (replace(arts[0][0], notes={"schedules": note}), arts[0][1])
    root = write_bundle(tmp_path / "B", _meta(), arts)
    with console.capture() as captured:
        bundle_cmd._print_manifest(root, read_manifest(root), {"signed": False})
    shown = " ".join(captured.get().split())
    assert f"onnxruntime-fp32: {note}" in shown
