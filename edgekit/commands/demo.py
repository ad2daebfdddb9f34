"""``edgekit demo``: the reference bundle for this host labelling a sample clip."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Annotated

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

if TYPE_CHECKING:
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
    as_json: JsonOpt = False,
) -> None:
    """Build (or reuse) the reference bundle for this host and label a sample clip at 30 fps."""
    from edgekit.commands.build import _with_progress
    from edgekit.demo import CLIP_IMAGES, demo_key, image_at, reference_bundle, sample_clip
    from edgekit.pipeline import Pipeline
    from edgekit.runtime.host import match_profile
    from edgekit.runtime.profiles import get_profile

    _quiet_opencv()
    profile = match_profile() if device == "auto" else get_profile(device)
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
