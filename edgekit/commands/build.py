"""``edgekit build``: a model to a device's bundle, with progress and a summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from edgekit.commands.build_progress import PlainProgress, stage_table
from edgekit.commands.common import JsonOpt, console, err_console, print_json, stdout_to_stderr
from edgekit.errors import BuildError


def _floats(text: str | None, what: str, n: int) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        vals = tuple(float(v) for v in text.replace(" ", "").split(","))
    except ValueError as err:
        raise BuildError(
            f"{what} must be numbers separated by commas, got {text!r}", f"for example {what} 127.5"
        ) from err
    if len(vals) == 1:
        vals = vals * n
    if len(vals) != n:
        raise BuildError(
            f"{what} needs 1 or {n} values, got {len(vals)}", f"for example {what} 123.675,116.28,103.53"
        )
    return vals


def _list(text: str | None) -> tuple[str, ...]:
    return tuple(v for v in (text or "").replace(" ", "").split(",") if v)


def register(app: typer.Typer) -> None:
    app.command("build")(build_command)


def build_command(
    device: Annotated[
        str, typer.Option("--device", "-d", help="Device profile or alias (edgekit devices list).")
    ],
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            "-m",
            help="A model card directory (models/NAME); its [source] may name a .onnx or .tflite file beside it.",
        ),
    ] = None,
    onnx: Annotated[
        Path | None, typer.Option("--onnx", help="Build from an ONNX file instead of a model card.")
    ] = None,
    tflite: Annotated[
        Path | None, typer.Option("--tflite", help="Bundle a .tflite file as it is (LiteRT only).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Bundle directory, or a path ending in .tar.gz.")
    ] = None,
    input_size: Annotated[
        str | None, typer.Option(help="H,W of the model input, when the file does not say.")
    ] = None,
    mean: Annotated[
        str | None, typer.Option(help="Per-channel mean in pixel units (one value or three).")
    ] = None,
    std: Annotated[
        str | None, typer.Option(help="Per-channel std in pixel units (one value or three).")
    ] = None,
    layout: Annotated[str | None, typer.Option(help="NCHW or NHWC, when the file does not say.")] = None,
    labels: Annotated[Path | None, typer.Option(help="Class names, one per line (line N = class N).")] = None,
    calibration: Annotated[
        Path | None, typer.Option(help="Directory of calibration images (default: smoke set).")
    ] = None,
    eval_dir: Annotated[
        Path | None, typer.Option("--eval", help="Directory of evaluation images (default: smoke set).")
    ] = None,
    eval_coco: Annotated[
        Path | None,
        typer.Option(
            "--eval-coco",
            help="COCO-format labels of --eval-images: a detector's gate becomes mAP50 against fp32.",
        ),
    ] = None,
    eval_images: Annotated[
        Path | None, typer.Option("--eval-images", help="The folder of the --eval-coco images.")
    ] = None,
    max_map_drop: Annotated[
        float, typer.Option("--max-map-drop", help="Points of mAP50 an artifact may lose against fp32.")
    ] = 1.0,
    class_map: Annotated[
        str | None,
        typer.Option("--class-map", help='Model classes to --eval-coco categories: "CLASS=CATEGORY,...".'),
    ] = None,
    backends: Annotated[str | None, typer.Option(help="Only these backends, comma-separated.")] = None,
    precisions: Annotated[
        str | None, typer.Option(help="Only these precisions, comma-separated (fp32,fp16,int8).")
    ] = None,
    tune_trials: Annotated[
        int, typer.Option(help="MetaSchedule trials for TVM (0: apply a cached/shipped database).")
    ] = 0,
    tvm_untuned: Annotated[
        bool, typer.Option(help="Build this host's TVM library even with no tuned schedules (slow).")
    ] = False,
    sign_key: Annotated[
        Path | None, typer.Option(help="Ed25519 private key to sign the bundle (edgekit keys generate).")
    ] = None,
    serial: Annotated[
        int | None,
        typer.Option(
            "--serial",
            min=0,
            help="The bundle's build counter, signed in its manifest; devices refuse one below the "
            "highest they installed (default: now, in UTC seconds).",
        ),
    ] = None,
    threshold: Annotated[
        float, typer.Option(help="Minimum top-1 agreement with fp32 for derived artifacts.")
    ] = 0.98,
    allow_accuracy_drop: Annotated[
        bool, typer.Option(help="Write the bundle even if an artifact fails the gate (recorded).")
    ] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Rebuild every step.")] = False,
    select: Annotated[
        str | None,
        typer.Option(
            "--select",
            help="fastest: bench the built bundle here (edgekit bench) and record the fastest candidate "
            "that passes the accuracy gate, so the device runs what was measured best.",
        ),
    ] = None,
    write_card: Annotated[
        Path | None,
        typer.Option(
            "--write-card",
            help="With --onnx: write the card inferred from the file (a folder's model.toml, or a .toml path), "
            "each value commented with where it came from, and build nothing; edit it, then --model.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Turn a model into the artifacts a device runs best, check them against fp32, and pack a bundle."""
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.coco_gate import gate_request
    from edgekit.convert.modelcard import card_for_file, read_card
    from edgekit.convert.onnx_card import card_for_onnx
    from edgekit.device.profiles import get_profile

    if sum(x is not None for x in (model, onnx, tflite)) != 1:
        raise BuildError(
            "give exactly one model: --model DIR, --onnx FILE or --tflite FILE",
            "for the reference model: --model models/efficientnet-lite0",
        )
    profile = get_profile(device)
    if select is not None:
        _check_select(select, profile.arch)
    size = _floats(input_size, "--input-size", 2)
    flags: dict[str, Any] = {
        "input_size": (int(size[0]), int(size[1])) if size else None,
        "mean": _floats(mean, "--mean", 3),
        "std": _floats(std, "--std", 3),
        "layout": layout,
        "labels": labels,
    }
    if write_card is not None:
        _write_card(onnx, write_card, flags, as_json)
        return
    if model is not None:
        card = read_card(model)
    else:
        file = onnx or tflite
        assert file is not None
        card = card_for_onnx(file, **flags) if onnx is not None else card_for_file(file, **flags)
    inferred = [f.to_dict() for f in card.extra.get("inferred", ())]
    for fact in card.extra.get("inferred", ()) if not as_json else ():
        err_console.print(f"[dim]inferred:[/] {escape(fact.line())}", highlight=False)
    target = out or Path("bundles") / f"{card.name}-{profile.name}"
    target.parent.mkdir(parents=True, exist_ok=True)
    req = BuildRequest(
        card=card,
        device=profile.name,
        out=target,
        onnx=onnx,
        tflite=tflite,
        calibration=calibration,
        eval=eval_dir,
        backends=_list(backends),
        precisions=_list(precisions),
        tune_trials=tune_trials,
        tvm_untuned=tvm_untuned,
        sign_key=sign_key,
        serial=serial,
        threshold=threshold,
        allow_accuracy_drop=allow_accuracy_drop,
        use_cache=not no_cache,
        coco=gate_request(eval_coco, eval_images, max_map_drop, class_map),
    )
    if as_json:
        with stdout_to_stderr():
            result = build(req, PlainProgress())
            chosen = _select_fastest(target, sign_key, quiet=True) if select else None
        print_json({**result.to_dict(), "selection": chosen, "inferred": inferred})
        return
    result = _with_progress(req, build)
    _summary(result.to_dict())
    if select:
        chosen = _select_fastest(target, sign_key, quiet=False)
        console.print(
            f"selected by measurement: [bold]{chosen['artifact']}[/] with {chosen['threads']} threads "
            f"(p90 {chosen['p90_ms']:.2f} ms, {chosen['ranked_by']}), recorded in the bundle"
        )


