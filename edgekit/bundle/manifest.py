"""The bundle manifest: what a bundle holds, as a validated, versioned, frozen schema.

``manifest.json`` is the one file a device reads first.  Every model is ``extra="forbid"``
and strict, so a typo or a wrong type in a hand-edited or forged manifest is an error that
names the field instead of being silently ignored or coerced.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from edgekit.bundle.errors import BundleError

SCHEMA_VERSION: Literal[1] = 1
MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.sig"
ARTIFACTS_DIR = "artifacts"
EVAL_DIR = "eval"
MAX_EVAL_FRAMES = 64

_SHA256 = r"^[0-9a-f]{64}$"
_KEY_ID = r"^[0-9a-f]{16}$"


def _check_under(path: str, top: str) -> str:
    parts = path.split("/")
    if (
        not path
        or "\\" in path
        or "\x00" in path
        or path.startswith("/")
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise ValueError(f"{path!r} is not a plain relative path (no '..', '.', '//', '\\' or leading '/')")
    if len(parts) < 2 or parts[0] != top:
        raise ValueError(f"{path!r} is not under {top}/")
    return path


def check_relpath(path: str) -> str:
    """``path`` if it is a plain relative POSIX path under ``artifacts/``; else ``ValueError``.

    A manifest names files a device will open, so a name that could leave the bundle
    (``..``, absolute, a backslash that Windows reads as a separator) is refused outright.
    """
    return _check_under(path, ARTIFACTS_DIR)


def check_eval_path(path: str) -> str:
    """``path`` if it is a plain relative POSIX path under ``eval/``; else ``ValueError``."""
    return _check_under(path, EVAL_DIR)


RelPath = Annotated[str, AfterValidator(check_relpath)]
EvalPath = Annotated[str, AfterValidator(check_eval_path)]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelInfo(_Schema):
    """Which model this is, where it came from, and the fp32 model every artifact derives from."""

    name: str = Field(min_length=1)
    version: str
    description: str = ""
    license: str = ""
    attribution: str = ""
    source: dict[str, Any] = Field(default_factory=dict)
    source_sha256: str = Field(pattern=_SHA256, description="SHA-256 of the fp32 source model (ONNX)")
    input: str = ""
    output: str = ""
    #: What the model says about a frame: one label ("classification") or boxes ("detection",
    #: decoded as the manifest's ``detection`` section says).  Not written for classification,
    #: so a classifier's manifest reads and hashes as it did before detection existed.
    task: Literal["classification", "detection"] = Field(
        default="classification", exclude_if=lambda v: v == "classification"
    )


class Preprocess(_Schema):
    """How a frame becomes the model input; the same fields as ``PreprocessSpec.to_dict()``."""

    size: tuple[int, int]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    color: Literal["RGB", "BGR"] = "RGB"
    resize: Literal["squash", "center-crop", "letterbox"] = "center-crop"
    # How a shrinking resize filters (edgekit.runtime.preprocessing.INTERPOLATIONS).  Not written when
    # "area", so a bundle that does not use it reads the same to devices that predate it.
    interpolation: Literal["area", "box2-linear"] = Field(default="area", exclude_if=lambda v: v == "area")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Preprocess:
        """The manifest form of a spec's ``to_dict()`` (JSON's types: lists, not tuples)."""
        return cls.model_validate_json(json.dumps(data))


class SsdAnchors(_Schema):
    """SSD anchors as MediaPipe's ``SsdAnchorsCalculator`` generates them (BlazeFace, MobileNet-SSD).

    Field names follow MediaPipe's ``SsdAnchorsCalculatorOptions``; sizes are fractions of
    the model input, centres in [0, 1].
    """

    input_size: tuple[int, int] = Field(description="(height, width) of the model input the anchors tile")
    num_layers: int = Field(ge=1, le=16)
    strides: tuple[int, ...] = Field(min_length=1, max_length=16)
    min_scale: float = Field(gt=0, le=4)
    max_scale: float = Field(gt=0, le=4)
    aspect_ratios: tuple[float, ...] = Field(default=(1.0,), min_length=1, max_length=16)
    anchor_offset: tuple[float, float] = (0.5, 0.5)
    reduce_boxes_in_lowest_layer: bool = False
    interpolated_scale_aspect_ratio: float = Field(default=1.0, ge=0, le=16)
    fixed_anchor_size: bool = False

    @model_validator(mode="after")
    def _one_stride_per_layer(self) -> SsdAnchors:
        if len(self.strides) != self.num_layers:
            raise ValueError(f"strides has {len(self.strides)} entries for {self.num_layers} layers")
        return self


class BoxCoder(_Schema):
    """How raw SSD box outputs decode against their anchors (MediaPipe's ``TensorsToDetectionsCalculator``).

    Each raw row is ``[dy, dx, dh, dw]`` (``reverse_output_order``: ``[dx, dy, dw, dh]``, as
    BlazeFace) followed by ``num_keypoints`` pairs; centres are ``anchor + d / scale *
    anchor_size``, sizes ``d / scale * anchor_size`` (``apply_exponential``: ``exp(d / scale)``).
    """

    x_scale: float = Field(gt=0)
    y_scale: float = Field(gt=0)
    w_scale: float = Field(gt=0)
    h_scale: float = Field(gt=0)
    num_keypoints: int = Field(default=0, ge=0, le=64)
    reverse_output_order: bool = False
    apply_exponential: bool = False


class DetectionHead(_Schema):
    """How a detector's raw outputs become detections: the decoder, as data.

    ``decoder``:
    - ``ssd``: a box tensor ``[1, N, 4 + 2k]`` and a score tensor ``[1, N, classes]`` decoded
      against ``anchors`` with ``box_coder``;
    - ``yolo``: one tensor, ``[1, 4 + classes, N]`` (``yolo_layout = "channels-first"``, the
      common Ultralytics export) or ``[1, N, 5 + classes]`` (``"rows"``: box, objectness,
      classes), boxes as centre x, centre y, width, height in input pixels;
    - ``tflite-postprocess``: the model ends in TFLite's ``TFLite_Detection_PostProcess`` (boxes
      ``[ymin, xmin, ymax, xmax]`` in [0, 1], classes, scores, count): passed through.

    Scores below ``score_threshold`` are dropped, then non-maximum suppression (``hard``, or
    MediaPipe's ``weighted`` blending of overlapping boxes) at ``iou_threshold``, keeping at
    most ``max_detections``.
    """

    decoder: Literal["ssd", "yolo", "tflite-postprocess"]
    num_classes: int = Field(ge=1, le=100_000)
    score_threshold: float = Field(ge=0, le=1)
    iou_threshold: float = Field(default=0.5, ge=0, le=1)
    nms: Literal["hard", "weighted", "none"] = "hard"
    max_detections: int = Field(default=100, ge=1, le=10_000)
    #: Scores are logits that need a sigmoid (MediaPipe's ``sigmoid_score``); ``score_clipping``
    #: clips the logits first (MediaPipe's ``score_clipping_thresh``).
    sigmoid_scores: bool = False
    score_clipping: float | None = Field(default=None, gt=0)
    #: Output names in decoding order (ssd: boxes, scores); empty: told apart by shape.
    outputs: tuple[str, ...] = Field(default=(), max_length=8)
    anchors: SsdAnchors | None = None
    box_coder: BoxCoder | None = None
    yolo_layout: Literal["channels-first", "rows"] | None = None

    @model_validator(mode="after")
    def _decoder_has_its_parameters(self) -> DetectionHead:
        if self.decoder == "ssd" and (self.anchors is None or self.box_coder is None):
            raise ValueError("an ssd decoder needs anchors and box_coder")
        if self.decoder == "yolo" and self.yolo_layout is None:
            raise ValueError("a yolo decoder needs yolo_layout ('channels-first' or 'rows')")
        return self

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DetectionHead:
        """From a model card's ``[detection]`` table or a manifest (JSON's types: lists, not tuples)."""
        return cls.model_validate_json(json.dumps(data))


class DeviceInfo(_Schema):
    """The device profile the bundle was built for."""

    profile: str = Field(min_length=1)
    arch: str
    budget_ms: float = Field(gt=0)


class FileEntry(_Schema):
    """One file of the bundle: where it is, its SHA-256 and its size in bytes."""

    path: RelPath
    sha256: str = Field(pattern=_SHA256)
    size: int = Field(ge=0)


class Latency(_Schema):
    """Latency measured on the build host (not the device), in milliseconds, batch 1."""

    p50_ms: float = Field(ge=0)
    p99_ms: float = Field(ge=0)
    runs: int | None = Field(default=None, ge=1)


class DetectionAccuracy(_Schema):
    """A detector's artifact against the fp32 reference's detections on the evaluation images."""

    reference_detections: int = Field(ge=0)
    decisive_detections: int = Field(ge=0, description="reference detections well above the score threshold")
    matched: int = Field(ge=0, description="decisive reference detections matched (same class, IoU >= 0.5)")
    missed: int = Field(ge=0, description="decisive reference detections with no match")
    extra: int = Field(
        ge=0, description="decisive detections of the artifact that match no reference detection"
    )
    mean_iou: float = Field(ge=0, le=1, description="over matched pairs")
    min_iou: float = Field(ge=0, le=1)
    max_score_drift: float = Field(
        ge=0, le=1, description="largest |score - reference score| over matched pairs"
    )


class Accuracy(_Schema):
    """How closely an artifact agrees with the fp32 reference on the evaluation images."""

    top1_agreement: float = Field(ge=0, le=1, description="on the decisive images (fp32 not a near-tie)")
    max_abs_logit_diff: float = Field(ge=0)
    eval_images: int = Field(ge=0)
    smoke_set: bool = Field(description="True: the built-in smoke set, a sanity check, not an accuracy claim")
    passed: bool
    allowed_drop: bool = Field(description="True: below the threshold, shipped under --allow-accuracy-drop")
    top1_agreement_all: float | None = Field(
        default=None, ge=0, le=1, description="on every image, near-ties included"
    )
    decisive_images: int | None = Field(default=None, ge=0)
    flipped: tuple[str, ...] = Field(
        default=(), description="images whose top-1 changed; '~' marks an fp32 near-tie"
    )
    threshold: float | None = Field(default=None, ge=0, le=1)
    #: A detector's gate (``top1_agreement`` is then the share of decisive reference detections
    #: matched at IoU >= 0.5): left out for classifiers.
    detection: DetectionAccuracy | None = Field(default=None, exclude_if=lambda v: v is None)


class ArtifactEntry(_Schema):
    """One model artifact: how to load it, its files, and what was measured on the build host."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    backend: str = Field(min_length=1)
    precision: str = Field(min_length=1)
    #: Which recipe of that precision ("full": full-range int8 weights); left out when default,
    #: so a manifest without variants reads and hashes as before.
    variant: str = Field(default="", pattern=r"^[a-z0-9-]*$", exclude_if=lambda v: v == "")
    #: CPU capabilities the artifact needs to compute as built (``edgekit.runtime.cpu.CAPABILITIES``).
    requires: tuple[str, ...] = Field(default=(), exclude_if=lambda v: not v)
    kind: str = ""
    arch: str = "any"
    path: RelPath
    files: tuple[FileEntry, ...] = Field(min_length=1)
    options: dict[str, Any] = Field(default_factory=dict)
    latency: Latency | None = None
    accuracy: Accuracy | None = None
    notes: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _path_is_one_of_files(self) -> ArtifactEntry:
        if self.path not in {f.path for f in self.files}:
            raise ValueError(f"artifact {self.name!r}: path {self.path!r} is not one of its files")
        return self

    @property
    def size(self) -> int:
        """Bytes in all of this artifact's files."""
        return sum(f.size for f in self.files)


