"""A card's ``precisions``: what a default build makes, for a model that loses its accuracy in one.

MediaPipe's palm detector is such a model: every int8 recipe failed its detection gate (the card
says what was measured), so its card names fp32, fp16 and bf16, and ``edgekit build --model
models/palm-detection --device D`` builds and passes without flags.  Here the mechanism is shown
on the squares detector of ``tests/yolo_model.py``: its card keeps fp32 only, a default build
makes no int8 and says why, and ``--precisions`` still builds int8.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_build_user_detector import SIZE, write_frames
from yolo_model import write_card, write_yolo_onnx

from edgekit.bundle import read_manifest
from edgekit.convert.build_records import BuildRequest
from edgekit.convert.builder import build
from edgekit.convert.modelcard import read_card
from edgekit.convert.recipes import plan_recipes
from edgekit.device.profiles import get_profile
from edgekit.errors import BuildError

MODELS = Path(__file__).parent.parent / "models"


def _squares_card(folder: Path, precisions: str | None) -> Path:
    """The squares detector and its card, with ``precisions = <precisions>`` when given."""
    write_yolo_onnx(folder / "squares.onnx", SIZE, "rows")
    write_card(folder, "squares.onnx", layout="rows", size=SIZE)
    if precisions is not None:
        card = folder / "model.toml"
        card.write_text(f"precisions = {precisions}\n" + card.read_text())
    return folder


def test_the_palm_card_leaves_int8_out_on_every_device_it_is_built_for() -> None:
    card = read_card(MODELS / "palm-detection")
    assert card.precisions == ("fp32", "fp16", "bf16")
    for device in ("x86_64-cpu", "rpi5", "jetson-orin-nano"):
        planned = plan_recipes(get_profile(device), (), card.precisions)
        assert planned and not any("int8" in r for r in planned), (device, planned)


def test_a_card_without_precisions_builds_every_precision(tmp_path: Path) -> None:
    assert read_card(_squares_card(tmp_path / "m", None)).precisions == ()


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ('["fp32", "int4"]', "names int4"),
        ('["fp32", "fp16", "fp16"]', "repeats a precision"),
        ('["fp16"]', "leaves out fp32"),
        ('"fp32"', "must be a list"),
        ("[]", "must be a list"),
    ],
)
def test_a_bad_precisions_field_is_named(tmp_path: Path, value: str, why: str) -> None:
    with pytest.raises(BuildError) as err:
        read_card(_squares_card(tmp_path / "m", value))
    assert "field 'precisions'" in err.value.message and why in err.value.message
    assert err.value.hint and "fp32" in err.value.hint


def test_a_default_build_makes_the_card_s_precisions_and_says_what_it_left_out(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    folder = _squares_card(tmp_path / "squares", '["fp32"]')
    frames = write_frames(tmp_path / "frames", 8, seed=1)

    def request(out: str, precisions: tuple[str, ...] = ()) -> BuildRequest:
        return BuildRequest(
            card=read_card(folder),
            device="x86_64-cpu",
            out=tmp_path / out,
            backends=("onnxruntime",),
            precisions=precisions,
            calibration=frames,
            eval=frames,
            sign_key=keys[0],
            measure_latency=False,
        )

    result = build(request("default"))
    built = {r.recipe for r in result.reports if r.artifact is not None}
    skipped = {r.recipe: r.skipped for r in result.reports if r.artifact is None}
    assert built == {"onnxruntime-fp32"}
    assert set(skipped) == {"onnxruntime-int8", "onnxruntime-int8-full"}
    assert all(
        "card's precisions leave int8 out" in why and "--precisions" in why for why in skipped.values()
    )
    assert {a.name for a in read_manifest(tmp_path / "default").artifacts} == {"onnxruntime-fp32"}

    # Naming int8 on the command line builds it: the card sets the default, not a limit.
    result = build(request("asked", ("fp32", "int8")))
    assert {r.recipe for r in result.reports if r.artifact is not None} == {
        "onnxruntime-fp32",
        "onnxruntime-int8",
        "onnxruntime-int8-full",
    }
