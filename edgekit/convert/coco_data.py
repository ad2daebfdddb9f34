"""A user's labelled images as COCO-format JSON: read, bounded, validated, and tied to a model's classes.

``load_coco(annotations, images)`` reads the JSON (at most ``MAX_ANNOTATION_BYTES``), checks
what mAP needs of it (unique ids, every annotation on a listed image and category, boxes
of four finite numbers with no negative side, every image file present under ``images``)
and keeps only those fields, so a file with COCO's extra sections (``info``, ``licenses``,
``segmentation``) reads as well.  ``class_ids`` maps a model's class ids to the file's
category ids by name (case and surrounding spaces ignored), or as ``--class-map`` says.
Every mistake is an :class:`EdgekitError` naming the file, the entry and what to do.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError

#: COCO's own val2017 instances file is 25 MB; a file this big is a mistake, or memory to run out of
#: (Python holds a parsed JSON file in about ten times its size).
MAX_ANNOTATION_BYTES = 256 * 2**20
_HINT = "see https://cocodataset.org/#format-data (images, annotations with bbox [x, y, width, height], categories)"


@dataclass(frozen=True)
class CocoImage:
    id: int
    file_name: str
    path: Path
    width: int | None
    height: int | None


@dataclass(frozen=True)
class CocoSet:
    """A validated COCO detection set: its images, categories, and the dataset pycocotools reads."""

    annotations: Path
    images: tuple[CocoImage, ...]
    categories: Mapping[int, str]
    #: The ground truth as pycocotools' ``COCO.dataset`` (images, annotations with area and iscrowd, categories).
    dataset: Mapping[str, Any]

    @property
    def boxes(self) -> int:
        return len(self.dataset["annotations"])

    def used_categories(self) -> set[int]:
        """Category ids with at least one annotation."""
        return {int(a["category_id"]) for a in self.dataset["annotations"]}


def _fail(where: Path, what: str, hint: str = _HINT) -> EdgekitError:
    return EdgekitError(f"{where}: {what}", hint)


def _int(value: Any, where: Path, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, f"{what} must be a whole number, got {value!r}")
    return value


def _list(data: Mapping[str, Any], key: str, where: Path) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list):
        raise _fail(where, f"'{key}' must be a list, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise _fail(where, f"{key}[{i}] must be an object, got {type(item).__name__}")
    return value


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise EdgekitError(f"annotation file {path} does not exist", "pass a COCO-format .json file")
    size = path.stat().st_size
    if size > MAX_ANNOTATION_BYTES:
        raise _fail(
            path,
            f"{size / 2**20:.0f} MiB is over the {MAX_ANNOTATION_BYTES // 2**20} MiB limit",
            "evaluate a subset of the images (a few thousand give a stable mAP)",
        )
    try:
        data = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _fail(path, f"not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise _fail(path, f"the top level must be an object, got {type(data).__name__}")
    return data


def load_coco(annotations: Path, images: Path) -> CocoSet:
    """Read and check ``annotations`` (COCO JSON) against the image folder ``images``."""
    data = _read_json(annotations)
    if not images.is_dir():
        raise EdgekitError(
            f"image folder {images} does not exist", "pass the folder the file_name entries are relative to"
        )
    categories: dict[int, str] = {}
    for i, c in enumerate(_list(data, "categories", annotations)):
        cid = _int(c.get("id"), annotations, f"categories[{i}].id")
        name = c.get("name")
        if not isinstance(name, str) or not name.strip():
            raise _fail(annotations, f"categories[{i}].name must be a non-empty string, got {name!r}")
        if cid in categories:
            raise _fail(annotations, f"category id {cid} appears twice")
        categories[cid] = name
    root = images.resolve()
    imgs: dict[int, CocoImage] = {}
    for i, im in enumerate(_list(data, "images", annotations)):
        iid = _int(im.get("id"), annotations, f"images[{i}].id")
        name = im.get("file_name")
        if not isinstance(name, str) or not name:
            raise _fail(annotations, f"images[{i}].file_name must be a non-empty string, got {name!r}")
        path = (images / name).resolve()
        if not path.is_relative_to(root):
            raise _fail(annotations, f"images[{i}].file_name {name!r} points outside {images}")
        if not path.is_file():
            raise EdgekitError(
                f"image {name} (id {iid}) of {annotations} is not in {images}",
                "pass --images the folder the file_name entries are relative to, or drop the entry",
            )
        if iid in imgs:
            raise _fail(annotations, f"image id {iid} appears twice")
        dims = [im.get(k) for k in ("width", "height")]
        w, h = (
            (
                _int(dims[0], annotations, f"images[{i}].width"),
                _int(dims[1], annotations, f"images[{i}].height"),
            )
            if dims[0] is not None or dims[1] is not None
            else (None, None)
        )
        imgs[iid] = CocoImage(iid, name, path, w, h)
    if not imgs:
        raise _fail(annotations, "it lists no images")
    anns: list[dict[str, Any]] = []
    seen: set[int] = set()
    for i, a in enumerate(_list(data, "annotations", annotations)):
        aid = _int(a.get("id"), annotations, f"annotations[{i}].id")
        if aid in seen:
            raise _fail(annotations, f"annotation id {aid} appears twice")
        seen.add(aid)
        iid = _int(a.get("image_id"), annotations, f"annotations[{i}].image_id")
        cid = _int(a.get("category_id"), annotations, f"annotations[{i}].category_id")
        if iid not in imgs:
            raise _fail(annotations, f"annotations[{i}] is on image id {iid}, which 'images' does not list")
        if cid not in categories:
            raise _fail(
                annotations, f"annotations[{i}] has category id {cid}, which 'categories' does not list"
            )
        box = a.get("bbox")
        if (
            not isinstance(box, list)
            or len(box) != 4
            or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in box
            )
            or box[2] < 0
            or box[3] < 0
        ):
            raise _fail(
                annotations,
                f"annotations[{i}].bbox must be [x, y, width, height] (width, height >= 0), got {box!r}",
            )
        crowd = a.get("iscrowd", 0)
        if crowd not in (0, 1):
            raise _fail(annotations, f"annotations[{i}].iscrowd must be 0 or 1, got {crowd!r}")
        area = a.get("area", box[2] * box[3])
        if isinstance(area, bool) or not isinstance(area, int | float) or not math.isfinite(area) or area < 0:
            raise _fail(annotations, f"annotations[{i}].area must be a number >= 0, got {area!r}")
        anns.append(
            {
                "id": aid,
                "image_id": iid,
                "category_id": cid,
                "bbox": [float(v) for v in box],
                "area": float(area),
                "iscrowd": int(crowd),
            }
        )
    if not anns:
        raise _fail(annotations, "it has no annotations: there is nothing to measure against")
    dataset = {
        "images": [
            {
                "id": m.id,
                "file_name": m.file_name,
                **({"width": m.width, "height": m.height} if m.width else {}),
            }
            for m in imgs.values()
        ],
        "annotations": anns,
        "categories": [{"id": k, "name": v} for k, v in categories.items()],
    }
    return CocoSet(annotations, tuple(imgs.values()), categories, dataset)


def _norm(name: str) -> str:
    return name.strip().casefold()


def _parse_class_map(text: str, labels: Sequence[str], categories: Mapping[int, str]) -> dict[int, int]:
    """``"model=category,..."``: each side a name or a number (class index, category id)."""
    by_label = {_norm(n): i for i, n in enumerate(labels)}
    by_cat = {_norm(n): i for i, n in categories.items()}
    out: dict[int, int] = {}
    for pair in (p.strip() for p in text.split(",") if p.strip()):
        left, eq, right = pair.partition("=")
        if not eq:
            raise EdgekitError(
                f"--class-map entry {pair!r} is not MODEL_CLASS=CATEGORY",
                'for example --class-map "Fall=person"',
            )
        left, right = left.strip(), right.strip()
        cls = by_label.get(_norm(left), int(left) if left.isdigit() and int(left) < len(labels) else None)
        cat = by_cat.get(_norm(right), int(right) if right.isdigit() and int(right) in categories else None)
        if cls is None:
            raise EdgekitError(
                f"--class-map names model class {left!r}, which the model does not have",
                f"the model's classes: {', '.join(labels)}",
            )
        if cat is None:
            raise EdgekitError(
                f"--class-map names category {right!r}, which the annotations do not have",
                f"their categories: {', '.join(categories.values())}",
            )
        out[cls] = cat
    return out


def class_ids(labels: Sequence[str], coco: CocoSet, class_map: str | None = None) -> dict[int, int]:
    """Model class id -> category id: ``class_map``'s pairs, then equal names for the rest.

    A category that has annotations but no model class is an error (it would count as
    missed objects, not as the model's accuracy); a model class with no category is left out
    of the evaluation (its detections are dropped), as is an empty category.
    """
    out = _parse_class_map(class_map, labels, coco.categories) if class_map else {}
    by_cat = {_norm(n): i for i, n in coco.categories.items()}
    for i, name in enumerate(labels):
        if i not in out and _norm(name) in by_cat:
            out[i] = by_cat[_norm(name)]
    unmatched = sorted(coco.used_categories() - set(out.values()))
    if unmatched:
        names = ", ".join(repr(coco.categories[c]) for c in unmatched)
        raise EdgekitError(
            f"the model has no class for categor{'y' if len(unmatched) == 1 else 'ies'} {names} of {coco.annotations} "
            f"(its classes: {', '.join(labels) or 'none'})",
            'map them with --class-map "MODEL_CLASS=CATEGORY,...", or leave those annotations out',
        )
    return out
