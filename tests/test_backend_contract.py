"""The contract every backend keeps, run against each one (fsspec's abstract tests).

One class states the behaviour; a subclass per backend says which artifact it loads.
The same tiny model must give the same logits on every backend (within 1e-4 of a numpy
reference), and bad input must raise edgekit's error naming the backend, the file and
what was expected.  A backend that cannot run here is skipped with the reason it gives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from edgekit.backends import registry
from edgekit.backends.base import Session
from edgekit.errors import InputError, ModelLoadError

from conftest import TinyArtifacts


class BackendContract:
    name: ClassVar[str]
    options: ClassVar[dict[str, Any]] = {}
    layout: ClassVar[str] = "NCHW"

    def artifact(self, tiny: TinyArtifacts) -> Path:
        raise NotImplementedError

    @pytest.fixture
    def backend(self) -> Any:
        backend = registry.get(self.name)
        avail = backend.available(self.options)
        if not avail.ok:
            pytest.skip(f"{self.name} unavailable here: {avail.reason}")
        return backend

    @pytest.fixture
    def session(self, backend: Any, tiny: TinyArtifacts) -> Any:
        with backend.load(self.artifact(tiny), self.options) as s:
            yield s

    def model_input(self, tiny: TinyArtifacts) -> np.ndarray:
        x = tiny.input_nchw
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if self.layout == "NHWC" else x

    def test_available_reports_a_version(self, backend: Any) -> None:
        avail = backend.available(self.options)
        assert avail.ok and avail.version, avail

    def test_specs_describe_the_model(self, session: Session) -> None:
        assert isinstance(session, Session)
        assert session.backend == self.name
        (inp,) = session.inputs
        assert inp.dtype == "float32"
        assert inp.shape == ((1, 3, 32, 32) if self.layout == "NCHW" else (1, 32, 32, 3))
        assert inp.layout == self.layout
        (out,) = session.outputs
        assert out.shape == (1, 10) and out.dtype == "float32"
        assert session.device

    def test_same_outputs_as_the_reference(self, session: Session, tiny: TinyArtifacts) -> None:
        (logits,) = session.run(self.model_input(tiny))
        assert logits.shape == (1, 10)
        np.testing.assert_allclose(logits, tiny.expected, atol=1e-4, rtol=0)

    def test_runs_repeatedly_with_fresh_outputs(self, session: Session, tiny: TinyArtifacts) -> None:
        x = self.model_input(tiny)
        (first,) = session.run(x)
        (second,) = session.run(np.zeros_like(x))
        assert not np.allclose(first, second)  # an output buffer reused across runs would make these equal
        np.testing.assert_allclose(first, tiny.expected, atol=1e-4, rtol=0)

    def test_wrong_shape_names_backend_file_and_expectation(
        self, session: Session, tiny: TinyArtifacts
    ) -> None:
        x = self.model_input(tiny)
        with pytest.raises(InputError) as err:
            session.run(np.zeros((1, 16, 16, 3) if self.layout == "NCHW" else (1, 3, 16, 16), np.float32))
        text = str(err.value)
        assert self.name in text and session.artifact.name in text
        assert f"expected input: float32[{', '.join(map(str, x.shape))}]" in text

    def test_wrong_dtype_names_expected_dtype(self, session: Session, tiny: TinyArtifacts) -> None:
        with pytest.raises(InputError) as err:
            session.run(self.model_input(tiny).astype(np.float64))
        assert "float64" in str(err.value) and "float32" in str(err.value) and self.name in str(err.value)

    def test_wrong_number_of_inputs(self, session: Session, tiny: TinyArtifacts) -> None:
        x = self.model_input(tiny)
        with pytest.raises(InputError, match="got 2 input"):
            session.run(x, x)

    def test_closed_session_refuses_to_run(self, backend: Any, tiny: TinyArtifacts) -> None:
        s = backend.load(self.artifact(tiny), self.options)
        s.close()
        with pytest.raises(InputError, match="closed"):
            s.run(self.model_input(tiny))

    def test_corrupt_model_file(self, backend: Any, tiny: TinyArtifacts, tmp_path: Path) -> None:
        good = self.artifact(tiny)
        bad = tmp_path / good.name
        data = good.read_bytes()
        bad.write_bytes(data[: len(data) // 3])  # truncated, as by an interrupted copy
        for sidecar in good.parent.glob(good.stem + ".*"):
            if sidecar != good and not (tmp_path / sidecar.name).exists():
                (tmp_path / sidecar.name).write_bytes(sidecar.read_bytes())
        with pytest.raises(ModelLoadError) as err:
            backend.load(bad, self.options)
        assert self.name in str(err.value) and str(bad) in str(err.value)
        assert err.value.hint

    def test_missing_file(self, backend: Any, tmp_path: Path, tiny: TinyArtifacts) -> None:
        missing = tmp_path / ("nothing" + "".join(self.artifact(tiny).suffixes))
        with pytest.raises(ModelLoadError, match="does not exist"):
            backend.load(missing, self.options)

    def test_unknown_option_is_refused(self, backend: Any, tiny: TinyArtifacts) -> None:
        from edgekit.errors import BackendError

        with pytest.raises(BackendError, match="unknown option"):
            backend.load(self.artifact(tiny), {**self.options, "nmu_threads": 2})


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
