"""``edgekit demo``: the reference bundle for this host labelling a sample clip (``--task
detection``: BlazeFace finding the faces in photographs with and without one)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from edgekit.commands.common import JsonOpt, console, err_console, stdout_to_stderr
from edgekit.commands.run import (
    BudgetOpt,
    DeviceOpt,
    FramesOpt,
    PolicyOpt,
    _load,
    _quiet_opencv,
    _report,
    drive,
)
from edgekit.errors import PipelineError

if TYPE_CHECKING:
    from edgekit.device.profiles import DeviceProfile
    from edgekit.pipeline import FrameResult


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_command)


def demo_command(
    frames: FramesOpt = None,
    budget: BudgetOpt = None,
    policy: PolicyOpt = None,
    device: DeviceOpt = "auto",
    rebuild: Annotated[
        bool, typer.Option("--rebuild", help="Build the bundle again even if one is cached.")
    ] = False,
    task: Annotated[
        str,
        typer.Option(
            "--task",
            help="classification (EfficientNet-Lite0 labels photographs) or detection "
            "(BlazeFace finds the faces in photographs with and without one).",
        ),
    ] = "classification",
    as_json: JsonOpt = False,
) -> None:
    """Build (or reuse) the reference bundle for this host and label a sample clip at 30 fps."""
    from edgekit.commands.build import _with_progress
    from edgekit.demo import CLIP_IMAGES, demo_key, image_at, reference_bundle, sample_clip
    from edgekit.device.host import match_profile
    from edgekit.device.profiles import get_profile
    from edgekit.pipeline import Pipeline

    _quiet_opencv()
    if task not in ("classification", "detection"):
        raise PipelineError(f"the demo has no task {task!r}", "--task classification or --task detection")
    profile = match_profile() if device == "auto" else get_profile(device)
    if task == "detection":
        _detection_demo(profile, frames, budget, policy, rebuild, as_json)
        return
    if as_json:
        with stdout_to_stderr():
            bundle, _ = reference_bundle(profile.name, lambda step, status: None, rebuild=rebuild)
    else:
        err_console.print(f"[bold]edgekit demo[/] — EfficientNet-Lite0 on this host ({profile.name})")
        # Converters print progress on stdout; the demo's stdout is the live view and the summary.
        with stdout_to_stderr():
            bundle, _ = _with_progress(
                None, lambda _req, progress: reference_bundle(profile.name, progress, rebuild=rebuild)
            )
    clip = sample_clip()
    seen: dict[str, Counter[str]] = {name: Counter() for name, _ in CLIP_IMAGES}

    def tally(result: FrameResult) -> None:
        if result.top is not None:
            seen[image_at(result.record.index)][result.top.name] += 1

    with (
        _load(bundle, profile.name, [demo_key()[1]], False) as model,  # it signed it itself
        Pipeline(model, str(clip), budget_ms=budget, policy=policy, realtime=True, frames=frames) as pipeline,
    ):
        summary = drive(pipeline, as_json=as_json, sink=tally)
    what = {name: (seen[name].most_common(1)[0] if seen[name] else None) for name, _ in CLIP_IMAGES}
    extra = {
        "bundle": str(bundle),
        "clip": str(clip),
        "seen": {k: ({"label": v[0], "frames": v[1]} if v else None) for k, v in what.items()},
    }
    if not as_json:
        table = Table(title="what the model saw", title_justify="left")
        for col in ("photograph", "shows", "most frequent top-1", "frames"):
            table.add_column(col)
        for name, shows in CLIP_IMAGES:
            v = what[name]
            table.add_row(name, shows, v[0] if v else "-", str(v[1]) if v else "0")
        console.print(table)
    _report(summary, as_json, extra)


@dataclass
class _Faces:
    """What BlazeFace found in one photograph of the clip, over its frames."""

    frames: int = 0
    with_faces: int = 0
    most: int = 0  # the most faces in one frame
    best: float = 0.0  # the best score
    box: tuple[float, float, float, float] | None = None  # the best-scoring face's box (frame pixels)

    def add(self, result: FrameResult) -> None:
        self.frames += 1
        found = result.detections
        if found:
            self.with_faces += 1
            self.most = max(self.most, len(found))
            if found[0].score > self.best:  # detections come best first
                self.best, self.box = found[0].score, found[0].box

    def to_dict(self) -> dict[str, Any]:
        return {
            "frames": self.frames,
            "frames_with_faces": self.with_faces,
            "most_faces": self.most,
            "best_score": round(self.best, 4),
            "box": [round(v, 1) for v in self.box] if self.box else None,
        }


def _detection_demo(
    profile: DeviceProfile,
    frames: int | None,
    budget: float | None,
    policy: str | None,
    rebuild: bool,
    as_json: bool,
) -> None:
    """BlazeFace over photographs with faces and without: per photograph, the faces found."""
    from edgekit.commands.build import _with_progress
    from edgekit.demo import (
        DETECTION_MODEL,
        FACE_CLIP_IMAGES,
        FACES_IN,
        demo_key,
        image_at,
        reference_bundle,
        sample_clip,
    )
    from edgekit.pipeline import Pipeline

    def bundle_for(progress: Any) -> tuple[Path, Any]:
        # Every artifact the profile names: BlazeFace is small (the whole x86_64-cpu build, TVM
        # and int8 included, took 30 s from a cold cache on two cores).
        return reference_bundle(profile.name, progress, rebuild=rebuild, model=DETECTION_MODEL)

    if as_json:
        with stdout_to_stderr():
            bundle, _ = bundle_for(lambda step, status: None)
    else:
        err_console.print(f"[bold]edgekit demo --task detection[/] — BlazeFace on this host ({profile.name})")
        with stdout_to_stderr():
            bundle, _ = _with_progress(None, lambda _req, progress: bundle_for(progress))
    clip = sample_clip(images=FACE_CLIP_IMAGES)
    found = {name: _Faces() for name, _ in FACE_CLIP_IMAGES}

    def tally(result: FrameResult) -> None:
        found[image_at(result.record.index, FACE_CLIP_IMAGES)].add(result)

    with (
        _load(bundle, profile.name, [demo_key()[1]], False) as model,  # it signed it itself
        Pipeline(model, str(clip), budget_ms=budget, policy=policy, realtime=True, frames=frames) as pipeline,
    ):
        summary = drive(pipeline, as_json=as_json, sink=tally)
    extra = {
        "bundle": str(bundle),
        "clip": str(clip),
        "faces": {name: {"expected": FACES_IN[name], **f.to_dict()} for name, f in found.items()},
    }
    if not as_json:
        table = Table(title="faces found", title_justify="left")
        for col in (
            "photograph",
            "shows",
            "faces in it",
            "frames with a face",
            "most in a frame",
            "best score",
        ):
            table.add_column(col)
        for name, shows in FACE_CLIP_IMAGES:
            f = found[name]
            best = f"{f.best:.2f}" if f.with_faces else "-"
            table.add_row(name, shows, str(FACES_IN[name]), f"{f.with_faces}/{f.frames}", str(f.most), best)
        console.print(table)
    _report(summary, as_json, extra)
