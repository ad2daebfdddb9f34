"""What a ``.tflite`` file says about itself: its tensors, and its TFLite Model Metadata.

A ``.tflite`` made with the TFLite Support / MediaPipe metadata writers carries a
``TFLITE_METADATA`` buffer (a flatbuffer of ``metadata_schema.fbs``, identifier ``M001``):
the input's normalization (``(x - mean) / std`` in pixel units, what a card's ``mean`` and
``std`` are), its color space, descriptive names of the outputs, and associated files —
label files among them, packed in a zip archive appended to the model.  MediaPipe's own
models carry it (the palm detector: mean 0, std 255, one label ``palm``).

With it a card (``[source] kind = "tflite"``) or ``edgekit build --tflite FILE`` need not
restate what the file already says.  Only the fields edgekit uses are read, by hand with
``struct``: no dependency beyond the standard library, and every offset is checked
against the buffer and every list against a bound, so a damaged or hostile file is a
``BuildError``, never a long loop or a read elsewhere in memory.
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import BuildError

#: Associated file types (metadata_schema.fbs ``AssociatedFileType``).
FILE_TYPES = (
    "UNKNOWN",
    "DESCRIPTIONS",
    "TENSOR_AXIS_LABELS",
    "TENSOR_VALUE_LABELS",
    "TENSOR_AXIS_SCORE_CALIBRATION",
    "VOCABULARY",
    "SCANN_INDEX_FILE",
)
COLOR_SPACES = ("UNKNOWN", "RGB", "GRAYSCALE")  # ColorSpaceType
_IMAGE_PROPERTIES = 2  # ContentProperties union: FeatureProperties 1, ImageProperties 2, ...
_NORMALIZATION = 1  # ProcessUnitOptions union: NormalizationOptions 1, ...

# Bounds on what is read: far above any real model's, far below harm.
MAX_METADATA = 1 << 20  # bytes of the TFLITE_METADATA buffer
MAX_ITEMS = 256  # entries of any one list (tensors, files, process units, mean/std values)
MAX_PACKED = 64  # files in the appended zip
MAX_PACKED_FILE = 4 << 20  # bytes of one packed file, uncompressed
_HINT = "check the file was copied whole, or give the fields in the card / as flags"


class _Buffer:
    """Bounds-checked reads of a flatbuffer: every offset inside ``data``, every list bounded."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.what = data, what

    def bad(self, why: str) -> BuildError:
        return BuildError(f"{self.what}: {why}", _HINT)

    def check(self, off: int, size: int) -> None:
        if off < 0 or off + size > len(self.data):
            raise self.bad(f"an offset ({off}) points outside the {len(self.data)}-byte buffer")

    def unpack(self, fmt: str, off: int) -> Any:
        self.check(off, struct.calcsize(fmt))
        return struct.unpack_from(fmt, self.data, off)[0]

    def root(self) -> _Table:
        return _Table(self, self.unpack("<I", 0))


