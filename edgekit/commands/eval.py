"""``edgekit eval``: a detector bundle's mAP on the user's own labelled images (COCO JSON), artifact by artifact.

Every artifact that runs here (``edgekit bench``'s rule), or those ``--artifacts`` names,
is run on each image as a device runs it and scored by pycocotools
(``edgekit.convert.coco_eval``); the table gives mAP50-95, mAP50 and each one's change
against the bundle's fp32 artifact in points.  Progress goes to stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from edgekit.commands.common import JsonOpt, console, print_json
from edgekit.errors import EdgekitError


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)


def eval_command(
    bundle: Annotated[Path, typer.Argument(help="A detector bundle folder or .tar.gz.")],
    coco: Annotated[Path, typer.Option("--coco", help="COCO-format annotations (.json) of the images.")],
    images: Annotated[
        Path, typer.Option("--images", help="The folder the annotations' file_name entries are in.")
    ],
    artifacts: Annotated[
        str | None,
        typer.Option(
            "--artifacts", help="Only these artifacts, comma-separated (default: all that run here)."
        ),
    ] = None,
    class_map: Annotated[
        str | None,
        typer.Option(
            "--class-map",
            help='Model classes to categories where the names differ: "MODEL_CLASS=CATEGORY,..." '
            "(names, or class index and category id).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure each artifact's mAP on labelled images, as Ultralytics val does (score >= 0.001, 300 per image)."""
    result = evaluate_bundle(bundle, coco, images, _names(artifacts), class_map)
    if as_json:
        print_json(result)
        return
    table = Table(
        title=f"{result['model']} on {result['images']} images, {result['boxes']} boxes ({coco.name})",
        title_justify="left",
    )
    for col in ("artifact", "mAP50-95", "mAP50", "Δ mAP50-95", "Δ mAP50"):
        table.add_column(col)
    for row in result["artifacts"]:
        table.add_row(
            row["artifact"],
            f"{100 * row['map50_95']:.1f}",
            f"{100 * row['map50']:.1f}",
            _points(row["delta_map50_95"]),
            _points(row["delta_map50"]),
        )
    console.print(table)
    console.print(
        "[dim]mAP in percent (pycocotools, COCO's rule); Δ: points against the bundle's fp32 artifact.[/]"
    )
    for s in result["skipped"]:
        console.print(f"[dim]not run here: {s['artifact'] or s['backend']} ({s['reason']})[/]")


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(v for v in (text or "").replace(" ", "").split(",") if v)


def _points(delta: float | None) -> str:
    return "-" if delta is None else f"{delta:+.2f}"


def _progress(artifact: str) -> Any:
    def report(done: int, total: int) -> None:
        step = max(1, total // 10)
        if done == total or done % step == 0:
            print(f"eval {artifact}: {done}/{total} images", file=sys.stderr, flush=True)

    return report


def evaluate_bundle(
    bundle: Path,
    annotations: Path,
    images: Path,
    artifacts: tuple[str, ...] = (),
    class_map: str | None = None,
) -> dict[str, Any]:
    """Every runnable (or named) artifact's mAP on the labelled set, and its change against fp32."""
    from edgekit.backends import registry
    from edgekit.bench.runner import plan
    from edgekit.bundle import open_bundle, read_manifest
    from edgekit.bundle.verify import check_files
    from edgekit.convert.coco_data import class_ids, load_coco
    from edgekit.convert.coco_eval import evaluate
    from edgekit.processing.preprocessing import PreprocessSpec

    coco = load_coco(annotations, images)  # the user's files first: their mistakes cost nothing to find
    with open_bundle(bundle) as root:
        manifest = read_manifest(root)
        head = manifest.detection
        if head is None:
            raise EdgekitError(
                f"{bundle} is a classifier ({manifest.model.name}): mAP measures a detector's boxes",
                "pass a detector bundle (model.task = detection); a classifier's build gate is top-1 agreement",
            )
        mapping = class_ids(manifest.labels, coco, class_map)
        cands, skipped = plan(root)
        runnable = {c.artifact: c for c in reversed(cands)}  # one per artifact (thread counts alike)
        by_name = {a.name: a for a in manifest.artifacts}
        unknown = [n for n in artifacts if n not in by_name]
        if unknown:
            raise EdgekitError(
                f"{bundle} has no artifact {', '.join(unknown)}", f"its artifacts: {', '.join(by_name)}"
            )
        not_here = [n for n in artifacts if n not in runnable]
        if not_here:
            why = {s.artifact: s.reason for s in skipped if s.artifact}
            raise EdgekitError(
                "cannot run here: "
                + "; ".join(f"{n} ({why.get(n, 'not runnable on this host')})" for n in not_here),
                "evaluate it on a host that runs it, or leave it out of --artifacts",
            )
        chosen = [
            a for a in manifest.artifacts if a.name in runnable and (not artifacts or a.name in artifacts)
        ]
        if not chosen:
            raise EdgekitError(f"no artifact of {bundle} runs here", "run edgekit eval on the device")
        spec = PreprocessSpec.from_manifest(manifest)
        rows = []
        for art in chosen:
            cand = runnable[art.name]
            check_files(root, manifest, [f.path for f in art.files])
            with registry.get(cand.backend).load(root / art.path, cand.options) as session:
                got = evaluate(session, head, spec, coco, mapping, _progress(art.name))
            rows.append(
                {"artifact": art.name, "backend": art.backend, "precision": art.precision, **got.to_dict()}
            )
    ref = next((r for r in rows if r["precision"] == "fp32"), None)
    for r in rows:
        for k in ("map50_95", "map50"):
            r[f"delta_{k}"] = None if ref is None else round(100 * (r[k] - ref[k]), 2)
    return {
        "bundle": str(bundle),
        "model": manifest.model.name,
        "annotations": str(annotations),
        "images": len(coco.images),
        "boxes": coco.boxes,
        "class_map": {manifest.labels[k]: coco.categories[v] for k, v in sorted(mapping.items())},
        "reference": ref["artifact"] if ref else None,
        "artifacts": rows,
        "skipped": [
            s.to_dict() for s in skipped if s.artifact and (not artifacts or s.artifact in artifacts)
        ],
    }
