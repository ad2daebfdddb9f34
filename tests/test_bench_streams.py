"""``edgekit bench BUNDLE --streams N``: how many cameras one pipeline holds, batched and unbatched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgekit.bench.streams import StreamStep, held
from tests.conftest import edgekit as run_cli


def test_held_means_every_p99_within_the_budget_and_no_drop() -> None:
    assert held({"cam0": 10.0, "cam1": 33.0}, 0, 33.0)
    assert not held({"cam0": 10.0, "cam1": 33.5}, 0, 33.0)
    assert not held({"cam0": 10.0}, 1, 33.0)
    assert not held({"cam0": 10.0, "cam1": None}, 0, 33.0)  # a camera without a frame
    assert not held({}, 0, 33.0)
    step = StreamStep("batched", 2, 33.0, {"cam0": 5.0, "cam1": None}, 0, 9, 1.5, 2, 1.0)
    assert step.worst_p99_ms is None and not step.held and step.to_dict()["batch"] == "auto"


def test_bad_streams_values_are_an_error_with_a_hint(cache_env: dict[str, str], tmp_path: Path) -> None:
    # Checked before the bundle is opened.
    for args in (("--streams", "0"), ("--streams", "2", "--seconds", "0"), ("--streams", "2", "--fps", "0")):
        r = run_cli(cache_env, "bench", str(tmp_path / "no-bundle"), *args, "--json")
        assert r.returncode == 2 and "hint:" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert "--streams" in r.stderr and r.stdout == ""


@pytest.mark.slow
def test_bench_streams_json_has_both_series_each_stopped_at_its_first_miss(
    x86_bundle: tuple[Path, dict[str, Any]], cache_env: dict[str, str]
) -> None:
    r = run_cli(cache_env, "bench", str(x86_bundle[0]), "--streams", "2", "--seconds", "1", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["scenario"] == "streams" and doc["max_streams"] == 2 and doc["fps"] == 30
    assert doc["source"] == "synthetic:640x480@30" and doc["budget_ms"] > 0 and doc["candidate"]
    budget = doc["budget_ms"]
    for series, batch in (("batched", "auto"), ("unbatched", "off")):
        steps = [s for s in doc["steps"] if s["series"] == series]
        # n = 1, 2, ... in order; every step before the last held; the last held unless it was the miss.
        assert [s["n"] for s in steps] == list(range(1, len(steps) + 1)) and steps, series
        assert all(s["held"] for s in steps[:-1]), steps
        if len(steps) < 2:
            assert not steps[-1]["held"], "a series stops early only at a number not held"
        for s in steps:
            assert s["batch"] == batch
            assert sorted(s["p99_ms"]) == [f"cam{i}" for i in range(s["n"])]
            known = [v for v in s["p99_ms"].values() if v is not None]
            if known and len(known) == s["n"]:
                assert s["worst_p99_ms"] == max(known)
            # The rule, from the step's own numbers.
            assert s["held"] == (
                s["dropped"] == 0 and len(known) == s["n"] and all(v <= budget for v in known)
            ), s
            assert s["frames"] >= 1
            # Frames per inference: one without batching, at most the cameras with it.
            assert 1 <= s["batch_max"] <= (1 if batch == "off" else min(s["n"], 8)), s
            assert 1.0 <= s["batch_mean"] <= s["batch_max"], s
        most = max((s["n"] for s in steps if s["held"]), default=0)
        assert doc["most_held"][series] == most and doc["capped"][series] == (most == 2)
    # Progress on stderr, one line per step (stdout is the JSON document alone).
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith(("batched, ", "unbatched, "))]
    assert len(lines) == len(doc["steps"])