class _Table:
    """One flatbuffer table; fields by their slot (declaration order, a union taking two)."""

    def __init__(self, buf: _Buffer, pos: int) -> None:
        self.buf, self.pos = buf, pos
        self.vtable = pos - buf.unpack("<i", pos)
        self.vsize = buf.unpack("<H", self.vtable)

    def _at(self, slot: int) -> int:
        """The field's position in the buffer, or 0 when the table does not have it."""
        entry = 4 + 2 * slot
        if entry + 2 > self.vsize:
            return 0
        off = self.buf.unpack("<H", self.vtable + entry)
        return self.pos + off if off else 0

    def scalar(self, slot: int, fmt: str, default: Any) -> Any:
        at = self._at(slot)
        value: Any = self.buf.unpack(fmt, at) if at else default
        return value

    def _target(self, at: int) -> int:
        return at + int(self.buf.unpack("<I", at))

    def string(self, slot: int) -> str:
        at = self._at(slot)
        if not at:
            return ""
        start = self._target(at)
        n = self.buf.unpack("<I", start)
        if n > MAX_METADATA:
            raise self.buf.bad(f"a string of {n} bytes")
        self.buf.check(start + 4, n)
        return self.buf.data[start + 4 : start + 4 + n].decode("utf-8", errors="replace")

    def table(self, slot: int) -> _Table | None:
        at = self._at(slot)
        return _Table(self.buf, self._target(at)) if at else None

    def _vector(self, slot: int, width: int) -> tuple[int, int]:
        at = self._at(slot)
        if not at:
            return 0, 0
        start = self._target(at)
        n = self.buf.unpack("<I", start)
        if n > MAX_ITEMS and width > 1:
            raise self.buf.bad(f"a list of {n} entries (edgekit reads at most {MAX_ITEMS})")
        self.buf.check(start + 4, n * width)  # the whole vector lies inside the buffer
        return start + 4, n

    def table_at(self, slot: int, index: int) -> _Table:
        """Entry ``index`` of a list of tables of any length (a graph's tensors, a model's buffers)."""
        at = self._at(slot)
        n = self.buf.unpack("<I", self._target(at)) if at else 0
        if not 0 <= index < n:
            raise self.buf.bad(f"index {index} is outside a list of {n}")
        entry = self._target(at) + 4 + 4 * index
        return _Table(self.buf, self._target(entry))

    def tables(self, slot: int) -> list[_Table]:
        start, n = self._vector(slot, 4)
        return [_Table(self.buf, self._target(start + 4 * i)) for i in range(n)]

    def numbers(self, slot: int, fmt: str) -> tuple[Any, ...]:
        start, n = self._vector(slot, struct.calcsize(fmt))
        return struct.unpack_from(f"<{n}{fmt}", self.buf.data, start) if n else ()

    def raw(self, slot: int) -> bytes:
        start, n = self._vector(slot, 1)
        return self.buf.data[start : start + n]


@dataclass(frozen=True)
class AssociatedFile:
    """A file the metadata names (a label file: ``type = "TENSOR_AXIS_LABELS"``), packed in the model."""

    name: str
    type: str
    description: str = ""


@dataclass(frozen=True)
class TensorMetadata:
    """One input or output tensor as the metadata describes it (in the graph's tensor order)."""

    name: str
    description: str = ""
    #: ``"RGB"`` or ``"GRAYSCALE"`` for an image tensor; ``None`` when not said.
    color_space: str | None = None
    #: ``(x - mean) / std`` in the input's pixel units, one value per channel or one for all.
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    files: tuple[AssociatedFile, ...] = ()


@dataclass(frozen=True)
class TFLiteMetadata:
    """The fields of a model's ``TFLITE_METADATA`` edgekit reads, and the files packed with it."""

    name: str
    description: str
    version: str
    author: str
    license: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]
    files: tuple[AssociatedFile, ...] = ()
    #: The packed files the metadata names, by name (bytes, at most ``MAX_PACKED_FILE`` each).
    packed: Mapping[str, bytes] = field(default_factory=dict)

    def normalization(self) -> tuple[tuple[float, float, float], tuple[float, float, float]] | None:
        """The first input's mean and std per RGB channel; ``None`` when the file does not say."""
        if not self.inputs or not self.inputs[0].mean or not self.inputs[0].std:
            return None
        mean, std = self.inputs[0].mean, self.inputs[0].std
        if len(mean) not in (1, 3) or len(std) not in (1, 3) or not all(std):
            return None
        m, s = (mean * 3)[:3], (std * 3)[:3]
        return (m[0], m[1], m[2]), (s[0], s[1], s[2])

    def labels(self) -> tuple[str, ...]:
        """The class names: the first axis-label file of an output (then of the model); ``()`` if none."""
        candidates = [f for t in self.outputs for f in t.files] + list(self.files)
        for f in candidates:
            if f.type == "TENSOR_AXIS_LABELS" and f.name in self.packed:
                lines = self.packed[f.name].decode("utf-8", errors="replace").splitlines()
                while lines and not lines[-1].strip():
                    lines.pop()
                return tuple(line.strip() for line in lines)
        return ()


@dataclass(frozen=True)
class TFLiteFile:
    """What a ``.tflite`` file says about itself: its first subgraph's tensors and its metadata."""

    input_name: str
    input_shape: tuple[int, ...]
    output_names: tuple[str, ...]
    metadata: TFLiteMetadata | None