class BuildHost(_Schema):
    """The machine the bundle was built on."""

    arch: str
    cpu: str = ""


class BuildInfo(_Schema):
    """When, where and with what the bundle was built, and the accuracy rule it was built under."""

    edgekit: str
    created: AwareDatetime
    host: BuildHost
    tools: dict[str, str] = Field(default_factory=dict)
    accuracy_threshold: float = Field(ge=0, le=1)
    allow_accuracy_drop: bool = False
    #: The bundle's monotonic build counter, under the signature (``edgekit build`` writes UTC
    #: seconds, or ``--serial``): a device refuses a bundle below the highest it installed.
    #: 0 (a bundle from before serials) is not written, so such a manifest reads and hashes as before.
    serial: int = Field(default=0, ge=0, exclude_if=lambda v: v == 0)


class SignatureInfo(_Schema):
    """Who signed ``manifest.json`` (the signature itself is in ``manifest.sig``)."""

    key_id: str = Field(pattern=_KEY_ID, description="first 16 hex digits of SHA-256 of the raw public key")
    algorithm: Literal["ed25519"] = "ed25519"


class EvalDetection(_Schema):
    """One detection of the fp32 reference on an evaluation frame."""

    class_id: int = Field(ge=0)
    score: float = Field(ge=0, le=1)
    box: tuple[float, float, float, float] = Field(description="x0, y0, x1, y1 in frame pixels")


