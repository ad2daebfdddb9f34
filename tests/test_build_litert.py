"""LiteRT artifacts: fp32, int8 and the full-integer Edge TPU model, from the real reference model.

The conversion needs ``litert-torch`` (installed in its own pip step: see docs/guides/deploy.md, "Installing
on a device"); without it those tests are skipped with that reason.  The Edge TPU compiler is
x86_64 Debian only and is not here: the compile path runs against a stand-in that behaves
like ``edgetpu_compiler -s`` (same file naming, same log format).
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.convert.artifact import Artifact
from edgekit.convert.litert import (
    convert_tflite,
    nhwc_batch,
    non_integer_ops,
    parse_compiler_log,
    unsupported_op,
)
from edgekit.errors import BuildError
from edgekit.processing.preprocessing import PreprocessSpec

CONVERTER_MISSING = (
    "litert-torch is not installed: CI installs it after the main install with "
    'pip install "litert-torch==0.10.0" && pip install "typing-extensions>=4.14" "pydantic>=2.12"'
)

# What edgetpu_compiler 16 prints with -s when every operator maps (format from Coral's issue tracker).
COMPILER_LOG_ALL_MAPPED = """Edge TPU Compiler version 16.0.384591198
Started a compilation timeout timer of 180 seconds.

Model compiled successfully in 1203 ms.

Input model: {src}
Input size: 5.26MiB
Output model: {out}
Output size: 5.51MiB
On-chip memory used for caching model parameters: 5.24MiB
On-chip memory remaining for caching model parameters: 2.56MiB
Off-chip memory used for streaming uncached model parameters: 0.00B
Number of Edge TPU subgraphs: 1
Total number of operations: 60
Operation log: {log}

Operator                       Count      Status

CONV_2D                        33         Mapped to Edge TPU
DEPTHWISE_CONV_2D              16         Mapped to Edge TPU
ADD                            9          Mapped to Edge TPU
MEAN                           1          Mapped to Edge TPU
FULLY_CONNECTED                1          Mapped to Edge TPU
"""

COMPILER_LOG_PARTLY_MAPPED = """Edge TPU Compiler version 2.1.302470888

Model compiled successfully in 12264 ms.

Number of Edge TPU subgraphs: 1
Total number of operations: 93
Operation log: model2_edgetpu.log

Model successfully compiled but not all operations are supported by the Edge TPU.
Number of operations that will run on Edge TPU: 83
Number of operations that will run on CPU: 10

Operator                       Count      Status