def _files(table: _Table, slot: int) -> tuple[AssociatedFile, ...]:
    out = []
    for f in table.tables(slot):
        kind = f.scalar(2, "<b", 0)
        out.append(
            AssociatedFile(
                f.string(0), FILE_TYPES[kind] if 0 <= kind < len(FILE_TYPES) else "UNKNOWN", f.string(1)
            )
        )
    return tuple(out)


def _tensor(t: _Table) -> TensorMetadata:
    color: str | None = None
    content = t.table(3)
    if content is not None and content.scalar(0, "<B", 0) == _IMAGE_PROPERTIES:
        image = content.table(1)
        space = image.scalar(0, "<b", 0) if image is not None else 0
        color = COLOR_SPACES[space] if 0 < space < len(COLOR_SPACES) else None
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    for unit in t.tables(4):
        options = unit.table(1)
        if unit.scalar(0, "<B", 0) == _NORMALIZATION and options is not None:
            mean, std = options.numbers(0, "f"), options.numbers(1, "f")
    return TensorMetadata(t.string(0), t.string(1), color, mean, std, _files(t, 6))


def parse_metadata(blob: bytes, what: str = "TFLITE_METADATA") -> TFLiteMetadata:
    """A ``TFLITE_METADATA`` buffer (``metadata_schema.fbs``), without the packed files."""
    if len(blob) > MAX_METADATA:
        raise BuildError(
            f"{what}: {len(blob)} bytes of metadata (edgekit reads at most {MAX_METADATA})", _HINT
        )
    if blob[4:8] != b"M001":
        raise BuildError(f"{what}: not TFLite model metadata (no M001 identifier)", _HINT)
    root = _Buffer(blob, what).root()
    inputs: tuple[TensorMetadata, ...] = ()
    outputs: tuple[TensorMetadata, ...] = ()
    files = _files(root, 6)
    subgraphs = root.tables(3)
    if subgraphs:
        inputs = tuple(_tensor(t) for t in subgraphs[0].tables(2))
        outputs = tuple(_tensor(t) for t in subgraphs[0].tables(3))
        files += _files(subgraphs[0], 4)
    return TFLiteMetadata(
        name=root.string(0),
        description=root.string(1),
        version=root.string(2),
        author=root.string(4),
        license=root.string(5),
        inputs=inputs,
        outputs=outputs,
        files=files,
    )


def _packed(data: bytes, names: set[str], what: str) -> dict[str, bytes]:
    """The named files of the zip archive appended to the model (``{}`` when it has none)."""
    if not names:
        return {}
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError):
        return {}
    found: dict[str, bytes] = {}
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_PACKED:
            raise BuildError(f"{what}: {len(infos)} packed files (edgekit reads at most {MAX_PACKED})", _HINT)
        for info in infos:
            if info.filename not in names:
                continue
            if info.file_size > MAX_PACKED_FILE:
                raise BuildError(f"{what}: packed file {info.filename} has {info.file_size} bytes", _HINT)
            try:
                with archive.open(info) as f:
                    content = f.read(MAX_PACKED_FILE + 1)  # the header's size is a claim, not a limit
            except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError) as err:
                raise BuildError(
                    f"{what}: packed file {info.filename} cannot be read ({err})", _HINT
                ) from err
            if len(content) > MAX_PACKED_FILE:
                raise BuildError(f"{what}: packed file {info.filename} is larger than it says", _HINT)
            found[info.filename] = content
    return found


def _buffer_bytes(model: _Table, index: int, data: bytes, name: str) -> bytes:
    """Buffer ``index`` of the model: inside the flatbuffer, or after it (``offset``/``size``, >2 GB models)."""
    buffer = model.table_at(4, index)
    offset, size = buffer.scalar(1, "<Q", 0), buffer.scalar(2, "<Q", 0)
    if offset > 1:
        if size > MAX_METADATA or offset + size > len(data):
            raise BuildError(f"{name}: metadata buffer at {offset} (+{size}) is not inside the file", _HINT)
        return data[offset : offset + size]
    return buffer.raw(0)


