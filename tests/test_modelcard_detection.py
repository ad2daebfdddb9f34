"""Model cards with a task: the shipped BlazeFace cards, and each mistake in a [detection] table named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgekit.bundle.manifest import DetectionHead
from edgekit.convert.modelcard import ModelCard, read_card
from edgekit.errors import BuildError

MODELS = Path(__file__).parent.parent / "models"


def test_the_reference_classifier_stays_a_classifier() -> None:
    card = read_card(MODELS / "efficientnet-lite0")
    assert card.task == "classification"
    assert card.detection is None
    assert card.output_name == "logits"
    assert card.to_dict()["task"] == "classification"
    assert card.to_dict()["detection"] is None


def test_blazeface_cards_read_as_mediapipe_configures_them() -> None:
    short = read_card(MODELS / "blazeface")
    full = read_card(MODELS / "blazeface-full-range")
    for card in (short, full):
        assert card.task == "detection"
        assert card.labels == ("face",)
        assert card.preprocess.resize == "letterbox"
        assert card.preprocess.mean == (127.5, 127.5, 127.5)
        assert card.preprocess.std == (127.5, 127.5, 127.5)
        head = card.detection
        assert head is not None
        assert head.decoder == "ssd" and head.nms == "weighted" and head.sigmoid_scores
        assert head.outputs == card.output_names
        assert head.box_coder is not None and head.box_coder.reverse_output_order
        assert head.box_coder.num_keypoints == 6
        # The manifest carries exactly what the card says.
        assert DetectionHead.from_dict(card.to_dict()["detection"]) == head
    assert short.preprocess.size == (128, 128) and full.preprocess.size == (192, 192)
    assert short.detection is not None and full.detection is not None
    assert short.detection.score_threshold == 0.5 and full.detection.score_threshold == 0.6
    assert short.output_names == ("regressors", "classificators")
    assert short.detection.anchors is not None and full.detection.anchors is not None
    assert short.detection.anchors.strides == (8, 16, 16, 16)
    assert full.detection.anchors.interpolated_scale_aspect_ratio == 0.0


def _card(tmp_path: Path, text: str, task: str = "detection") -> ModelCard:
    """A copy of the BlazeFace card with ``text`` replacing its [detection] tables."""
    base = (MODELS / "blazeface" / "model.toml").read_text(encoding="utf-8")
    head, _, _ = base.partition("[detection]")
    assert 'task = "detection"\n' in head
    head = head.replace('task = "detection"\n', f"task = {task!r}\n".replace("'", '"'))
    (tmp_path / "labels").mkdir(exist_ok=True)
    shutil.copy(MODELS / "labels" / "face.txt", tmp_path / "labels" / "face.txt")
    (tmp_path / "m").mkdir(exist_ok=True)
    path = tmp_path / "m" / "model.toml"
    path.write_text(head + text, encoding="utf-8")
    return read_card(path)


GOOD = """
[detection]
decoder = "ssd"
num_classes = 1
score_threshold = 0.5
outputs = ["regressors", "classificators"]

[detection.anchors]
input_size = [128, 128]
num_layers = 2
strides = [8, 16]
min_scale = 0.1
max_scale = 0.75

[detection.box_coder]
x_scale = 128.0
y_scale = 128.0
w_scale = 128.0
h_scale = 128.0
"""


def test_a_minimal_detection_table_takes_the_defaults(tmp_path: Path) -> None:
    card = _card(tmp_path, GOOD)
    assert card.detection is not None
    assert card.detection.nms == "hard" and card.detection.max_detections == 100


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("num_layers = 2", "num_layers = 3"), "detection.anchors"),  # three layers, two strides
        (('decoder = "ssd"', 'decoder = "retina"'), "detection.decoder"),
        (("score_threshold = 0.5", "score_threshold = 1.5"), "detection.score_threshold"),
        (("x_scale = 128.0", 'x_scale = "128"'), "detection.box_coder.x_scale"),
        (("score_threshold = 0.5", "score_threshold = 0.5\nnms_kind = 1"), "detection.nms_kind"),
        (
            (
                "[detection.box_coder]\nx_scale = 128.0\ny_scale = 128.0\nw_scale = 128.0\nh_scale = 128.0\n",
                "",
            ),
            "detection",
        ),  # ssd without its box coder
        (
            ('outputs = ["regressors", "classificators"]', 'outputs = ["boxes", "scores"]'),
            "detection.outputs",
        ),
    ],
)
def test_a_bad_detection_table_names_the_field(tmp_path: Path, change: tuple[str, str], field: str) -> None:
    old, new = change
    assert old in GOOD
    with pytest.raises(BuildError, match=f"field '{field}' ") as err:
        _card(tmp_path, GOOD.replace(old, new))
    assert "model.toml" in err.value.message
    assert err.value.hint


def test_detection_without_a_table_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"needs a \[detection\] table"):
        _card(tmp_path, "")


def test_a_detection_table_on_a_classifier_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="classification card"):
        _card(tmp_path, GOOD, task="classification")


def test_an_unknown_task_is_named(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="field 'task'"):
        _card(tmp_path, GOOD, task="segmentation")
