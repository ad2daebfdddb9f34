"""TFLite Model Metadata read by hand, against real files and an independent reader.

The files are MediaPipe's own (the mediapipe wheel, installed --no-deps as data): several
carry ``TFLITE_METADATA`` with normalization, color space and packed label files.  The
reference reader is the flatbuffers code MediaPipe generates from ``metadata_schema.fbs``
(shipped in the same wheel, loaded by path so that mediapipe itself is not imported), and
LiteRT's interpreter for the graph's tensor names and shapes.
"""

from __future__ import annotations

import importlib.util
import io
import struct
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.convert.tflite_metadata import (
    MAX_ITEMS,
    MAX_PACKED_FILE,
    parse_metadata,
    read_tflite,
    read_tflite_file,
)
from edgekit.errors import BuildError

schema = pytest.importorskip("ai_edge_litert.schema_py_generated")
flatbuffers = pytest.importorskip("flatbuffers")
from ai_edge_litert.interpreter import Interpreter  # noqa: E402 - after the importorskip above

MODULES = "mediapipe/modules"
# Files with metadata (normalization, labels or none) and one without.
WITH_METADATA = (
    "palm_detection/palm_detection_full.tflite",
    "hand_landmark/hand_landmark_full.tflite",
    "selfie_segmentation/selfie_segmentation.tflite",
    "face_detection/face_detection_short_range.tflite",
    "face_landmark/face_landmark.tflite",
)
WITHOUT_METADATA = ("palm_detection/palm_detection_lite.tflite", "iris_landmark/iris_landmark.tflite")


def mediapipe_file(name: str) -> Path:
    try:
        dist = metadata.distribution("mediapipe")
    except metadata.PackageNotFoundError:
        pytest.skip('mediapipe is not installed (tools/setup.sh: pip install --no-deps "mediapipe==0.10.14")')
    return Path(str(dist.locate_file(f"{MODULES}/{name}")))


