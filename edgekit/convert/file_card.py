"""A model card inferred from what an ONNX file says about itself, each fact with where it came from.

An Ultralytics export carries its task, class names and image size in its metadata and its
head's layout in its output's shape; its preprocessing is Ultralytics' own (RGB, letterbox
padded with grey 114, pixels / 255).  That is a whole detection card: ``edgekit build --onnx
yolov8n.onnx`` needs no flags.  The card is a ``model.toml``-shaped dict, so a card of one's
own (``[source] kind = "onnx"``) can give only what the file cannot (attribution, license)
and ``--write-card`` can write it out to edit.

What the file does not say is asked for by name, never guessed silently: a file whose output
looks like a detector's head but has no ``task`` metadata stops the build rather than build a
classifier that answers nonsense.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.convert.file_facts import (
    FileFacts,
    TensorFacts,
    detector_like,
    flag,
    parse_imgsz,
    parse_names,
)
from edgekit.errors import BuildError

#: Ultralytics tasks edgekit does not decode yet (``detect`` it does).
UNSUPPORTED_TASKS = ("segment", "pose", "obb", "classify")
#: Ultralytics' defaults for predict(): conf 0.25, iou 0.7, max_det 300.
SCORE_THRESHOLD, IOU_THRESHOLD, MAX_DETECTIONS = 0.25, 0.7, 300
#: An end-to-end head (NMS in the graph) gives at most this many rows; a v5 head has thousands.
_END2END_MAX_ROWS = 1000
_MD = "ONNX metadata"
_ORDER = ("task", "labels", "detection.decoder", "detection.yolo_layout", "input.size", "input.layout")


@dataclass(frozen=True)
class Fact:
    """One thing inferred about the model: what, its value, where it came from, and the card key it fills."""

    what: str
    value: str
    origin: str
    key: str = ""

    def line(self) -> str:
        return f"{self.what} {self.value} ({self.origin})"

    def to_dict(self) -> dict[str, str]:
        return {"fact": self.what, "value": self.value, "from": self.origin, "card_key": self.key}


@dataclass
class Inferred:
    """A ``model.toml``-shaped card (tables as dicts) and the facts that filled it."""

    data: dict[str, Any]
    facts: list[Fact] = field(default_factory=list)

    def put(self, key: str, value: Any, what: str, shown: str, origin: str) -> None:
        """Set ``key`` (``"input.size"``: a table's key) and record the fact."""
        *tables, last = key.split(".")
        table = self.data
        for t in tables:
            table = table.setdefault(t, {})
        table[last] = value
        self.facts.append(Fact(what, shown, origin, key))


def _hw(inp: TensorFacts, layout: str) -> tuple[Any, Any]:
    return (inp.shape[2], inp.shape[3]) if layout == "NCHW" else (inp.shape[1], inp.shape[2])


def infer_input(
    facts: FileFacts,
    card: Inferred,
    *,
    input_size: tuple[int, int] | None = None,
    layout: str | None = None,
) -> None:
    """The input's name, layout and size (pinning free axes), and its dtype, into ``card``."""
    inp, md = facts.input, facts.metadata
    where = facts.path.name
    card.data.setdefault("input", {})["name"] = inp.name
    if len(inp.shape) != 4:
        return
    if layout is not None:
        card.put("input.layout", layout, "layout", layout, "--layout")
    elif inp.shape[1] == 3 or inp.shape[3] != 3:
        card.put("input.layout", "NCHW", "layout", "NCHW", f"input '{inp.name}' {inp.shape_text()}")
    else:
        card.put("input.layout", "NHWC", "layout", "NHWC", f"input '{inp.name}' {inp.shape_text()}")
    h, w = _hw(inp, card.data["input"]["layout"])
    if input_size is not None:
        size, origin = input_size, "--input-size"
    elif isinstance(h, int) and isinstance(w, int):
        size, origin = (h, w), f"input '{inp.name}' {inp.shape_text()}"
    elif "imgsz" in md:
        size = parse_imgsz(md["imgsz"], where)
        origin = f"{_MD} 'imgsz'; the file's height and width are free axes, pinned to it"
    else:
        size, origin = None, ""
    if size is not None:
        if not (isinstance(h, int) and isinstance(w, int)) and input_size is not None:
            origin += "; the file's height and width are free axes, pinned to it"
        card.put("input.size", [size[0], size[1]], "input size", f"{size[0]}x{size[1]}", origin)
    if not isinstance(inp.shape[0], int):
        card.facts.append(
            Fact("batch", "1", f"input '{inp.name}' has a free batch axis {inp.shape[0]!r}: pinned")
        )
    if inp.dtype == "float16":
        card.facts.append(
            Fact(
                "input",
                "float16",
                "widened to float32 when loaded: the fp32 reference every artifact is checked against",
            )
        )


def _layout(out: TensorFacts, nc: int, md: Mapping[str, str], where: str, nc_from: str) -> tuple[str, str]:
    """The yolo layout of ``out`` for ``nc`` classes and why, or a BuildError naming both class counts.

    The boxes' axis may be free (a dynamic export: ``[batch, 84, anchors]``); the class axis is not.
    """
    a, b = out.shape[1], out.shape[2]
    fa, fb = isinstance(a, int), isinstance(b, int)
    shape = out.shape_text()
    end2end = flag(md.get("end2end"), "end2end")
    nms = flag(md.get("args"), "nms")
    if b == 6 and (end2end or nms or (end2end is None and fa and a <= _END2END_MAX_ROWS)):  # type: ignore[operator]
        why = (
            f"{_MD} 'end2end'"
            if end2end
            else f"{_MD} 'args' nms=True"
            if nms
            else f"output '{out.name}' {shape}"
        )
        return "end2end", f"{why}: rows of x0, y0, x1, y1, score, class; NMS is in the graph"
    if a == 4 + nc and (not fb or b > a):  # type: ignore[operator]
        return "channels-first", f"output '{out.name}' {shape} = [1, 4 + {nc} classes, {b} boxes]"
    if b == 5 + nc and (not fa or a > b):  # type: ignore[operator]
        return "rows", f"output '{out.name}' {shape} = [1, {a} boxes, 5 + {nc} classes] (with objectness)"
    if fa and (not fb or a < b):  # type: ignore[operator]
        implied, form = int(a) - 4, "[1, 4 + classes, boxes]"  # type: ignore[arg-type]
    elif fb:
        implied, form = int(b) - 5, "[1, boxes, 5 + classes]"  # type: ignore[arg-type]
    else:
        raise BuildError(
            f"{where}: output '{out.name}' {shape} has no fixed class axis",
            "re-export the model with dynamic=False",
        )
    raise BuildError(
        f"{where}: {nc_from} gives {nc} classes, but output '{out.name}' {shape} has {implied} ({form})",
        "the file's class names and its graph disagree: pass --labels FILE with one name per class "
        "the graph has, or re-export the model",
    )


def infer_detector(facts: FileFacts, card: Inferred, labels: tuple[str, ...] | None) -> None:
    """An Ultralytics ``task = detect`` export's labels, preprocessing and ``[detection]`` table into ``card``."""
    md, where = facts.metadata, facts.path.name
    # An Ultralytics detect export has one output; its boxes' axis may be free (dynamic=True).
    heads = [o for o in facts.outputs if len(o.shape) == 3]
    if len(heads) != 1:
        shapes = ", ".join(f"'{o.name}' {o.shape_text()}" for o in facts.outputs)
        raise BuildError(
            f"{where}: {_MD} says task 'detect', but no single output looks like a YOLO head ({shapes})",
            "export with Ultralytics' model.export(format='onnx'), or write a card for it (see models/blazeface)",
        )
    out = heads[0]
    if labels is not None:
        names, nc_from = labels, "--labels"
    elif "names" in md:
        names, nc_from = parse_names(md["names"], where), f"{_MD} 'names'"
    else:
        raise BuildError(
            f"{where}: the class names are not in the file ({_MD} 'names' is missing)",
            "pass --labels FILE with one class name per line",
        )
    card.put(
        "labels",
        list(names),
        "labels",
        f"{len(names)} classes: {', '.join(names[:6])}" + (", …" if len(names) > 6 else ""),
        nc_from,
    )
    layout, why = _layout(out, len(names), md, where, nc_from)
    end2end = layout == "end2end"
    card.put("task", "detection", "task", "detect", f"{_MD} 'task'")
    card.put("detection.decoder", "yolo", "decoder", "yolo", f"{_MD} 'task' and output '{out.name}'")
    card.put("detection.yolo_layout", layout, "head layout", layout, why)
    detection = card.data["detection"]
    detection.update(
        num_classes=len(names),
        score_threshold=SCORE_THRESHOLD,
        iou_threshold=IOU_THRESHOLD,
        nms="none" if end2end else "hard",
        max_detections=MAX_DETECTIONS,
        outputs=[out.name],
    )
    card.facts.append(
        Fact(
            "thresholds",
            f"score {SCORE_THRESHOLD}, IoU {IOU_THRESHOLD}, NMS {'none' if end2end else 'hard'}",
            "Ultralytics' predict() defaults",
            "detection.score_threshold",
        )
    )


def ultralytics_preprocessing(card: Inferred, mean: Any, std: Any) -> None:
    """Ultralytics' LetterBox: RGB, aspect kept, bilinear resize, grey 114 bars, pixels / 255 (flags override mean/std).

    Bilinear (``interpolation = "linear"``), not edgekit's default area filter: the pixels the
    model was trained and validated on are LetterBox's, which shrinks with cv2.INTER_LINEAR.
    """
    origin = "Ultralytics' preprocessing"
    inp = card.data.setdefault("input", {})
    inp.update(color="RGB", resize="letterbox", letterbox_fill=114, interpolation="linear")
    card.facts.append(Fact("preprocessing", "RGB, bilinear letterbox with grey 114", origin, "input.resize"))
    m = [float(v) for v in mean] if mean is not None else [0.0, 0.0, 0.0]
    s = [float(v) for v in std] if std is not None else [255.0, 255.0, 255.0]
    shown = f"mean {m[0]:g}, std {s[0]:g}" if len(set(m)) == 1 and len(set(s)) == 1 else f"mean {m}, std {s}"
    inp.update(mean=m, std=s)
    card.facts.append(
        Fact(
            "normalization", shown, "--mean/--std" if mean is not None else origin + ": x / 255", "input.mean"
        )
    )


def infer(
    facts: FileFacts,
    *,
    input_size: tuple[int, int] | None = None,
    mean: Any = None,
    std: Any = None,
    layout: str | None = None,
    labels: tuple[str, ...] | None = None,
) -> Inferred:
    """Everything ``facts`` (and the flags) say, as a card; a whole detection card for an Ultralytics detector.

    Without ``task`` metadata only the input and outputs are filled in.  A task edgekit does
    not decode (segment, pose, obb, classify) is a BuildError naming it.
    """
    md, where = facts.metadata, facts.path.name
    card = Inferred({"output": {"names": [o.name for o in facts.outputs]}})
    infer_input(facts, card, input_size=input_size, layout=layout)
    task = md.get("task")
    if task is None:
        return card
    if task != "detect":
        known = task in UNSUPPORTED_TASKS
        raise BuildError(
            f"{where}: {_MD} says task '{task}': "
            + ("edgekit does not support it yet" if known else "not a task edgekit knows"),
            "edgekit builds Ultralytics detection models (task 'detect'); export a detect model, "
            "or write a card for this one",
        )
    if md.get("description"):
        card.data["description"] = md["description"]
    if md.get("license"):
        card.put("license", md["license"], "license", repr(md["license"][:60]), f"{_MD} 'license'")
    by = " ".join(f"{k} {md[k]}" for k in ("author", "version", "date") if k in md)
    if by:
        card.data["attribution"] = f"Exported from {by} ({_MD})."
    infer_detector(facts, card, labels)
    ultralytics_preprocessing(card, mean, std)
    # What the model is first, then how it is fed and decoded.
    card.facts.sort(key=lambda f: _ORDER.index(f.key) if f.key in _ORDER else len(_ORDER))
    return card


def check_not_a_detector(facts: FileFacts) -> None:
    """A file with no ``task`` metadata whose output looks like a detector's head: the missing field, named."""
    if "task" in facts.metadata:
        return
    for out in facts.outputs:
        if detector_like(out):
            raise BuildError(
                f"{facts.path.name}: output '{out.name}' {out.shape_text()} looks like a detector's head, "
                f"but the file does not say its task ({_MD} 'task' is missing)",
                f'a card with task = "detection" and a [detection] table gives it: '
                f"`edgekit build --onnx {facts.path.name} --device D --write-card DIR` writes one "
                "guessed from the shape, to check and build with --model DIR",
            )


def merged(inferred: Mapping[str, Any], card: Mapping[str, Any]) -> dict[str, Any]:
    """``card`` over ``inferred``: a table merges key by key, any other value of the card wins."""
    out = dict(inferred)
    for key, value in card.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def _given(card: Mapping[str, Any], key: str) -> bool:
    *tables, last = key.split(".")
    table: Any = card
    for t in tables:
        table = table.get(t, {})
        if not isinstance(table, Mapping):
            return False
    return last in table


def complete_from_package(path: Path, data: Mapping[str, Any]) -> tuple[dict[str, Any], list[Fact]]:
    """A ``[source] kind = "onnx"`` card's data completed from its file, and the facts it did not override."""
    from edgekit.convert.file_facts import read_facts
    from edgekit.convert.package_files import package_file

    file, _ = package_file(data["source"], str(path), "onnx")
    inferred = infer(read_facts(file))
    facts = [f for f in inferred.facts if not (f.key and _given(data, f.key))]
    return merged(inferred.data, data), facts


def guess_detector(facts: FileFacts) -> FileFacts | None:
    """For ``--write-card`` of a file without ``task`` metadata whose output looks like a YOLO head:
    the facts with ``task`` and placeholder ``names`` guessed from the output's shape (None if none looks so).

    The card written from them says which values are guesses; nothing is built from a guess.
    """
    from dataclasses import replace

    head = next((o for o in facts.outputs if detector_like(o)), None)
    if head is None or "task" in facts.metadata:
        return None
    a, b = head.shape[1], head.shape[2]
    assert isinstance(a, int) and isinstance(b, int)
    nc = a - 4 if a < b else 1 if b == 6 and a <= _END2END_MAX_ROWS else b - 5
    names = "{" + ", ".join(f"{i}: 'class{i}'" for i in range(max(nc, 1))) + "}"
    guessed = {"task": "detect", "names": names}
    return replace(facts, metadata={**facts.metadata, **guessed, "edgekit_guessed": "task names"})


def mark_guesses(inferred: Inferred) -> None:
    """Facts that rest on ``guess_detector``'s guess (all but the input's shape and the flags) say so."""
    for i, f in enumerate(inferred.facts):
        if not f.origin.startswith(("input '", "--", "output '")):
            origin = f"GUESSED (the file does not say; {f.origin}): check it"
            inferred.facts[i] = Fact(f.what, f.value, origin, f.key)