LOGISTIC                       1          More than one subgraph is not supported
ADD                            10         Mapped to Edge TPU
CONCATENATION                  3          Mapped to Edge TPU
QUANTIZE                       9          Operation is otherwise supported, but not mapped due to some unspecified limitation
CONV_2D                        70         Mapped to Edge TPU
"""


def _litert_torch() -> None:
    pytest.importorskip("litert_torch", reason=CONVERTER_MISSING)


def _tiny_module(kind: str = "plain") -> Any:
    """Conv -> ReLU6 -> global mean -> Linear (NCHW), optionally with one op LiteRT lacks somewhere."""
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.nn.functional.relu6(self.conv(x))
            if kind == "no-int8":  # converts to SIN, which has no int8 kernel
                y = torch.sin(y)
            if kind == "no-lowering":  # litert-torch has no lowering for it
                y = torch.special.erfcx(y)
            return self.fc(y.mean((2, 3)))

    return Tiny().eval()


TINY_SPEC = PreprocessSpec(size=(16, 16), mean=(127.0, 127.0, 127.0), std=(128.0, 128.0, 128.0))


def _tiny_calibration() -> np.ndarray:
    return np.random.default_rng(3).uniform(-1, 1, (4, 3, 16, 16)).astype(np.float32)


def _run(path: Path, batch_nchw: np.ndarray) -> np.ndarray:
    from edgekit.backends import open_session
    from edgekit.convert.accuracy import run_batch

    with open_session(path, "litert", num_threads=2) as session:
        return run_batch(session, batch_nchw)


# -- pure functions: no converter needed ------------------------------------------------------


def test_compiler_log_with_every_operator_mapped() -> None:
    summary = parse_compiler_log(
        COMPILER_LOG_ALL_MAPPED.format(src="m.tflite", out="m_edgetpu.tflite", log="l")
    )
    assert summary["compiler"] == "16.0.384591198"
    assert summary["total_ops"] == 60
    assert summary["edgetpu_ops"] == 60
    assert summary["cpu_ops"] == 0
    assert summary["edgetpu_subgraphs"] == 1
    assert "not_mapped" not in summary


def test_compiler_log_with_operators_left_on_the_cpu() -> None:
    summary = parse_compiler_log(COMPILER_LOG_PARTLY_MAPPED)
    assert (summary["edgetpu_ops"], summary["cpu_ops"]) == (83, 10)
    assert summary["not_mapped"]["LOGISTIC"] == "More than one subgraph is not supported"
    assert set(summary["not_mapped"]) == {"LOGISTIC", "QUANTIZE"}


@pytest.mark.parametrize(
    ("message", "op"),
    [
        (
            "Lowering not found: aten.special_erfcx.default\n\nWhile executing %special_erfcx",
            "aten.special_erfcx.default",
        ),
        ("loc(x): error: failed to legalize operation 'stablehlo.custom_call'", "stablehlo.custom_call"),
        ("Quantization not yet supported for op: 'SIN'.", "SIN"),
        ("something else went wrong", None),
    ],
)
def test_the_operator_is_read_from_converter_messages(message: str, op: str | None) -> None:
    assert unsupported_op(message) == op


def test_calibration_batch_is_taken_in_either_layout_and_refused_otherwise() -> None:
    nchw = _tiny_calibration()
    nhwc = nhwc_batch(nchw, TINY_SPEC)
    assert nhwc.shape == (4, 16, 16, 3)
    assert nhwc.flags.c_contiguous
    np.testing.assert_array_equal(nhwc_batch(nhwc, TINY_SPEC), nhwc)
    with pytest.raises(BuildError, match=r"expected \(N, 3, 16, 16\)"):
        nhwc_batch(np.zeros((4, 3, 8, 8), np.float32), TINY_SPEC)


def test_unknown_precision_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="unknown precision"):
        convert_tflite(object(), TINY_SPEC, tmp_path, _tiny_calibration(), ["fp16"])
    assert list(tmp_path.iterdir()) == []


# -- the tiny model: fast conversions of the edge cases -----------------------------------------


@pytest.fixture(scope="module")
def tiny_edgetpu_src(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    _litert_torch()
    out = tmp_path_factory.mktemp("tiny-litert")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", _without_edgetpu_compiler())
        (art,) = convert_tflite(_tiny_module(), TINY_SPEC, out, _tiny_calibration(), ["edgetpu"], stem="tiny")
    return art


def _fake_compiler(bin_dir: Path, exit_code: int = 0) -> None:
    """A stand-in for edgetpu_compiler: same output naming (-o DIR, <input>_edgetpu.tflite), same -s log."""
    script = bin_dir / "edgetpu_compiler"
    body = f"""#!{sys.executable}
import pathlib, shutil, sys
args = sys.argv[1:]
src = pathlib.Path(args[-1])
out = pathlib.Path(args[args.index("-o") + 1]) / (src.stem + "_edgetpu.tflite")
if {exit_code}:
    print("Edge TPU Compiler version 16.0.384591198")
    print("Internal compiler error. Aborting!")
    sys.exit({exit_code})
