"""What a user installs works as the README says: the wheel, installed by pip into a clean virtual
environment as ``edgekit[all]``, passes ``pip check``, runs ``edgekit doctor`` and builds.

``[all]`` is the whole of it, not a lighter extra: the TVM/LiteRT conflict lives only in the
full set (apache-tvm-ffi needs typing-extensions>=4.13, litert-torch's xdsl pins <4.13), and
pip's cache and the local wheels keep a rerun to a few minutes.  The LiteRT converter is not
in ``[all]`` (no resolver can install it beside TVM), so a build from a PyTorch card leaves
the LiteRT artifacts out and says what to install, rather than failing.

Slow (pip unpacks torch, OpenVINO, TVM and the rest: 2.3 GB, removed afterwards; about 4.5
minutes in all on two cores) and it needs the package index: skipped, saying so, when the
index cannot be reached.  torch comes from pip's own sources as configured: a CPU wheel where
one is there (pip's find-links), else PyPI's build for this platform.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tiny_model

ROOT = Path(__file__).resolve().parent.parent
INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/")
INSTALL_TIMEOUT_S = 1800

pytestmark = pytest.mark.slow


def _index_unreachable() -> str | None:
    try:
        urllib.request.urlopen(INDEX.rstrip("/") + "/pip/", timeout=20).close()
    except OSError as err:
        return f"the package index {INDEX} is unreachable ({err}): pip cannot install edgekit[all] here"
    return None


@dataclass(frozen=True)
class Venv:
    root: Path
    env: dict[str, str]  # the venv's edgekit, never this checkout's
    work: Path  # commands run here: outside the checkout, so `python -c` cannot import it from the cwd

    def run(self, *cmd: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(c) for c in cmd],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            cwd=self.work,
        )

    def bin(self, name: str) -> Path:
        return self.root / "bin" / name


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    """A fresh venv with the wheel of this checkout installed as ``edgekit[all]``; removed afterwards."""
    if why := _index_unreachable():
        pytest.skip(why)
    work = tmp_path_factory.mktemp("wheel")
    # No PYTHONPATH and no outer venv (this checkout's code would win); caches of its own.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env |= {
        "PATH": f"{work / 'venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        "EDGEKIT_CACHE": str(work / "cache"),
        "EDGEKIT_STATE": str(work / "state"),
    }
    v = Venv(work / "venv", env, work)
    try:
        r = v.run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", work / "dist", ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
        (wheel,) = (work / "dist").glob("edgekit-*.whl")
        r = v.run(sys.executable, "-m", "venv", v.root)
        assert r.returncode == 0, r.stderr[-3000:]
        r = v.run(v.bin("python"), "-m", "pip", "install", "-q", f"{wheel}[all]", timeout=INSTALL_TIMEOUT_S)
        assert r.returncode == 0, r.stderr[-5000:]
        yield v
    finally:
        shutil.rmtree(v.root, ignore_errors=True)  # gigabytes: never left for pytest's tmp retention


def _json(r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def _by_recipe(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["recipe"]: a for a in report["artifacts"]}


def test_all_installs_in_one_step_and_doctor_sees_every_runtime(venv: Venv) -> None:
    r = venv.run(venv.bin("python"), "-m", "pip", "check")
    assert r.returncode == 0, r.stdout + r.stderr  # the resolved set is consistent: nothing forced over it
    # It is the wheel's edgekit that runs, with the device profiles it carries inside the package.
    r = venv.run(venv.bin("python"), "-c", "import edgekit; print(edgekit.__file__)")
    assert r.stdout.strip().startswith(str(venv.root)), r.stdout
    report = _json(venv.run(venv.bin("edgekit"), "doctor", "--json"))
    assert report["profile"] is not None
    for backend in ("onnxruntime", "openvino", "litert", "tvm"):
        b = report["backends"][backend]
        assert b["available"], (backend, b)
    # [all] carries PyGObject (built from source against the system's GStreamer introspection data).
    assert report["video_decode"]["gstreamer"]["available"], report["video_decode"]["gstreamer"]


def test_a_small_build_from_an_onnx_file_makes_every_backends_artifact(venv: Venv, tmp_path: Path) -> None:
    model = tiny_model.write_onnx(tmp_path / "tiny.onnx", tiny_model.make_weights())
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"class{i}\n" for i in range(tiny_model.NUM_CLASSES)), encoding="utf-8")
    flags = ("--mean", "0", "--std", "255", "--labels", labels, "--tvm-untuned", "--json")
    report = _json(
        venv.run(
            venv.bin("edgekit"),
            "build",
            "--onnx",
            model,
            "--device",
            "x86_64-cpu",
            "-o",
            tmp_path / "b",
            *flags,
        )
    )
    arts = _by_recipe(report)
    for recipe in ("onnxruntime-fp32", "onnxruntime-int8", "openvino-fp32", "openvino-int8", "tvm-fp32"):
        assert arts[recipe]["path"], (recipe, arts[recipe])
        assert arts[recipe]["accuracy"]["passed"], (recipe, arts[recipe]["accuracy"])
    assert "an ONNX file has none" in arts["litert-fp32"]["skipped"]
    r = venv.run(venv.bin("edgekit"), "verify", tmp_path / "b")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_pytorch_build_leaves_litert_out_and_says_what_to_install(venv: Venv, tmp_path: Path) -> None:
    r = venv.run(venv.bin("python"), "-c", "import importlib.util as u; print(u.find_spec('litert_torch'))")
    assert r.stdout.strip() == "None", "edgekit[all] now installs litert-torch: build LiteRT here instead"
    # The reference card inside the installed wheel (what `edgekit demo` builds).
    r = venv.run(
        venv.bin("python"), "-c", "from edgekit.demo import reference_model_dir; print(reference_model_dir())"
    )
    card = r.stdout.strip()
    assert card.startswith(str(venv.root)), r.stdout + r.stderr
    only = ("--backends", "onnxruntime,litert", "--precisions", "fp32", "--json")
    report = _json(
        venv.run(
            venv.bin("edgekit"),
            "build",
            "--model",
            card,
            "--device",
            "x86_64-cpu",
            "-o",
            tmp_path / "b",
            *only,
        )
    )
    arts = _by_recipe(report)
    assert arts["onnxruntime-fp32"]["accuracy"]["passed"]
    why = arts["litert-fp32"]["skipped"]
    assert arts["litert-fp32"]["path"] is None
    assert 'pip install "litert-torch==0.10.0"' in why and "typing-extensions" in why, why
