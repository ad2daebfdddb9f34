"""The ARM64 check's detector comparison (tools/arm64_detect.py): what fails it and what may pass.

The check itself runs under QEMU as root (tools/arm64_check.sh); here its rule is driven with
runs written as the check writes them, changed one way at a time.
"""

from __future__ import annotations

import copy
import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"

FACE = {"class_id": 0, "name": "face", "score": 0.9226, "box": [178.1, 80.9, 272.1, 175.0]}
CAMERAMAN = {"class_id": 0, "name": "face", "score": 0.7878, "box": [179.6, 121.3, 263.6, 205.3]}


@pytest.fixture
def tool(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(TOOLS))  # as the check runs it: arm64_check_inside beside it
    monkeypatch.delitem(sys.modules, "arm64_detect", raising=False)
    return importlib.import_module("arm64_detect")


def frames(astronaut: list[dict[str, Any]], camera: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {"astronaut": astronaut, "camera": camera, "moon": [], "rocket": []}


def runs() -> tuple[dict[str, Any], dict[str, Any]]:
    """An x86_64 and an arm64 run that agree: the rule passes them."""
    x86: dict[str, Any] = {
        "host_arch": "x86_64",
        "artifacts": {
            "onnxruntime-fp32": {
                "backend": "onnxruntime",
                "precision": "fp32",
                "frames": frames([FACE], [CAMERAMAN]),
            }
        },
    }
    arm: dict[str, Any] = {
        "host_arch": "aarch64",
        "selected": {"candidate": "tvm-fp32", "artifact": "tvm-fp32"},
        "artifacts": {
            "tvm-fp32": {"backend": "tvm", "precision": "fp32", "via": "edgekit.load", "ms": 226.0},
            "litert-int8": {"backend": "litert", "precision": "int8", "ms": 258.0},
        },
        "health": {
            "ok": True,
            "reason": "",
            "candidate": "tvm-fp32",
            "frames": 8,
            "s": 17.0,
            "p50_ms": 202.0,
            "detection": {"matched": 6, "decisive": 6, "missed": 0, "extra": 0, "mean_iou": 1.0},
        },
    }
    for name in ("tvm-fp32", "litert-int8"):
        arm["artifacts"][name]["frames"] = frames([FACE], [CAMERAMAN])
    return x86, arm


def moved(face: dict[str, Any], dx: float = 0.0, score: float = 0.0) -> dict[str, Any]:
    box = face["box"]
    return {**face, "score": face["score"] + score, "box": [box[0] + dx, box[1], box[2] + dx, box[3]]}


def test_agreeing_runs_pass_and_the_table_shows_faces_iou_and_score(
    tool: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    x86, arm = runs()
    assert tool.compare(x86, arm) == []
    out = capsys.readouterr().out
    assert "selected tvm-fp32" in out and "health gate on arm64 (tvm-fp32): passed" in out
    assert "tvm-fp32 (selected)          astronaut      1    1  1.000   0.923  +0.000  226" in out


def test_a_face_where_there_is_none_or_a_missed_face_fails(tool: ModuleType) -> None:
    x86, arm = runs()
    arm["artifacts"]["litert-int8"]["frames"]["moon"] = [moved(CAMERAMAN, score=-0.2)]
    arm["artifacts"]["tvm-fp32"]["frames"]["camera"] = []
    problems = tool.compare(x86, arm)
    assert any(p.startswith("litert-int8 on moon: 1 faces on arm64, 0") and "1 extra" in p for p in problems)
    assert any(p.startswith("tvm-fp32 on camera: 0 faces on arm64, 1") and "1 missed" in p for p in problems)
    assert len(problems) == 2, problems


def test_fp32_must_be_close_everywhere_int8_on_the_astronaut(tool: ModuleType) -> None:
    # 8 px on a 84 px box: IoU 0.83, still the build gate's match (>= 0.5).
    loose = moved(CAMERAMAN, dx=8, score=0.03)
    x86, arm = runs()
    arm["artifacts"]["litert-int8"]["frames"]["camera"] = [loose]
    assert tool.compare(x86, arm) == []  # int8 off the astronaut: the build gate's rule
    arm["artifacts"]["tvm-fp32"]["frames"]["camera"] = [loose]
    arm["artifacts"]["litert-int8"]["frames"]["astronaut"] = [moved(FACE, score=0.021)]
    problems = tool.compare(x86, arm)
    assert any(p.startswith("tvm-fp32 on camera: IoU 0.8") and "under 0.9" in p for p in problems), problems
    assert any(p.startswith("tvm-fp32 on camera: score +0.030") for p in problems), problems
    assert any(p.startswith("litert-int8 on astronaut: score +0.021") for p in problems), problems
    assert len(problems) == 3, problems


def test_another_selection_or_a_failed_health_gate_fails(tool: ModuleType) -> None:
    x86, arm = runs()
    changed = copy.deepcopy(arm)
    changed["selected"] = {"candidate": "litert-fp32", "artifact": "litert-fp32"}
    assert any("selected litert-fp32 for the detector" in p for p in tool.compare(x86, changed))
    changed = copy.deepcopy(arm)
    changed["health"].update(ok=False, reason="1 decisive extra")
    assert tool.compare(x86, changed) == ["the health gate failed on arm64: 1 decisive extra"]
    changed = copy.deepcopy(arm)
    del changed["health"]
    assert tool.compare(x86, changed) == ["the health gate did not run on arm64"]
    changed = copy.deepcopy(arm)
    changed["artifacts"]["litert-int8"] = {"backend": "litert", "precision": "int8", "skipped": "no delegate"}
    assert tool.compare(x86, changed) == ["litert-int8 did not run on arm64: no delegate"]
