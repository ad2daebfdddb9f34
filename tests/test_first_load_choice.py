"""The fastest candidate by default: the first load of a bundle on a host measures, later loads read it back.

A real tiny bundle (ONNX Runtime and OpenVINO, fp32) and real runtimes; one backend is made
slower with ``stand_in.SlowSession`` (its real session plus a set latency), so which
candidate is faster never depends on this machine's speed.  Each test has its own state
folder, so each starts with no cached choice.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from stand_in import STAND_IN_MS, SlowSession

import edgekit
from edgekit.backends import registry
from edgekit.backends.base import Options, Session
from edgekit.selection import choice_cache
from edgekit.selection.candidate_timing import MeasureLimits

from conftest import TinyArtifacts
from conftest import edgekit as run_cli

ORT, OV = "onnxruntime-fp32", "openvino-fp32"  # the x86_64-cpu profile's first two candidates
# Small and quick: a few paced queries each at a rate the tiny model keeps easily.  The load average
# of the machine running the tests is not the subject here (busy_load=None: see the busy-host test).
LIMITS = MeasureLimits(
    per_candidate_s=1.0, total_s=4.0, queries=8, min_queries=3, warmup=1, fps=200, busy_load=None
)


@pytest.fixture(scope="module")
def bundle(tiny: TinyArtifacts, tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path]) -> Path:
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import card_for_file

    out = tmp_path_factory.mktemp("choice-bundle")
    labels = out / "labels.txt"
    labels.write_text("\n".join(f"thing {i}" for i in range(10)) + "\n")
    card = card_for_file(
        tiny.onnx, mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0), labels=labels, resize="squash"
    )
    req = BuildRequest(
        card=card,
        device="x86_64-cpu",
        out=out / "x86",
        onnx=tiny.onnx,
        backends=("onnxruntime", "openvino"),
        precisions=("fp32",),
        use_cache=False,
        measure_latency=False,
        sign_key=keys[0],
    )
    return build(req).bundle


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state folder of this test's own: no cached choice to start with; the default (measure) on."""
    monkeypatch.setenv("EDGEKIT_STATE", str(tmp_path / "state"))
    monkeypatch.delenv("EDGEKIT_MEASURE", raising=False)
    return tmp_path / "state"


class _OwnedSlow(SlowSession):
    # SlowSession leaves its inner session to whoever opened it; here nobody else holds it.
    def close(self) -> None:
        self.inner.close()
        super().close()


def slow_backend(monkeypatch: pytest.MonkeyPatch, backend: str) -> list[Path]:
    """Every session ``backend`` loads from now on takes at least STAND_IN_MS per run; returns its loads."""
    real = registry.get(backend)
    loads: list[Path] = []
    load = type(real).load

    def slow_load(artifact: Path, options: Options | None = None) -> Session:
        loads.append(artifact)
        return _OwnedSlow(load(real, artifact, options), STAND_IN_MS)

    monkeypatch.setattr(real, "load", slow_load)
    return loads


def load(bundle: Path, **kw: Any) -> tuple[edgekit.Model, list[str]]:
    lines: list[str] = []
    kw.setdefault("measure", LIMITS)
    model = edgekit.load(bundle, device="x86_64-cpu", progress=lines.append, **kw)
    return model, lines


def cache_file(bundle: Path) -> Path:
    return choice_cache.choices_dir() / f"{choice_cache.manifest_sha256(bundle)}.json"


@pytest.mark.parametrize(("slow", "fast"), [("onnxruntime", OV), ("openvino", ORT)])
def test_the_first_load_measures_and_runs_the_faster_the_second_reads_it_back(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, slow: str, fast: str
) -> None:
    slow_loads = slow_backend(monkeypatch, slow)
    model, lines = load(bundle)
    with model:
        assert model.candidate == fast
        assert model.selection.how == "measured" and model.selection.candidate == fast
        measured = dict(model.selection.latency_ms)
        assert set(measured) == {ORT, OV}
        assert measured[fast] < STAND_IN_MS <= min(v for k, v in measured.items() if k != fast)
        assert model.selection.measured_ms == measured[fast]
        assert model.load_ms["measure"] > 0
    assert lines[0].startswith("measuring 2 candidates at 200 fps")
    assert sum(f"{k}: p90" in line for line in lines for k in (ORT, OV)) == 2
    kept = json.loads(cache_file(bundle).read_text())
    assert kept["bundle_sha256"] == choice_cache.manifest_sha256(bundle)
    assert set(kept["host"]) >= {"cpu_model", "cpu_flags", "runtimes", "edgekit", "profile"}
    assert set(kept["host"]["runtimes"]) == {"onnxruntime", "openvino"}
    assert len(slow_loads) == 1  # measured once, then closed: the faster one was kept open for use

    # The second load reads the ranking back: nothing is measured, the slow one never even loads.
    model, lines = load(bundle)
    with model:
        assert lines == []
        assert model.candidate == fast
        assert model.selection.how == "cached"
        assert dict(model.selection.latency_ms) == pytest.approx(measured)
        assert model.selection.measured_at is not None
        assert "measure" not in model.load_ms
    assert len(slow_loads) == 1
    model, lines = load(bundle, measure=True)  # the default bounds: the cache still answers
    model.close()
    assert lines == [] and model.selection.how == "cached"