class EvalFrame(_Schema):
    """One evaluation frame shipped in the bundle (an image file under ``eval/``) and fp32's answer on it.

    ``top1`` and ``margin`` were computed by the fp32 reference on the frame *as stored*
    (decoded from these very bytes, preprocessed the way a device does), so a device that
    decodes the file gets the reference's exact input.
    """

    path: EvalPath
    sha256: str = Field(pattern=_SHA256)
    size: int = Field(ge=0)
    top1: int = Field(ge=0, description="the fp32 reference's best class on this frame")
    margin: float = Field(ge=0, le=1, description="fp32 softmax probability: best minus second best")
    #: A detector's reference answer on this frame: its detections, boxes in the frame's own
    #: pixels (``top1``/``margin`` are then the best detection's class and 0).  Left out for
    #: classifiers, so their manifests read and hash as before.
    detections: tuple[EvalDetection, ...] | None = Field(
        default=None, max_length=256, exclude_if=lambda v: v is None
    )


class EvalSet(_Schema):
    """The frames a device's health gate runs before it activates the bundle, with the fp32 reference."""

    frames: tuple[EvalFrame, ...] = Field(min_length=1, max_length=MAX_EVAL_FRAMES)
    reference: str = Field(min_length=1, description="what computed top1, e.g. onnxruntime-fp32")


