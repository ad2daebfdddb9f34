"""Selection: a pure ranking over plain data, then loading with one logged fallback."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from edgekit.backends.base import Availability
from edgekit.device.profiles import Candidate, get_profile
from edgekit.errors import ModelLoadError, NoUsableBackendError
from edgekit.selection.plan import load_first, plan, select

from conftest import TinyArtifacts

TRT = Candidate("tensorrt", "fp16")
ORT_GPU = Candidate("onnxruntime", "fp16", name="onnxruntime-gpu")
TVM = Candidate("tvm")
ORT = Candidate("onnxruntime")


def only(*ok: Candidate):  # type: ignore[no-untyped-def]
    return lambda c: (
        Availability(True) if c in ok else Availability(False, f"{c.backend} missing", hint="install it")
    )


@pytest.mark.parametrize(
    ("given_available", "latency", "then_order"),
    [
        (
            (TRT, ORT_GPU, TVM, ORT),
            None,
            ["tensorrt-fp16", "onnxruntime-gpu", "tvm-fp32", "onnxruntime-fp32"],
        ),
        ((TVM, ORT), None, ["tvm-fp32", "onnxruntime-fp32"]),
        ((TVM, ORT), {"onnxruntime-fp32": 6.0, "tvm-fp32": 24.0}, ["onnxruntime-fp32", "tvm-fp32"]),
        # Measured candidates first, unmeasured after them in profile order.
        ((TRT, TVM, ORT), {"onnxruntime-fp32": 6.0}, ["onnxruntime-fp32", "tensorrt-fp16", "tvm-fp32"]),
        # A tie keeps the profile's order.
        ((TVM, ORT), {"onnxruntime-fp32": 6.0, "tvm-fp32": 6.0}, ["tvm-fp32", "onnxruntime-fp32"]),
        ((), None, []),
    ],
)
def test_plan_orders_candidates(given_available, latency, then_order) -> None:  # type: ignore[no-untyped-def]
    found = plan([TRT, ORT_GPU, TVM, ORT], only(*given_available), latency)
    assert [c.key for c in found.ordered] == then_order
    assert {c for c, _ in found.skipped} == {TRT, ORT_GPU, TVM, ORT} - set(given_available)
    assert all("missing (install it)" in why for _, why in found.skipped)


def test_plan_is_the_same_every_run() -> None:
    cands = [Candidate("onnxruntime", p, name=f"c{i}") for i, p in enumerate(["fp32", "fp16", "int8"] * 4)]
    latency = {c.key: 5.0 for c in cands}
    orders = {
        tuple(c.key for c in plan(cands, lambda c: Availability(True), latency).ordered) for _ in range(20)
    }
    assert orders == {tuple(c.key for c in cands)}


class FakeSession:
    def __init__(self, key: str) -> None:
        self.key, self.candidate, self.fallbacks = key, "", ()


def test_first_candidate_fails_to_load_falls_back_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    def load(c: Candidate) -> FakeSession:
        if c is TVM:
            raise ModelLoadError("tvm: model.so was built for aarch64, this host is x86_64")
        return FakeSession(c.key)

    caplog.set_level(logging.INFO, "edgekit.selection.plan")
    session = load_first(plan([TRT, TVM, ORT], only(TVM, ORT)), load)  # type: ignore[arg-type]
    assert session.candidate == "onnxruntime-fp32"
    assert [who for who, _ in session.fallbacks] == ["tensorrt-fp16", "tvm-fp32"]
    assert "falling back to onnxruntime-fp32" in caplog.text and "built for aarch64" in caplog.text


def test_all_candidates_fail_gives_one_error_with_every_cause() -> None:
    def load(c: Candidate) -> FakeSession:
        raise ModelLoadError(f"{c.backend}: corrupt file")

    with pytest.raises(NoUsableBackendError) as err:
        load_first(plan([TRT, TVM, ORT], only(TVM, ORT)), load)  # type: ignore[arg-type]
    assert [who for who, _ in err.value.causes] == ["tensorrt-fp16", "tvm-fp32", "onnxruntime-fp32"]
    text = str(err.value)
    assert "tensorrt missing" in text and "tvm: corrupt file" in text and "onnxruntime: corrupt file" in text


def test_jetson_profile_on_this_host_falls_back_to_real_onnxruntime(
    tiny: TinyArtifacts, caplog: pytest.LogCaptureFixture
) -> None:
    """The real thing: TensorRT and the GPU providers are not here, TVM has no artifact, ORT CPU runs."""
    artifacts: dict[str, Path] = {
        "tensorrt-fp16": tiny.onnx,
        "onnxruntime-gpu": tiny.onnx,
        "onnxruntime-fp32": tiny.onnx,
    }
    with select(get_profile("jetson").candidates, lambda c: artifacts.get(c.key)) as session:
        assert session.backend == "onnxruntime" and session.candidate == "onnxruntime-fp32"
        causes = dict(session.fallbacks)
        assert "tensorrt" in causes["tensorrt-fp16"]
        assert "TensorrtExecutionProvider" in causes["onnxruntime-gpu"]
        assert "no tvm fp32 artifact for this host" in causes["tvm-fp32"]
        (logits,) = session.run(tiny.input_nchw)
    assert abs(logits - tiny.expected).max() < 1e-4
