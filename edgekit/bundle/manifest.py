"""The bundle manifest: what a bundle holds, as a validated, versioned, frozen schema.

``manifest.json`` is the one file a device reads first.  Every model is ``extra="forbid"``
and strict, so a typo or a wrong type in a hand-edited or forged manifest is an error that
names the field instead of being silently ignored or coerced.  A detector's sections (the
decoder, its gate's counts, the reference detections) are in ``detection_schema``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    Field,
    ValidationError,
    model_validator,
)

from edgekit.bundle._schema import Schema

# A detector's sections live in their own module; named here too, as part of the manifest.
from edgekit.bundle.detection_schema import BoxCoder as BoxCoder
from edgekit.bundle.detection_schema import DetectionAccuracy as DetectionAccuracy
from edgekit.bundle.detection_schema import DetectionHead as DetectionHead
from edgekit.bundle.detection_schema import EvalDetection as EvalDetection
from edgekit.bundle.detection_schema import SsdAnchors as SsdAnchors
from edgekit.errors import BundleError

SCHEMA_VERSION: Literal[1] = 1
MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.sig"
ARTIFACTS_DIR = "artifacts"
EVAL_DIR = "eval"
MAX_EVAL_FRAMES = 64
#: What a letterbox pads with unless the model says otherwise: YOLO's grey.
LETTERBOX_FILL = 114

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


class ModelInfo(Schema):
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


class Preprocess(Schema):
    """How a frame becomes the model input; the same fields as ``PreprocessSpec.to_dict()``."""

    size: tuple[int, int]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    color: Literal["RGB", "BGR"] = "RGB"
    resize: Literal["squash", "center-crop", "letterbox"] = "center-crop"
    # How a shrinking resize filters (edgekit.processing.preprocessing.INTERPOLATIONS).  Not written when
    # "area", so a bundle that does not use it reads the same to devices that predate it.
    interpolation: Literal["area", "box2-linear", "linear"] = Field(
        default="area", exclude_if=lambda v: v == "area"
    )
    # The letterbox's padding pixel value; not written when the default (YOLO's grey), so a bundle
    # that does not use it reads the same to devices that predate it.
    letterbox_fill: int = Field(
        default=LETTERBOX_FILL, ge=0, le=255, exclude_if=lambda v: v == LETTERBOX_FILL
    )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Preprocess:
        """The manifest form of a spec's ``to_dict()`` (JSON's types: lists, not tuples)."""
        return cls.model_validate_json(json.dumps(data))


class DeviceInfo(Schema):
    """The device profile the bundle was built for."""

    profile: str = Field(min_length=1)
    arch: str
    budget_ms: float = Field(gt=0)


class FileEntry(Schema):
    """One file of the bundle: where it is, its SHA-256 and its size in bytes."""

    path: RelPath
    sha256: str = Field(pattern=_SHA256)
    size: int = Field(ge=0)


class Latency(Schema):
    """Latency measured on the build host (not the device), in milliseconds, batch 1."""

    p50_ms: float = Field(ge=0)
    p99_ms: float = Field(ge=0)
    runs: int | None = Field(default=None, ge=1)


class Accuracy(Schema):
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


class ArtifactEntry(Schema):
    """One model artifact: how to load it, its files, and what was measured on the build host."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    backend: str = Field(min_length=1)
    precision: str = Field(min_length=1)
    #: Which recipe of that precision ("full": full-range int8 weights); left out when default,
    #: so a manifest without variants reads and hashes as before.
    variant: str = Field(default="", pattern=r"^[a-z0-9-]*$", exclude_if=lambda v: v == "")
    #: CPU capabilities the artifact needs to compute as built (``edgekit.core.cpu.CAPABILITIES``).
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


class BuildHost(Schema):
    """The machine the bundle was built on."""

    arch: str
    cpu: str = ""


class BuildInfo(Schema):
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


class SignatureInfo(Schema):
    """Who signed ``manifest.json`` (the signature itself is in ``manifest.sig``)."""

    key_id: str = Field(pattern=_KEY_ID, description="first 16 hex digits of SHA-256 of the raw public key")
    algorithm: Literal["ed25519"] = "ed25519"


class EvalFrame(Schema):
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


class EvalSet(Schema):
    """The frames a device's health gate runs before it activates the bundle, with the fp32 reference."""

    frames: tuple[EvalFrame, ...] = Field(min_length=1, max_length=MAX_EVAL_FRAMES)
    reference: str = Field(min_length=1, description="what computed top1, e.g. onnxruntime-fp32")


class MeasuredCandidate(Schema):
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


class Selection(Schema):
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


class Manifest(Schema):
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