class MeasuredCandidate(_Schema):
    """One candidate ``edgekit bench`` measured on a device: SingleStream latencies and agreement with fp32."""

    artifact: str
    backend: str
    precision: str
    threads: int = Field(ge=1)
    p50_ms: float = Field(ge=0)
    p90_ms: float = Field(ge=0)
    p99_ms: float = Field(ge=0)
    queries: int = Field(ge=1)
    top1_agreement: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="agreement with the fp32 reference on the evaluation frames: top-1 for a classifier, "
        "decisive reference detections matched for a detector (the build's and health gate's rule)",
    )


class Selection(_Schema):
    """The candidate measured fastest (p90, SingleStream) on a host of ``profile`` that passed the accuracy gate.

    ``edgekit.load`` on a host of the same profile and architecture tries the measured
    candidates fastest first (with the chosen thread count) instead of the profile's order.
    """

    by: str = Field(min_length=1, description="what measured it, e.g. 'edgekit bench 0.9.0'")
    measured: AwareDatetime
    profile: str = Field(min_length=1)
    host: BuildHost
    metric: Literal["p90_ms"] = "p90_ms"
    chosen: str = Field(min_length=1, description="the artifact name")
    threads: int = Field(ge=1)
    candidates: tuple[MeasuredCandidate, ...] = Field(min_length=1)


