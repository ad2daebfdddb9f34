"""benchmarks.labelled_sets: the typeset document pages read as a valid COCO set, boxes on the page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.labelled_sets import documents
from edgekit.convert.coco_data import class_ids, load_coco


def test_documents_make_a_coco_set_with_every_box_inside_its_page(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("skimage")
    coco = documents.make(tmp_path, pages=4, seed=3)
    again = documents.make(tmp_path / "again", pages=4, seed=3)
    assert json.dumps(coco) == json.dumps(again)  # the same seed typesets the same pages
    loaded = load_coco(tmp_path / "annotations.json", tmp_path / "images")
    assert len(loaded.images) == 4 and loaded.boxes == len(coco["annotations"]) > 20
    for a in coco["annotations"]:
        x, y, w, h = a["bbox"]
        assert w > 0 and h > 0 and x >= 0 and y >= 0
        assert x + w <= documents.PAGE_W and y + h <= documents.PAGE_H
    # The DocLayNet detector's labels map to the set's categories one to one, by name.
    mapping = class_ids(documents.CLASSES, loaded)
    assert sorted(mapping) == list(range(11)) and len(set(mapping.values())) == 11
