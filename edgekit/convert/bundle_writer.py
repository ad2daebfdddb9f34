"""Write a bundle: copy each artifact's files in, hash them, write and sign the manifest, all or nothing."""

from __future__ import annotations

import hashlib
import json
import logging
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from edgekit.bundle._fs import check_replaceable, copy_hashed, replace_dir, temp_beside
from edgekit.bundle.manifest import (
    ARTIFACTS_DIR,
    EVAL_DIR,
    MANIFEST_FILE,
    SCHEMA_VERSION,
    SIGNATURE_FILE,
    Accuracy,
    ArtifactEntry,
    BuildHost,
    BuildInfo,
    DetectionHead,
    DeviceInfo,
    EvalDetection,
    EvalFrame,
    EvalSet,
    FileEntry,
    Latency,
    Manifest,
    ModelInfo,
    Preprocess,
    SignatureInfo,
    describe,
)
from edgekit.core.io import remove_tree
from edgekit.errors import BundleError

if TYPE_CHECKING:
    from edgekit.convert.artifact import Artifact
    from edgekit.convert.modelcard import ModelCard
    from edgekit.device.profiles import DeviceProfile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArtifactResults:
    """What the build measured for one artifact: build-host latency and agreement with fp32."""

    latency: Latency | None = None
    accuracy: Accuracy | None = None


@dataclass(frozen=True)
class EvalSample:
    """One evaluation frame to ship: its file name, its encoded bytes, and fp32's answer on them."""

    name: str  # a plain file name such as ``03-coffee.jpg``
    data: bytes
    top1: int
    margin: float
    #: A detector's reference detections on the frame (boxes in its pixels); None for a classifier.
    detections: tuple[EvalDetection, ...] | None = None


@dataclass(frozen=True)
class EvalSamples:
    """The frames a device's health gate will run, and what computed their reference answers."""

    frames: tuple[EvalSample, ...]
    reference: str


@dataclass(frozen=True)
class BundleMeta:
    """Everything in the manifest that is not about one artifact (``bundle_meta`` fills it from a card)."""

    model: ModelInfo
    preprocess: Preprocess
    device: DeviceInfo
    build: BuildInfo
    labels: tuple[str, ...] = field(default=())
    detection: DetectionHead | None = None  # a detector's head (then ``model.task`` is "detection")


def bundle_meta(
    card: ModelCard,
    profile: DeviceProfile,
    *,
    source_sha256: str,
    accuracy_threshold: float,
    allow_accuracy_drop: bool = False,
    tools: Mapping[str, str] | None = None,
    created: datetime | None = None,
    serial: int | None = None,
) -> BundleMeta:
    """The manifest's model, preprocessing, labels, device and build sections for ``card`` on ``profile``.

    ``source_sha256`` is the hash of the fp32 ONNX every artifact was derived from;
    ``tools`` maps a tool (``onnxruntime``, ``openvino``, ``tvm``...) to its version.
    ``serial`` is the bundle's build counter (default: the creation time in UTC seconds).
    A detector's card (``task = "detection"``) gives the manifest its task and detection head.
    """
    from edgekit._version import __version__
    from edgekit.convert.accuracy_detection import detection_head
    from edgekit.device.host import read_host

    host = read_host(probe_runtimes=False)
    head = detection_head(card)
    created = created or datetime.now(timezone.utc).replace(microsecond=0)
    return BundleMeta(
        model=ModelInfo(
            name=card.name,
            version=card.version,
            description=card.description,
            license=card.license,
            attribution=card.attribution,
            source=_plain(card.source),
            source_sha256=source_sha256,
            input=card.input_name,
            output=card.output_name,
            task="detection" if head is not None else "classification",
        ),
        preprocess=Preprocess.from_dict(card.preprocess.to_dict()),
        labels=tuple(card.labels),
        device=DeviceInfo(profile=profile.name, arch=profile.arch, budget_ms=float(profile.budget_ms)),
        build=BuildInfo(
            edgekit=__version__,
            created=created,
            host=BuildHost(arch=host.arch or platform.machine(), cpu=host.cpu_model or ""),
            tools=dict(tools or {}),
            accuracy_threshold=accuracy_threshold,
            allow_accuracy_drop=allow_accuracy_drop,
            serial=int(created.timestamp()) if serial is None else serial,
        ),
        detection=head,
    )


