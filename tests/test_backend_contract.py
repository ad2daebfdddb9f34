"""The contract every backend keeps (edgekit.testing.contract), run against each built-in one.

A subclass per backend says which artifact of the tiny model it loads.  The same tiny model
must give the same logits on every backend (within 1e-4 of a numpy reference), and bad input
must raise edgekit's error naming the backend, the file and what was expected.  A backend
that cannot run here is skipped with the reason it gives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from edgekit.testing.contract import CHECKS, Check, Subject, unavailable

from conftest import TinyArtifacts


class BackendContract:
    name: ClassVar[str]
    options: ClassVar[dict[str, Any]] = {}
    layout: ClassVar[str] = "NCHW"

    def artifact(self, tiny: TinyArtifacts) -> Path:
        raise NotImplementedError

    @pytest.fixture
    def subject(self, tiny: TinyArtifacts) -> Subject:
        # Skipped before the artifact is asked for: a backend that is not here may have none (TVM).
        probe = Subject(self.name, Path(), tiny.input_nchw, tiny.expected, self.options, self.layout)
        reason = unavailable(probe)
        if reason is not None:
            pytest.skip(f"{self.name} unavailable here: {reason}")
        x = tiny.input_nchw
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if self.layout == "NHWC" else x
        return Subject(self.name, self.artifact(tiny), x, tiny.expected, self.options, self.layout)

    @pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
    def test_contract(self, check: Check, subject: Subject, tmp_path: Path) -> None:
        check(subject, tmp_path)


class TestOnnxRuntime(BackendContract):
    name = "onnxruntime"
    options: ClassVar[dict[str, Any]] = {"intra_op_threads": 2}

    def artifact(self, tiny: TinyArtifacts) -> Path:
        return tiny.onnx


class TestOpenVINO(BackendContract):
    name = "openvino"
    options: ClassVar[dict[str, Any]] = {"device": "CPU", "hint": "LATENCY"}

    def artifact(self, tiny: TinyArtifacts) -> Path:
        return tiny.openvino_ir


class TestOpenVINOReadsOnnx(TestOpenVINO):
    def artifact(self, tiny: TinyArtifacts) -> Path:
        return tiny.onnx


class TestLiteRT(BackendContract):
    name = "litert"
    options: ClassVar[dict[str, Any]] = {"num_threads": 2}
    layout = "NHWC"

    def artifact(self, tiny: TinyArtifacts) -> Path:
        return tiny.tflite


class TestLiteRTReferenceKernels(TestLiteRT):
    options: ClassVar[dict[str, Any]] = {"delegate": "none"}


class TestTVM(BackendContract):
    name = "tvm"
    options: ClassVar[dict[str, Any]] = {"num_threads": 2}

    def artifact(self, tiny: TinyArtifacts) -> Path:
        assert tiny.tvm_x86_64 is not None
        return tiny.tvm_x86_64


@pytest.mark.tensorrt
class TestTensorRT(BackendContract):
    """Runs on an NVIDIA machine with TensorRT (pytest -m tensorrt); skipped here with its reason."""

    name = "tensorrt"
    options: ClassVar[dict[str, Any]] = {"fp16": False}

    def artifact(self, tiny: TinyArtifacts) -> Path:
        return tiny.onnx