def _write_card(onnx: Path | None, dest: Path, flags: dict[str, Any], as_json: bool) -> None:
    """``--write-card``: the card inferred from ``--onnx``, written to edit; nothing is built."""
    from edgekit.convert.onnx_card import write_card

    if onnx is None:
        raise BuildError("--write-card writes the card inferred from an ONNX file", "give --onnx FILE")
    path, facts = write_card(onnx, dest, **flags)
    if as_json:
        print_json({"card": str(path), "inferred": [f.to_dict() for f in facts]})
        return
    for fact in facts:
        err_console.print(f"[dim]inferred:[/] {escape(fact.line())}", highlight=False)
    console.print(f"wrote {path}: edit it, then edgekit build --model {path.parent} --device DEVICE")


def _check_select(select: str, profile_arch: str) -> None:
    """Before building: --select must be a known rule and the bundle must be runnable here to be measured."""
    from edgekit.core.elf import host_arch

    if select != "fastest":
        raise BuildError(f"--select takes 'fastest', got {select!r}", "use --select fastest, or leave it out")
    if profile_arch != host_arch():
        raise BuildError(
            f"--select fastest measures the bundle on this host, but this host is {host_arch()} "
            f"and the device is {profile_arch}",
            "build without --select, then run `edgekit bench BUNDLE --write-selection --sign-key KEY` on the device",
        )


def _select_fastest(bundle: Path, sign_key: Path | None, quiet: bool) -> dict[str, Any]:
    """Bench the built bundle (edgekit bench's defaults) and write the fastest gated candidate into it.

    Fastest in the scenario the device will run: paced at its camera rate (from the budget).
    """
    from edgekit.bench.recording import selection_from, write_selection
    from edgekit.bench.runner import plan, run
    from edgekit.bundle import open_bundle

    with open_bundle(bundle) as root:
        cands, skipped = plan(root)
        if quiet:
            report = run(root, cands, skipped)
        else:
            from edgekit.bench.report import Settings
            from edgekit.commands.bench import _with_progress as bench_progress

            report = bench_progress(root, cands, skipped, Settings(), run)
    selection = selection_from(report)
    write_selection(bundle, selection, sign_key)
    best = next(
        c for c in selection.candidates if c.artifact == selection.chosen and c.threads == selection.threads
    )
    return {
        "artifact": selection.chosen,
        "threads": selection.threads,
        "p90_ms": best.p90_ms,  # of the scenario it was ranked by: paced at the camera rate by default
        "ranked_by": report.ranked_by,
        "bench": report.to_dict(),
    }