@pytest.fixture(scope="module")
def reference() -> Any:
    """MediaPipe's generated metadata schema, loaded from its file alone."""
    path = mediapipe_file("x").parents[1] / "tasks/metadata/metadata_schema_py_generated.py"
    spec = importlib.util.spec_from_file_location("mediapipe_metadata_schema", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def metadata_blob(data: bytes) -> bytes:
    model = schema.ModelT.InitFromPackedBuf(data, 0)
    (entry,) = [m for m in model.metadata if m.name == b"TFLITE_METADATA"]
    return bytes(np.asarray(model.buffers[entry.buffer].data, dtype=np.uint8))


def test_the_palm_detector_says_what_mediapipe_feeds_it() -> None:
    """Its metadata agrees with MediaPipe's PalmDetectionCpu graph: pixels / 255, RGB, one class "palm"."""
    told = read_tflite_file(mediapipe_file("palm_detection/palm_detection_full.tflite"))
    assert (told.input_name, told.input_shape) == ("input_1", (1, 192, 192, 3))
    assert told.output_names == ("Identity", "Identity_1")
    meta = told.metadata
    assert meta is not None
    assert meta.name == "Multi Hand Detection"
    assert meta.normalization() == ((0.0, 0.0, 0.0), (255.0, 255.0, 255.0))
    assert meta.inputs[0].color_space == "RGB"
    assert [o.name for o in meta.outputs] == ["palm detection", "scores"]
    assert [(f.name, f.type) for f in meta.outputs[1].files] == [("labels.txt", "TENSOR_AXIS_LABELS")]
    assert meta.labels() == ("palm",)


@pytest.mark.parametrize("name", WITH_METADATA + WITHOUT_METADATA)
def test_real_files_read_as_the_reference_readers_do(name: str, reference: Any) -> None:
    data = mediapipe_file(name).read_bytes()
    told = read_tflite(data, name)
    interp = Interpreter(model_content=data)
    (inp,) = interp.get_input_details()
    assert (told.input_name, told.input_shape) == (inp["name"], tuple(int(d) for d in inp["shape"]))
    assert told.output_names == tuple(o["name"] for o in interp.get_output_details())
    if name in WITHOUT_METADATA:
        assert told.metadata is None
        return
    meta = told.metadata
    assert meta is not None
    ref = reference.ModelMetadataT.InitFromPackedBuf(metadata_blob(data), 0)
    assert (meta.name, meta.description) == (ref.name.decode(), ref.description.decode())
    (sub,) = ref.subgraphMetadata
    ref_in = sub.inputTensorMetadata[0]
    (unit,) = [
        u for u in ref_in.processUnits if u.optionsType == reference.ProcessUnitOptions.NormalizationOptions
    ]
    assert meta.inputs[0].mean == pytest.approx(list(unit.options.mean))
    assert meta.inputs[0].std == pytest.approx(list(unit.options.std))
    assert meta.inputs[0].color_space == ("RGB" if ref_in.content.contentProperties.colorSpace == 1 else None)
    assert [o.name for o in meta.outputs] == [o.name.decode() for o in sub.outputTensorMetadata]
    ref_files = [
        (f.name.decode(), f.type) for o in sub.outputTensorMetadata for f in (o.associatedFiles or [])
    ]
    assert [(f.name, f.type) for o in meta.outputs for f in o.files] == [
        (n, ("UNKNOWN", "DESCRIPTIONS", "TENSOR_AXIS_LABELS")[t]) for n, t in ref_files
    ]
    # The packed files are the zip appended to the model, read whole.
    packed = {n: zipfile.ZipFile(io.BytesIO(data)).read(n) for n, _ in ref_files}
    assert dict(meta.packed) == packed
    if packed:
        assert meta.labels() == tuple(next(iter(packed.values())).decode().split())


def test_damaged_metadata_is_a_build_error_never_another_exception() -> None:
    """Bytes flipped anywhere in the metadata: it reads, or it is a BuildError naming the file."""
    blob = metadata_blob(mediapipe_file("hand_landmark/hand_landmark_full.tflite").read_bytes())
    rng = np.random.default_rng(7)
    errors = 0
    for _ in range(400):
        damaged = bytearray(blob)
        for at in rng.integers(8, len(blob), size=3):
            damaged[at] = int(rng.integers(0, 256))
        try:
            parse_metadata(bytes(damaged), "hand.tflite")
        except BuildError as err:
            assert "hand.tflite" in str(err)
            errors += 1
    assert errors > 0  # the damage was noticed, not always read past
    for cut in (0, 8, 40, len(blob) // 2):
        with pytest.raises(BuildError):
            parse_metadata(blob[:cut], "cut.tflite")


def _metadata(reference: Any, *, mean: list[float], std: list[float], count: int = 1) -> bytes:
    """A ModelMetadata written with MediaPipe's schema: a grey image input, labels on the model."""
    norm = reference.NormalizationOptionsT()
    norm.mean, norm.std = mean, std
    unit = reference.ProcessUnitT()
    unit.optionsType, unit.options = reference.ProcessUnitOptions.NormalizationOptions, norm
    image = reference.ImagePropertiesT()
    image.colorSpace = reference.ColorSpaceType.GRAYSCALE
    content = reference.ContentT()
    content.contentPropertiesType, content.contentProperties = (
        reference.ContentProperties.ImageProperties,
        image,
    )
    tensor = reference.TensorMetadataT()
    tensor.name, tensor.content, tensor.processUnits = b"image", content, [unit] * count
    labels = reference.AssociatedFileT()
    labels.name, labels.type = b"classes.txt", reference.AssociatedFileType.TENSOR_AXIS_LABELS
    sub = reference.SubGraphMetadataT()
    sub.inputTensorMetadata = [tensor]
    sub.outputTensorMetadata = [reference.TensorMetadataT()]
    model = reference.ModelMetadataT()
    model.name, model.license, model.subgraphMetadata, model.associatedFiles = b"m", b"MIT", [sub], [labels]
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"M001")
    return bytes(builder.Output())


def with_metadata(model: bytes, blob: bytes, packed: dict[str, bytes]) -> bytes:
    """``model`` with ``blob`` as its TFLITE_METADATA and ``packed`` zipped after it (as the writers do)."""
    m = schema.ModelT.InitFromPackedBuf(model, 0)
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(blob, dtype=np.uint8)
    m.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name, entry.buffer = b"TFLITE_METADATA", len(m.buffers) - 1
    m.metadata = [*(m.metadata or []), entry]
    builder = flatbuffers.Builder(len(model) + len(blob) + 1024)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content in packed.items():
            z.writestr(name, content)
    return bytes(builder.Output()) + archive.getvalue()


def test_written_metadata_reads_back(reference: Any) -> None:
    """Three-channel normalization, a grey input, labels named at the model level."""
    lite = mediapipe_file("palm_detection/palm_detection_lite.tflite").read_bytes()
    blob = _metadata(reference, mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])
    data = with_metadata(lite, blob, {"classes.txt": b"cat\ndog\n\n", "other.bin": b"\0" * 10})
    meta = read_tflite(data, "written.tflite").metadata
    assert meta is not None and meta.license == "MIT"
    mean, std = meta.normalization() or ((), ())
    assert mean == pytest.approx((123.675, 116.28, 103.53)) and std == pytest.approx((58.395, 57.12, 57.375))
    assert meta.inputs[0].color_space == "GRAYSCALE"
    assert meta.labels() == ("cat", "dog")
    assert set(meta.packed) == {"classes.txt"}  # only the files the metadata names are read
    # Still the model LiteRT runs: the metadata and the zip do not disturb it.
    Interpreter(model_content=data).allocate_tensors()


def test_bounds_on_lists_and_packed_files(reference: Any) -> None:
    lite = mediapipe_file("palm_detection/palm_detection_lite.tflite").read_bytes()
    many = _metadata(reference, mean=[0.0], std=[1.0], count=MAX_ITEMS + 1)
    with pytest.raises(BuildError, match="at most"):
        read_tflite(with_metadata(lite, many, {}), "many.tflite")
    blob = _metadata(reference, mean=[0.0], std=[1.0])
    big = with_metadata(lite, blob, {"classes.txt": b"x" * (MAX_PACKED_FILE + 1)})
    with pytest.raises(BuildError, match=r"classes\.txt"):
        read_tflite(big, "big.tflite")
    # A header that understates the size: the CRC check fails, an error rather than a cut label list.
    honest = with_metadata(lite, blob, {"classes.txt": b"a\nb\n"})
    end = honest.rindex(b"PK\x01\x02")  # the central directory entry: sizes at +20 (compressed), +24
    lying = honest[: end + 24] + struct.pack("<I", 1) + honest[end + 28 :]
    with pytest.raises(BuildError, match=r"classes\.txt"):
        read_tflite(lying, "lying.tflite")


def test_not_a_tflite_is_a_build_error() -> None:
    with pytest.raises(BuildError, match="TFL3"):
        read_tflite(b"\0" * 64, "junk.tflite")
    data = mediapipe_file("palm_detection/palm_detection_full.tflite").read_bytes()
    with pytest.raises(BuildError, match=r"cut\.tflite"):
        read_tflite(data[:4096], "cut.tflite")