class Manifest(_Schema):
    """Everything a device needs to know about a bundle, and the hash of every file in it."""

    schema_version: Literal[1]
    model: ModelInfo
    preprocess: Preprocess
    labels: tuple[str, ...] = ()
    device: DeviceInfo
    artifacts: tuple[ArtifactEntry, ...]
    build: BuildInfo
    signature: SignatureInfo | None = None
    # Optional so that bundles written before the health gate existed still parse.
    eval_set: EvalSet | None = None
    # Written by `edgekit bench --write-selection` / `edgekit build --select fastest`.
    selection: Selection | None = None
    #: How a detector's outputs decode (``model.task == "detection"``); absent for classifiers.
    detection: DetectionHead | None = Field(default=None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _names_and_files_unique(self) -> Manifest:
        names = [a.name for a in self.artifacts]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"artifact names appear twice: {', '.join(dup)}")
        paths = [f.path for a in self.artifacts for f in a.files]
        paths += [f.path for f in self.eval_set.frames] if self.eval_set else []
        dup = sorted({p for p in paths if paths.count(p) > 1})
        if dup:
            raise ValueError(f"files listed twice: {', '.join(dup)}")
        if self.selection is not None:
            known = set(names)
            unknown = sorted(
                ({self.selection.chosen} | {c.artifact for c in self.selection.candidates}) - known
            )
            if unknown:
                raise ValueError(
                    f"the selection names artifacts the bundle does not have: {', '.join(unknown)}"
                )
        if (self.model.task == "detection") != (self.detection is not None):
            raise ValueError(
                f"model.task is {self.model.task!r} but the detection section is "
                f"{'missing' if self.detection is None else 'present'}"
            )
        return self

    def artifact(self, name: str) -> ArtifactEntry:
        """The artifact called ``name``; ``BundleError`` naming the ones there are otherwise."""
        for a in self.artifacts:
            if a.name == name:
                return a
        raise BundleError(
            f"the bundle has no artifact {name!r}",
            f"its artifacts: {', '.join(a.name for a in self.artifacts) or 'none'}",
        )

    def files(self) -> dict[str, FileEntry | EvalFrame]:
        """Every file the manifest lists (artifacts' files and eval frames) by its path in the bundle."""
        found: dict[str, FileEntry | EvalFrame] = {f.path: f for a in self.artifacts for f in a.files}
        if self.eval_set is not None:
            found.update((f.path, f) for f in self.eval_set.frames)
        return found

    def to_bytes(self) -> bytes:
        """The exact bytes written as ``manifest.json`` (and signed)."""
        return (self.model_dump_json(indent=2) + "\n").encode("utf-8")


def describe(err: ValidationError) -> str:
    """One line per bad field (at most ten): where it is, what is wrong, what was there."""
    lines = []
    for e in err.errors()[:10]:
        where = ".".join(str(x) for x in e["loc"]) or "(top level)"
        got = e.get("input")
        shown = "" if e["type"] in ("missing",) or isinstance(got, dict | list) else f" (got {got!r:.60})"
        lines.append(f"  {where}: {e['msg']}{shown}")
    more = err.error_count() - len(lines)
    return "\n".join(lines) + (f"\n  ... and {more} more" if more > 0 else "")


def parse_manifest(data: bytes, where: str = MANIFEST_FILE) -> Manifest:
    """Validate ``manifest.json`` bytes; ``BundleError`` listing each bad field otherwise."""
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BundleError(
            f"{where} is not valid JSON: {err}", "rebuild the bundle with edgekit build"
        ) from err
    if (
        isinstance(raw, dict)
        and isinstance(raw.get("schema_version"), int)
        and raw["schema_version"] > SCHEMA_VERSION
    ):
        raise BundleError(
            f"{where} has schema_version {raw['schema_version']}; this edgekit reads version {SCHEMA_VERSION}",
            "upgrade edgekit on this machine (pip install -U edgekit)",
        )
    try:
        return Manifest.model_validate_json(data)
    except ValidationError as err:
        raise BundleError(
            f"{where} is not a valid bundle manifest:\n{describe(err)}",
            "a manifest is written by edgekit build; if it was edited by hand, rebuild the bundle",
        ) from err


def read_manifest(bundle: Path) -> Manifest:
    """The validated manifest of the bundle folder ``bundle`` (checks no hashes: see ``verify``)."""
    path = bundle / MANIFEST_FILE
    if not bundle.is_dir():
        raise BundleError(
            f"{bundle} is not a bundle folder" + ("" if bundle.exists() else ": it does not exist"),
            "pass the folder edgekit build wrote (or a .tar.gz of it to edgekit verify / inspect)",
        )
    try:
        data = path.read_bytes()
    except FileNotFoundError as err:
        raise BundleError(
            f"{bundle} has no {MANIFEST_FILE}: it is not a bundle", "pass the folder edgekit build wrote"
        ) from err
    except OSError as err:
        raise BundleError(f"{path} cannot be read: {err.strerror}", "check the file's permissions") from err
    return parse_manifest(data, str(path))