def read_tflite(data: bytes, name: str) -> TFLiteFile:
    """The tensors and metadata of a ``.tflite`` file's bytes (``name`` is how errors name it)."""
    if data[4:8] != b"TFL3":
        raise BuildError(
            f"{name} is not a .tflite flatbuffer (no TFL3 identifier)", "check the file was copied whole"
        )
    model = _Buffer(data, name).root()
    subgraphs = model.tables(2)
    if not subgraphs:
        raise BuildError(f"{name}: the .tflite has no subgraph", "check the file was copied whole")
    graph = subgraphs[0]
    inputs, outputs = graph.numbers(1, "i"), graph.numbers(2, "i")
    if not inputs:
        raise BuildError(f"{name}: the .tflite's graph has no input", "check the file was copied whole")
    first = graph.table_at(0, inputs[0])
    metadata = None
    for entry in model.tables(6):
        if entry.string(0) != "TFLITE_METADATA":
            continue
        blob = _buffer_bytes(model, entry.scalar(1, "<I", 0), data, name)
        meta = parse_metadata(blob, f"{name}: TFLITE_METADATA")
        wanted = {f.name for t in meta.inputs + meta.outputs for f in t.files} | {f.name for f in meta.files}
        metadata = TFLiteMetadata(**{**meta.__dict__, "packed": _packed(data, wanted, name)})
        break
    return TFLiteFile(
        input_name=first.string(3),
        input_shape=tuple(int(d) for d in first.numbers(0, "i")),
        output_names=tuple(graph.table_at(0, i).string(3) for i in outputs),
        metadata=metadata,
    )


def read_tflite_file(path: Path) -> TFLiteFile:
    """``read_tflite`` of a file on disk."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise BuildError(f"{path} cannot be read: {err.strerror}", "check the path") from err
    return read_tflite(data, path.name)


def file_defaults(
    path: Path,
    mean: tuple[float, float, float] | None,
    std: tuple[float, float, float] | None,
) -> tuple[tuple[float, float, float] | None, tuple[float, float, float] | None, tuple[str, ...]]:
    """``mean``, ``std`` (the file's normalization where not given) and the labels of a ``.tflite``.

    For ``edgekit build --tflite FILE``: given flags win; a file without metadata changes nothing.
    """
    meta = read_tflite_file(path).metadata
    if meta is None:
        return mean, std, ()
    norm = meta.normalization()
    if norm is not None and mean is None and std is None:
        mean, std = norm
    return mean, std, meta.labels()


def fill_card(card: Path, data: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A ``[source] kind = "tflite"`` card's TOML with what its file says where the card is silent, and the file's labels.

    Filled when absent: ``[input]`` ``name``, ``size`` (the file's NHWC input), ``mean`` and
    ``std`` (its metadata's normalization), ``color`` (RGB when the metadata says so);
    ``[output] names`` (the graph's outputs, in order).  The labels (the metadata's label
    file) are returned for a card without ``labels``.  What the card says always wins; the
    file is read (and its SHA-256 checked) only when something is missing.
    """
    from edgekit.convert.package_files import tflite_file

    inp = data.get("input", {})
    out = data.get("output", {})
    if not isinstance(inp, dict) or not isinstance(out, dict):
        return dict(data), ()  # read_card names the malformed table
    wanted = [k for k in ("name", "size", "mean", "std") if k not in inp]
    if not wanted and "names" in out and "labels" in data:
        return dict(data), ()
    file, raw = tflite_file(data.get("source", {}), str(card))
    told = read_tflite(raw, file.name)
    meta = told.metadata
    filled = dict(inp)
    filled.setdefault("name", told.input_name)
    shape = told.input_shape
    if "size" not in inp and len(shape) == 4 and shape[1] > 0 and shape[2] > 0:
        filled["size"] = [shape[1], shape[2]]
    norm = meta.normalization() if meta is not None else None
    if ("mean" not in inp or "std" not in inp) and norm is None:
        raise BuildError(
            f"{card}: [input] gives no mean and std, and {file.name} carries no normalization metadata",
            "give mean and std in [input], in pixel units: (x - mean) / std",
        )
    if norm is not None:
        filled.setdefault("mean", list(norm[0]))
        filled.setdefault("std", list(norm[1]))
    if meta is not None and meta.inputs and meta.inputs[0].color_space == "RGB":
        filled.setdefault("color", "RGB")
    result = {**data, "input": filled, "output": {"names": list(told.output_names), **out}}
    return result, (meta.labels() if meta is not None and "labels" not in data else ())