def _plain(value: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-only copy (paths and tuples become strings and lists), so the manifest always serialises."""
    plain: dict[str, Any] = json.loads(json.dumps(dict(value), default=str))
    return plain


def _name(artifact: Artifact, taken: set[str]) -> str:
    name = artifact.key
    if name in taken:
        name = f"{artifact.key}-{artifact.arch}"
    if name in taken:
        raise BundleError(
            f"two artifacts are both {name!r} ({artifact.path})",
            "a bundle holds one artifact per backend, precision and arch",
        )
    taken.add(name)
    return name


def _layout(artifact: Artifact, name: str) -> list[tuple[Path, str]]:
    """``(source file, path in bundle)`` for each file, keeping file names (an IR's .xml names its .bin)."""
    base = artifact.path.parent
    out = []
    for src in artifact.all_files:
        rel = src.relative_to(base).as_posix() if src.is_relative_to(base) else src.name
        out.append((src, f"{ARTIFACTS_DIR}/{name}/{rel}"))
    if artifact.path not in artifact.all_files:
        raise BundleError(
            f"artifact {name}: its path {artifact.path} is not among its files",
            "list the loaded file first in Artifact.files",
        )
    return out


def _copy_artifact(artifact: Artifact, results: ArtifactResults, name: str, into: Path) -> ArtifactEntry:
    entries = []
    main = ""
    for src, rel in _layout(artifact, name):
        dst = into / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            digest, size = copy_hashed(src, dst)
        except FileNotFoundError as err:
            raise BundleError(
                f"artifact {name}: file {src} does not exist", "the build step that made it failed; rebuild"
            ) from err
        except FileExistsError as err:
            raise BundleError(
                f"artifact {name}: two of its files are both {rel}", "give them distinct names"
            ) from err
        entries.append(FileEntry(path=rel, sha256=digest, size=size))
        if src == artifact.path:
            main = rel
    return ArtifactEntry(
        name=name,
        backend=artifact.backend,
        precision=artifact.precision,
        variant=artifact.variant,
        requires=tuple(artifact.requires),
        kind=artifact.kind,
        arch=artifact.arch,
        path=main,
        files=tuple(entries),
        options=_plain(artifact.options),
        latency=results.latency,
        accuracy=results.accuracy,
        notes=_plain(artifact.notes),
    )


def _write_evals(evals: EvalSamples, into: Path) -> EvalSet:
    folder = into / EVAL_DIR
    folder.mkdir()
    frames = []
    for sample in evals.frames:
        rel = f"{EVAL_DIR}/{sample.name}"
        with (into / rel).open("xb") as f:  # "x": two frames with one name are a bug, not an overwrite
            f.write(sample.data)
        frames.append(
            EvalFrame(
                path=rel,
                sha256=hashlib.sha256(sample.data).hexdigest(),
                size=len(sample.data),
                top1=sample.top1,
                margin=sample.margin,
                detections=sample.detections,
            )
        )
    return EvalSet(frames=tuple(frames), reference=evals.reference)


def write_bundle(
    out: Path,
    meta: BundleMeta,
    artifacts: Sequence[tuple[Artifact, ArtifactResults]],
    sign_key: Path | None = None,
    evals: EvalSamples | None = None,
) -> Path:
    """Write a bundle of ``artifacts`` at ``out`` (a folder, or a ``.tar.gz`` by its name); return ``out``.

    Each artifact's files are copied to ``artifacts/<name>/`` (``name`` is the artifact's
    key: ``onnxruntime-int8``, ``litert-int8-edgetpu``...) and hashed as they are copied;
    ``manifest.json`` lists them, and with ``sign_key`` (a private key PEM) ``manifest.sig``
    signs it.  ``evals`` go to ``eval/`` and the manifest's ``eval_set`` (what a device's
    health gate runs before it activates the bundle).  Everything is written in a temp folder beside ``out`` and renamed into place
    at the end, replacing an existing bundle only then; a failure leaves ``out`` as it was.
    """
    from edgekit.bundle.archive import is_archive_name, pack

    key = None
    if sign_key is not None:
        from edgekit.bundle.keys import key_id, load_private_key, sign

        key = load_private_key(sign_key)  # before any copying: a bad key fails fast
    as_archive = is_archive_name(out)
    if not as_archive:
        check_replaceable(out)
    tmp = temp_beside(out, "tmp")
    try:
        taken: set[str] = set()
        entries = tuple(_copy_artifact(a, r, _name(a, taken), tmp) for a, r in artifacts)
        try:
            eval_set = _write_evals(evals, tmp) if evals is not None and evals.frames else None
            manifest = Manifest(
                schema_version=SCHEMA_VERSION,
                model=meta.model,
                preprocess=meta.preprocess,
                labels=meta.labels,
                device=meta.device,
                artifacts=entries,
                build=meta.build,
                signature=SignatureInfo(key_id=key_id(key.public_key())) if key is not None else None,
                eval_set=eval_set,
                detection=meta.detection,
            )
        except ValidationError as err:
            raise BundleError(
                f"the bundle's manifest would be invalid:\n{describe(err)}",
                "an artifact or its results carry values the manifest cannot hold; this is an edgekit bug",
            ) from err
        data = manifest.to_bytes()
        (tmp / MANIFEST_FILE).write_bytes(data)
        if key is not None:
            (tmp / SIGNATURE_FILE).write_bytes(sign(key, data))
        if as_archive:
            pack(tmp, out)
        else:
            replace_dir(tmp, out)
    except OSError as err:
        raise BundleError(
            f"cannot write the bundle at {out}: {err}", "check free space and permissions"
        ) from err
    finally:
        remove_tree(tmp)  # gone already when it was renamed into place
    log.info("wrote bundle %s (%d artifacts%s)", out, len(entries), ", signed" if key else "")
    return out