shutil.copyfile(src, out)
print({COMPILER_LOG_ALL_MAPPED!r}.format(src=src, out=out, log="x.log"))
"""
    script.write_text(body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def _without_edgetpu_compiler() -> str:
    """PATH minus any directory holding a real edgetpu_compiler (these tests check the CPU-side models)."""
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(d for d in dirs if not (Path(d) / "edgetpu_compiler").exists())


@pytest.mark.slow
def test_fp32_takes_nhwc_and_fails_nothing_when_only_fp32_is_asked(tmp_path: Path) -> None:
    _litert_torch()
    (art,) = convert_tflite(
        _tiny_module(), TINY_SPEC, tmp_path, np.zeros((0, 3, 16, 16)), ["fp32"], stem="tiny"
    )
    assert (art.precision, art.kind, art.notes["layout"]) == ("fp32", "tflite", "NHWC")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-fp32.tflite"]
    import torch

    x = _tiny_calibration()
    with torch.no_grad():
        expected = _tiny_module()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(_run(art.path, x), expected, atol=1e-4)


@pytest.mark.slow
def test_edgetpu_source_without_the_compiler_says_what_to_run_where(tiny_edgetpu_src: Artifact) -> None:
    art = tiny_edgetpu_src
    assert art.path.name == "tiny-int8_edgetpu_src.tflite"
    assert art.kind == "tflite-edgetpu-src"
    assert art.options == {}
    assert non_integer_ops(art.path) == []
    assert "edgetpu_compiler -s tiny-int8_edgetpu_src.tflite" in art.notes["edgetpu"]
    assert "x86_64" in art.notes["edgetpu"]
    assert not list(art.path.parent.glob("*_edgetpu.tflite"))


@pytest.mark.slow
def test_edgetpu_compiler_on_path_is_run_and_its_log_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _litert_torch()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_compiler(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "out"
    (art,) = convert_tflite(_tiny_module(), TINY_SPEC, out, _tiny_calibration(), ["edgetpu"], stem="tiny")
    assert art.kind == "tflite-edgetpu"
    assert art.path.name == "tiny-int8_edgetpu.tflite"
    assert art.options == {"delegate": "edgetpu"}
    assert art.notes["source_model"] == "tiny-int8_edgetpu_src.tflite"
    assert art.files == (art.path, out / "tiny-int8_edgetpu_src.tflite")
    assert art.notes["edgetpu"]["edgetpu_ops"] == 60
    assert sorted(p.name for p in out.iterdir()) == [
        "tiny-int8_edgetpu.tflite",
        "tiny-int8_edgetpu_src.tflite",
    ]


@pytest.mark.slow
def test_a_failing_edgetpu_compiler_is_a_build_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _litert_torch()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_compiler(bin_dir, exit_code=1)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "out"
    with pytest.raises(BuildError, match=r"edgetpu_compiler failed on tiny-int8_edgetpu_src\.tflite"):
        convert_tflite(_tiny_module(), TINY_SPEC, out, _tiny_calibration(), ["edgetpu"], stem="tiny")
    assert list(out.iterdir()) == []


@pytest.mark.slow
def test_an_operator_the_converter_lacks_is_named_with_the_target(tmp_path: Path) -> None:
    _litert_torch()
    with pytest.raises(BuildError) as err:
        convert_tflite(_tiny_module("no-lowering"), TINY_SPEC, tmp_path, _tiny_calibration())
    assert "aten.special_erfcx" in err.value.message
    assert "LiteRT" in err.value.message
    assert "test_build_litert.py" in err.value.message  # where in the model code it came from
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_an_operator_without_an_int8_kernel_is_named_and_nothing_is_left(tmp_path: Path) -> None:
    _litert_torch()
    with pytest.raises(
        BuildError, match=r"operator SIN has no int8 kernel \(target LiteRT int8 / Edge TPU\)"
    ):
        convert_tflite(_tiny_module("no-int8"), TINY_SPEC, tmp_path, _tiny_calibration())
    assert list(tmp_path.iterdir()) == []


# -- the reference model ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Artifact], np.ndarray, tuple[str, ...]]:
    _litert_torch()
    from edgekit.convert.images import smoke_set
    from edgekit.convert.model_sources import load_pytorch
    from edgekit.convert.modelcard import read_card

    card = read_card(Path(__file__).parent.parent / "models" / "efficientnet-lite0")
    images = smoke_set()
    batch = images.batch(card.preprocess)
    out = tmp_path_factory.mktemp("litert-ref")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", _without_edgetpu_compiler())
        made = convert_tflite(load_pytorch(card), card.preprocess, out, batch, stem="efficientnet-lite0")
    return {a.key: a for a in made}, batch, images.names


@pytest.mark.slow
def test_reference_model_gives_every_artifact(reference: tuple[dict[str, Artifact], Any, Any]) -> None:
    arts, _, _ = reference
    assert set(arts) == {"litert-fp32", "litert-int8", "litert-int8-edgetpu-src"}
    for art in arts.values():
        assert art.backend == "litert"
        assert art.notes["layout"] == "NHWC"
        assert art.path.is_file() and art.path.stat().st_mode & 0o044  # readable by others: it ships
    assert arts["litert-int8"].notes["io"].startswith("float32")
    assert arts["litert-int8"].notes["calibration_images"] == 36


@pytest.mark.slow
@pytest.mark.parametrize("key", ["litert-fp32", "litert-int8", "litert-int8-edgetpu-src"])
def test_reference_model_still_sees_the_cat_and_the_espresso(
    reference: tuple[dict[str, Artifact], np.ndarray, tuple[str, ...]], key: str
) -> None:
    arts, batch, names = reference
    chelsea, coffee = names.index("chelsea"), names.index("coffee")
    logits = _run(arts[key].path, batch[[chelsea, coffee]])
    assert 285 in np.argsort(-logits[0])[:3]  # Egyptian cat
    assert int(logits[1].argmax()) == 967  # espresso


@pytest.mark.slow
def test_reference_edgetpu_source_is_integer_end_to_end(
    reference: tuple[dict[str, Artifact], Any, Any],
) -> None:
    from edgekit.backends import open_session

    art = reference[0]["litert-int8-edgetpu-src"]
    with open_session(art.path, "litert") as session:
        (inp,), (out,) = session.inputs, session.outputs
    assert inp.shape == (1, 224, 224, 3)
    assert inp.dtype == "int8" and inp.quantization is not None
    assert out.dtype == "int8" and out.quantization is not None
    assert non_integer_ops(art.path) == []
    assert "edgetpu_compiler -s" in art.notes["edgetpu"]