def test_another_runtime_version_or_another_bundle_measures_again(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    from deploy_bundles import resign

    slow_backend(monkeypatch, "onnxruntime")
    model, lines = load(bundle)
    model.close()
    assert model.selection.how == "measured" and lines

    real = choice_cache.runtime_version
    monkeypatch.setattr(
        choice_cache, "runtime_version", lambda b: "openvino 9999.0" if b == "openvino" else real(b)
    )
    model, lines = load(bundle)
    model.close()
    assert model.selection.how == "measured" and lines and model.candidate == OV
    monkeypatch.setattr(choice_cache, "runtime_version", real)

    # Another bundle (here: the same artifacts, another version, so another manifest): measured anew.
    other = resign(bundle, tmp_path / "other", keys[0], version="2.0", budget_ms=None)
    assert choice_cache.manifest_sha256(other) != choice_cache.manifest_sha256(bundle)
    model, lines = load(other)
    model.close()
    assert model.selection.how == "measured" and lines
    assert cache_file(other).is_file() and cache_file(bundle).is_file()


def test_measure_false_keeps_the_profiles_order_and_writes_nothing(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, state: Path
) -> None:
    slow_backend(monkeypatch, "onnxruntime")
    model, lines = load(bundle, measure=False)
    with model:
        assert model.candidate == ORT  # the profile's first, slow as it is
        assert model.selection.how == "profile"
        assert model.selection.to_dict() == {"how": "profile", "candidate": ORT}
    assert lines == []
    assert not (state / "choices").exists()


def test_edgekit_measure_0_turns_the_default_off_and_an_explicit_request_still_measures(
    bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgekit.errors import InputError

    slow_backend(monkeypatch, "onnxruntime")
    monkeypatch.setenv("EDGEKIT_MEASURE", "0")
    model, lines = load(bundle, measure=None)
    model.close()
    assert model.selection.how == "profile" and model.candidate == ORT and lines == []
    model, lines = load(bundle)  # measure=LIMITS: asked for, so measured
    model.close()
    assert model.selection.how == "measured" and model.candidate == OV and lines
    monkeypatch.setenv("EDGEKIT_MEASURE", "perhaps")
    with pytest.raises(InputError, match="EDGEKIT_MEASURE"):
        load(bundle, measure=None)


@pytest.mark.parametrize(
    "garbage",
    [
        b"{not json",
        b"\xff\xfe\x00",
        b" " * (choice_cache.MAX_BYTES + 1),
        json.dumps({"format": choice_cache.FORMAT, "bundle_sha256": "0" * 64}).encode(),
        b"[]",
    ],
    ids=["not-json", "not-utf8", "too-large", "another-bundle", "not-an-object"],
)
def test_a_corrupt_or_foreign_cache_file_is_ignored_and_rewritten(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, garbage: bytes
) -> None:
    slow_backend(monkeypatch, "onnxruntime")
    path = cache_file(bundle)
    path.parent.mkdir(parents=True)
    path.write_bytes(garbage)
    model, lines = load(bundle)
    model.close()
    assert model.selection.how == "measured" and model.candidate == OV and lines
    assert "ignoring the cached candidate choice" in caplog.text
    assert json.loads(path.read_text())["format"] == choice_cache.FORMAT


def test_a_cache_file_whose_numbers_are_not_latencies_is_not_trusted(
    bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_backend(monkeypatch, "onnxruntime")
    model, _ = load(bundle)
    model.close()
    path = cache_file(bundle)
    doc = json.loads(path.read_text())
    doc["p90_ms"] = {ORT: -1.0, OV: 5.0}  # someone wrote ORT in front
    path.write_text(json.dumps(doc))
    model, lines = load(bundle)
    model.close()
    assert model.selection.how == "measured" and model.candidate == OV and lines


def _fail_gate(name: str) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        for art in doc["artifacts"]:
            if art["backend"] == name:
                art["accuracy"].update(passed=False, allowed_drop=True)

    return edit


def test_a_candidate_that_failed_the_accuracy_gate_is_never_measured_first(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    from deploy_bundles import resign

    # OpenVINO is the faster here, but shipped under --allow-accuracy-drop: it may not be chosen.
    dropped = resign(bundle, tmp_path / "dropped", keys[0], edit=_fail_gate("openvino"), budget_ms=None)
    ort_loads = slow_backend(monkeypatch, "onnxruntime")
    model, lines = load(dropped)
    with model:
        assert model.candidate == ORT
        assert model.selection.how == "profile"  # one candidate passed: nothing to compare
    assert lines == [] and len(ort_loads) == 1  # loaded for use, never measured


def test_the_bundles_own_selection_wins_over_measuring(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, keys: tuple[Path, Path], state: Path
) -> None:
    from deploy_bundles import resign

    from edgekit.core.elf import host_arch

    def select_ort(doc: dict[str, Any]) -> None:
        art = next(a for a in doc["artifacts"] if a["backend"] == "onnxruntime")
        doc["selection"] = {
            "by": "edgekit bench test",
            "measured": "2026-01-01T00:00:00+00:00",
            "profile": "x86_64-cpu",
            "host": {"arch": host_arch()},
            "chosen": art["name"],
            "threads": 1,
            "candidates": [
                {
                    "artifact": art["name"],
                    "backend": "onnxruntime",
                    "precision": "fp32",
                    "threads": 1,
                    "p50_ms": 0.1,
                    "p90_ms": 0.2,
                    "p99_ms": 0.3,
                    "queries": 100,
                }
            ],
        }

    selected = resign(bundle, tmp_path / "selected", keys[0], edit=select_ort, budget_ms=None)
    slow_backend(monkeypatch, "onnxruntime")  # slower here: measuring would have picked OpenVINO
    model, lines = load(selected)
    with model:
        assert model.candidate == ORT
        assert model.selection.how == "bundle"
        assert model.selection.to_dict()["measured_ms"] == 0.2
    assert lines == [] and not (state / "choices").exists()


def _run_json(bundle: Path, state: Path, *extra: str) -> tuple[dict[str, Any], str]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "EDGEKIT_MEASURE"} | {"EDGEKIT_STATE": str(state)}
    r = run_cli(
        env,
        "run",
        str(bundle),
        "--device",
        "x86_64-cpu",
        "--source",
        "synthetic:64x48@30",
        "--frames",
        "3",
        "--json",
        *extra,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout), r.stderr


def test_edgekit_run_says_which_candidate_and_why(bundle: Path, state: Path) -> None:
    out, err = _run_json(bundle, state)
    sel = out["selection"]
    assert sel["how"] == "measured" and sel["candidate"] in (ORT, OV)
    assert sel["measured_ms"] > 0 and sel["fps"] == pytest.approx(1000 / 33.3, rel=1e-3)
    assert "measuring 2 candidates at 30 fps" in err  # the progress line, on stderr
    again, err = _run_json(bundle, state)
    if sel.get("provisional"):  # this machine was busy (its load average): measured again, as it should
        assert again["selection"]["how"] == "measured" and "busy" in sel
    else:
        assert again["selection"]["how"] == "cached" and again["selection"]["candidate"] == sel["candidate"]
        assert "measuring" not in err
    plain, _ = _run_json(bundle, state, "--no-measure")
    assert plain["selection"] == {"how": "profile", "candidate": ORT}

    # The human output says it too, before the frames.
    import os

    env = {k: v for k, v in os.environ.items() if k != "EDGEKIT_MEASURE"} | {"EDGEKIT_STATE": str(state)}
    r = run_cli(
        env, "run", str(bundle), "--device", "x86_64-cpu", "--source", "synthetic:64x48@30", "--frames", "2"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # (On a busy machine the first runs were provisional: this one measured again, and says so.)
    assert re.search(
        rf"candidate ({OV}|{ORT}): (the fastest here|measured the fastest here now) at 30 fps, p90 [0-9.]+ ms",
        r.stdout,
    )
    if not sel.get("provisional"):
        assert re.search(
            rf"candidate {sel['candidate']}: the fastest here at 30 fps, p90 [0-9.]+ ms, measured 20",
            r.stdout,
        )