def _with_progress(req: Any, run: Any) -> Any:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if not err_console.is_terminal:  # a pipe or a CI log: plain lines, not a spinner no one sees
        return run(req, PlainProgress())
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=False,
    ) as bar:
        tasks: dict[str, Any] = {}

        def progress(step: str, status: str) -> None:
            if status == "start":
                tasks[step] = bar.add_task(f"{step} …", total=1)
            elif status.startswith("images "):
                bar.update(tasks[step], description=f"{step} … {status.removeprefix('images ')} images")
            elif step not in tasks:  # left out before it started (a TVM library with no schedules)
                bar.add_task(f"{step} [yellow]– {status}[/]", total=1, completed=1)
            else:
                mark = {"done": "[green]✓[/]", "cached": "[cyan]✓ cached[/]"}.get(
                    status, f"[yellow]– {status}[/]"
                )
                bar.update(tasks[step], completed=1, description=f"{step} {mark}")

        return run(req, progress)


def _summary(result: dict[str, Any]) -> None:
    table = Table(title=f"bundle {result['bundle']} for {result['profile']}", title_justify="left")
    table.add_column("artifact", no_wrap=True)
    detector = any((a["accuracy"] or {}).get("detection") for a in result["artifacts"])
    gate_columns = (
        ("matched", "mean IoU", "missed", "extra", "Δscore") if detector else ("top-1 vs fp32", "max Δlogit")
    )
    for col in ("arch", *gate_columns, "p50 ms", "p99 ms", "note"):
        table.add_column(col)
    for a in result["artifacts"]:
        acc, lat = a["accuracy"], a["latency_ms"]
        table.add_row(
            a["recipe"],
            a["arch"] or "-",
            *(_detection_cells(acc) if detector else _top1_cells(acc)),
            f"{lat['p50']:.2f}" if lat else "-",
            f"{lat['p99']:.2f}" if lat else "-",
            a["skipped"] or a["not_measured"] or a.get("gate_sample") or a["notes"].get("edgetpu", "") or "",
        )
    console.print(table)
    if result.get("stages"):
        console.print(stage_table(result["stages"]))
    if detector:
        console.print(
            "[dim]matched: the fp32 model's decisive detections (score at least 0.1 above the threshold) "
            "the artifact finds too (same class, IoU >= 0.5); extra: its decisive detections where fp32 "
            "finds nothing; Δscore: the largest score change of a match. Near-threshold detections are "
            "counted in the manifest, not gated.[/]"
        )
    else:
        console.print(
            "[dim]top-1 vs fp32: agreement on the images where fp32 is decisive (its two best classes at least "
            "10 points of probability apart); near-ties are listed in the manifest, not gated.[/]"
        )
    for a in result["artifacts"]:
        if (a["accuracy"] or {}).get("map_gate"):
            console.print(_map_line(a["recipe"], a["accuracy"]["map_gate"]))
    if result["smoke_set"]:
        console.print(
            f"[dim]accuracy measured on the built-in smoke set ({result['eval_images']} images from scikit-image): "
            "a check that the numerics survived conversion, not an accuracy claim; pass --eval DIR for that.[/]"
        )


def _top1_cells(acc: dict[str, Any] | None) -> tuple[str, str]:
    if not acc:
        return "-", "-"
    colour = "green" if acc["passed"] else "red"
    return (
        f"[{colour}]{acc['top1_agreement']:.0%}[/] of {acc['decisive_images']}",
        f"{acc['max_abs_logit_diff']:.3f}",
    )


def _detection_cells(acc: dict[str, Any] | None) -> tuple[str, str, str, str, str]:
    det = (acc or {}).get("detection")
    if not acc or not det:
        return "-", "-", "-", "-", "-"
    colour = "green" if acc["passed"] else "red"
    return (
        f"[{colour}]{det['matched']}/{det['decisive_detections']}[/] ({acc['top1_agreement']:.0%})",
        f"{det['mean_iou']:.3f}",
        str(det["missed"]),
        f"[{'red' if det['extra'] else 'green'}]{det['extra']}[/]",
        f"{det['max_score_drift']:.3f}",
    )


def _map_line(recipe: str, m: dict[str, Any]) -> str:
    colour = "green" if m["passed"] else "red"
    return (
        f"{recipe}: [{colour}]mAP50 {100 * m['map50']:.1f}[/] (fp32 {100 * m['fp32_map50']:.1f}: "
        f"{0.0 - m['drop_points']:+.2f} points, {0.0 - m['max_drop_points']:+g} allowed), mAP50-95 "
        f"{100 * m['map50_95']:.1f} on {m['images']} labelled images"
    )
