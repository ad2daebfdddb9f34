"""``edgekit bench`` on the reference bundle, and choosing by measurement (the bundle's ``selection``)."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

import edgekit
from edgekit.bench.recording import SelectionError, write_selection
from edgekit.bundle import BuildHost, read_manifest, verify
from edgekit.bundle.manifest import MeasuredCandidate, Selection
from edgekit.selection.measured import measured_order
from tests.conftest import CARD
from tests.conftest import edgekit as run_edgekit

pytestmark = pytest.mark.slow

BACKENDS = ("onnxruntime", "openvino", "litert", "tvm")


@pytest.fixture(scope="module")
def bench_json(
    x86_bundle: tuple[Path, dict[str, Any]],
    cache_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Any], Path]:
    plot = tmp_path_factory.mktemp("bench") / "latency.png"
    r = run_edgekit(
        cache_env,
        "bench",
        str(x86_bundle[0]),
        "--min-queries",
        "40",
        "--min-duration",
        "0.2",
        "--max-duration",
        "3",
        "--paced-queries",  # the camera rate at the budget's fps (30 at 33 ms): 10 queries ~ 0.3 s
        "10",
        "--plot",
        str(plot),
        "--samples",
        "--json",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout), plot


def test_bench_lists_every_backend_in_fp32_and_int8(bench_json: tuple[dict[str, Any], Path]) -> None:
    report, _ = bench_json
    ran = {(c["backend"], c["precision"]): c for c in report["candidates"]}
    skipped = {(s["backend"], s["precision"]): s for s in report["skipped"]}
    for backend in BACKENDS:
        for precision in ("fp32", "int8"):
            key = (backend, precision)
            assert key in ran or key in skipped, f"{key} is neither measured nor listed as skipped"
            if key in skipped:
                assert skipped[key]["reason"], f"{key} skipped without a reason"
    # Everything the reference bundle carries for this CPU runs here.
    for key in [(b, "fp32") for b in BACKENDS] + [(b, "int8") for b in ("onnxruntime", "openvino", "litert")]:
        assert key in ran and ran[key]["ok"], ran.get(key, {}).get("error")
    assert report["scenario"] == "SingleStream" and report["host"]["arch"] == "x86_64"
    assert report["fastest"] in {c["key"] for c in report["candidates"]}


def test_bench_summary_fields(bench_json: tuple[dict[str, Any], Path]) -> None:
    report, _ = bench_json
    for c in report["candidates"]:
        s = c["summary"]
        assert s["count"] == len(c["latencies_ms"]) >= 1
        # the run stops at --min-queries once --min-duration has passed, or at --max-duration
        assert s["count"] >= 40 or s["duration_s"] >= 3.0
        assert s["min_ms"] <= s["p50_ms"] <= s["p90_ms"] <= s["p95_ms"] <= s["p99_ms"] <= s["max_ms"]
        assert s["headline"] == "p90_ms"
        assert s["p99_valid"] is False and "p99" in s["underpowered"]  # 40 queries < 662
        # qps is count / duration, of the duration as measured; the JSON rounds that duration to the
        # millisecond and qps to 4 decimals, so qps lies between count over the duration's bounds.
        # (On a fast CPU a 0.2 s run's rounding alone is 0.25%: no relative tolerance fits every machine.)
        d = s["duration_s"]
        lo, hi = s["count"] / (d + 0.0005) - 0.00005, s["count"] / (d - 0.0005) + 0.00005
        assert lo - 1e-9 <= s["qps"] <= hi + 1e-9, (s["count"], d, s["qps"])
        assert c["cold_start_s"] > 0 and set(c["cold_start_parts_s"]) == {
            "interpreter",
            "imports",
            "load",
            "first_result",
        }
        assert 10 < c["peak_rss_mb"] < 4000
        # agreement with the fp32 reference on the bundle's own evaluation frames
        assert c["eval_frames"] >= 1 and c["top1_agreement"] is not None
        if c["precision"] == "fp32":
            assert c["top1_agreement"] == 1.0, c["key"]


def test_bench_reports_the_kernels_edgekit_chose_on_this_cpu(
    bench_json: tuple[dict[str, Any], Path], x86_bundle: tuple[Path, dict[str, Any]]
) -> None:
    """The OpenVINO candidates list the layers edgekit chose kernels for here (none on a CPU without AMX)."""
    from edgekit.backends.openvino_kernels import prefer
    from edgekit.bundle import read_manifest
    from edgekit.core.cpu import this_cpu

    report, _ = bench_json
    path = {a.name: x86_bundle[0] / a.path for a in read_manifest(x86_bundle[0]).artifacts}
    for c in report["candidates"]:
        chosen = prefer(path[c["artifact"]], this_cpu().flags) if c["backend"] == "openvino" else None
        assert c["kernels"] == ([str(x) for x in chosen[1]] if chosen else []), c["key"]


def test_bench_measures_every_candidate_at_the_camera_rate_too(
    bench_json: tuple[dict[str, Any], Path],
) -> None:
    report, _ = bench_json
    fps = round(1000 / report["budget_ms"], 3)  # no --fps: one frame per budget
    assert report["camera_rate_fps"] == fps and report["ranked_by"].startswith("camera rate")
    ok = [c for c in report["candidates"] if c["ok"]]
    for c in ok:
        paced = c["camera_rate"]
        assert paced["fps"] == fps and paced["queries"] == 10 == len(c["paced_latencies_ms"])
        assert paced["p50_ms"] <= paced["p90_ms"] <= paced["p99_ms"]
        # The wake-up cost is the cold paced run's (no warm pass) against back to back.
        assert paced["wakeup_ms"] == pytest.approx(paced["cold_p50_ms"] - c["summary"]["p50_ms"], abs=2e-4)
    # The fastest is the fastest at the rate the device runs, among what passed the gate.
    gated = [c for c in ok if c["passed_gate"]]
    assert report["fastest"] == min(gated, key=lambda c: c["camera_rate"]["p90_ms"])["key"]


def test_bench_plot_is_written(bench_json: tuple[dict[str, Any], Path]) -> None:
    _, plot = bench_json
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000


def _selection(chosen: str, profile: str = "x86_64-cpu", arch: str = "x86_64") -> Selection:
    """A selection as a device would measure it: ``chosen`` at 1 ms with one thread, ONNX Runtime at 9 ms."""

    def row(artifact: str, ms: float, threads: int) -> MeasuredCandidate:
        backend, precision = artifact.split("-")[:2]
        return MeasuredCandidate(
            artifact=artifact,
            backend=backend,
            precision=precision,
            threads=threads,
            p50_ms=ms,
            p90_ms=ms,
            p99_ms=ms,
            queries=700,
        )

    return Selection(
        by="test",
        measured=datetime.now(timezone.utc),
        profile=profile,
        host=BuildHost(arch=arch, cpu="test"),
        chosen=chosen,
        threads=1,
        candidates=(row(chosen, 1.0, 1), row("onnxruntime-fp32", 9.0, 2)),
    )


def test_selection_is_signed_again_and_load_follows_it(
    x86_bundle: tuple[Path, dict[str, Any]], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(x86_bundle[0], bundle)
    with edgekit.load(bundle, device="x86_64-cpu") as m:
        assert m.candidate == "onnxruntime-fp32"  # the profile's first choice

    # A signed bundle is not changed without a key to sign it again.
    before = (bundle / "manifest.json").read_bytes()
    with pytest.raises(SelectionError, match="signed") as err:
        write_selection(bundle, _selection("litert-fp32"))
    assert "--sign-key" in err.value.hint
    assert (bundle / "manifest.json").read_bytes() == before

    write_selection(bundle, _selection("litert-fp32"), keys[0])
    assert verify(bundle, [keys[1]], require_signature=True).ok
    assert read_manifest(bundle).selection.chosen == "litert-fp32"  # type: ignore[union-attr]
    with edgekit.load(bundle, device="x86_64-cpu", trusted_keys=[keys[1]], require_signature=True) as m:
        assert m.candidate == "litert-fp32"  # measured fastest wins over the profile's order
        assert m.session.backend == "litert"

    # Measured on another kind of device: the profile's order stands.
    write_selection(bundle, _selection("litert-fp32", profile="rpi5", arch="aarch64"), keys[0])
    with edgekit.load(bundle, device="x86_64-cpu") as m:
        assert m.candidate == "onnxruntime-fp32"


def test_measured_order_uses_the_fastest_thread_count(x86_bundle: tuple[Path, dict[str, Any]]) -> None:
    manifest = read_manifest(x86_bundle[0]).model_copy(update={"selection": _selection("litert-fp32")})
    from edgekit.device.profiles import get_profile
    from edgekit.selection.matching import candidates_for

    cands = candidates_for(get_profile("x86_64-cpu"), manifest.artifacts)
    latency, threads = measured_order(manifest, "x86_64-cpu", cands, "x86_64")
    assert latency == {"litert-fp32": 1.0, "onnxruntime-fp32": 9.0}
    assert threads == {"litert-fp32": 1, "onnxruntime-fp32": 2}
    assert measured_order(manifest, "x86_64-cpu", cands, "aarch64") == ({}, {})


def test_selection_naming_a_missing_artifact_is_refused(
    x86_bundle: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(x86_bundle[0], bundle)
    before = (bundle / "manifest.json").read_bytes()
    with pytest.raises(Exception, match="does not have: tensorrt-fp16"):
        write_selection(bundle, _selection("tensorrt-fp16"), None)
    assert (bundle / "manifest.json").read_bytes() == before


def test_bench_mistakes_are_clear_errors(
    x86_bundle: tuple[Path, dict[str, Any]], cache_env: dict[str, str]
) -> None:
    r = run_edgekit(cache_env, "bench", str(x86_bundle[0]), "--backends", "onnxrt")
    assert r.returncode == 2 and "unknown backend 'onnxrt'" in r.stderr and "Traceback" not in r.stderr
    r = run_edgekit(cache_env, "bench", str(x86_bundle[0]), "--backends", "tensorrt")
    assert r.returncode == 2 and "nothing in" in r.stderr and "tensorrt" in r.stderr
    r = run_edgekit(cache_env, "bench", str(x86_bundle[0]), "--threads", "two")
    assert r.returncode == 2 and "--threads" in r.stderr
    r = run_edgekit(cache_env, "build", "--model", str(CARD), "--device", "rpi5", "--select", "fastest")
    assert r.returncode == 2 and "edgekit bench" in r.stderr and "aarch64" in r.stderr
