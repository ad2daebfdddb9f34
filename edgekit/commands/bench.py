"""``edgekit bench``: every candidate of a bundle that runs here, measured SingleStream and at the camera rate, side by side.

``--streams N``: instead, how many cameras one pipeline holds (``edgekit.bench.streams``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from edgekit.commands.common import JsonOpt, console, err_console, print_json


def _ints(text: str | None) -> tuple[int, ...]:
    from edgekit.bench.runner import BenchError

    if not text:
        return ()
    try:
        return tuple(int(v) for v in text.replace(" ", "").split(",") if v)
    except ValueError as err:
        raise BenchError(
            f"--threads takes whole numbers separated by commas, got {text!r}", "for example --threads 1,2"
        ) from err


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(v for v in (text or "").replace(" ", "").split(",") if v)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_command)


def bench_command(
    bundle: Annotated[Path, typer.Argument(help="A bundle folder or .tar.gz.")],
    backends: Annotated[
        str | None, typer.Option("--backends", help="Only these backends, comma-separated.")
    ] = None,
    precisions: Annotated[
        str | None, typer.Option("--precisions", help="Only these precisions (fp32, fp16, bf16, int8).")
    ] = None,
    threads: Annotated[
        str | None, typer.Option("--threads", help="Thread counts to try, e.g. 1,2 (default: all cores).")
    ] = None,
    min_duration: Annotated[
        float, typer.Option("--min-duration", help="Seconds each candidate runs at least (per round).")
    ] = 4.0,
    min_queries: Annotated[
        int,
        typer.Option(
            "--min-queries", help="Queries each candidate runs at least (662: a p99 LoadGen accepts)."
        ),
    ] = 662,
    max_duration: Annotated[
        float, typer.Option("--max-duration", help="Seconds after which a slow candidate stops anyway.")
    ] = 15.0,
    rounds: Annotated[
        int, typer.Option("--rounds", help="Turns each candidate takes, in a fresh process each (pooled).")
    ] = 1,
    fps: Annotated[
        float | None,
        typer.Option(
            "--fps",
            help="Camera rate of the paced scenario (default: the bundle's budget, 1000/budget_ms; "
            "0: back to back only). With --streams: each camera's rate (default 30).",
        ),
    ] = None,
    paced_queries: Annotated[
        int,
        typer.Option("--paced-queries", help="Queries each candidate runs at the camera rate (per round)."),
    ] = 100,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write the latency plot: out.png, out.svg or out.html.")
    ] = None,
    write_selection: Annotated[
        bool,
        typer.Option(
            "--write-selection",
            help="Record the fastest candidate that passes the accuracy gate in the bundle.",
        ),
    ] = False,
    sign_key: Annotated[
        Path | None, typer.Option(help="Private key to sign the bundle again after --write-selection.")
    ] = None,
    samples: Annotated[
        bool, typer.Option("--samples", help="With --json: include every query latency.")
    ] = False,
    key: Annotated[
        list[Path] | None,
        typer.Option(
            "--key",
            help="Trusted public key (repeat): the bundle must be signed by one (default: the trust store).",
        ),
    ] = None,
    allow_unsigned: Annotated[
        bool,
        typer.Option("--allow-unsigned", help="Bench a bundle no trusted key signed (its native code runs)."),
    ] = False,
    streams: Annotated[
        int | None,
        typer.Option(
            "--streams",
            help="Instead: the most synthetic 640x480 cameras at --fps one pipeline holds (every camera's "
            "p99 within the budget, no drops), for 1..N cameras, batched and unbatched.",
        ),
    ] = None,
    seconds: Annotated[
        float, typer.Option("--seconds", help="With --streams: seconds each number of cameras runs.")
    ] = 10.0,
    as_json: JsonOpt = False,
) -> None:
    """Measure every (backend, precision, threads) candidate of BUNDLE that can run here, MLPerf-LoadGen style.

    Each candidate runs in a fresh process: cold start (process start to first label), a
    warm-up that is not counted, then queries one after another until it has --min-queries
    and --min-duration. p90 is the headline; a p99 from fewer than 662 queries is marked.
    Then --paced-queries issued at the camera rate (--fps, by default the budget's), the runtime
    idle between frames as on the device: once cold, and once as the frame loop runs them, with
    warm passes just before each query. The wake-up cost is cold paced p50 minus back-to-back p50.
    --write-selection ranks by the scenario the device will run: the paced p90 (warm).

    --streams N: how many cameras one pipeline holds instead, for 1..N synthetic 640x480 cameras
    at --fps (30) for --seconds each, batched and unbatched; each series stops at its first
    number not held (a camera's p99 over the budget, or a dropped frame).
    """
    if streams is not None:
        if write_selection or plot is not None:
            from edgekit.bench.runner import BenchError

            raise BenchError(
                "--streams measures one pipeline, not the candidates: not with --write-selection or --plot",
                "run edgekit bench without --streams for those",
            )
        _streams(bundle, streams, 30.0 if fps is None else fps, seconds, key, allow_unsigned, as_json)
        return
    from edgekit.bench.recording import selection_from
    from edgekit.bench.recording import write_selection as write_sel
    from edgekit.bench.report import Settings
    from edgekit.bench.runner import BenchError, plan, run
    from edgekit.bundle import open_bundle
    from edgekit.bundle import verify as verify_bundle

    if fps is not None and not fps >= 0:
        raise BenchError(
            f"--fps must be 0 or more, got {fps:g}", "for example --fps 30 (0: back to back only)"
        )
    if paced_queries < 1:
        raise BenchError(
            f"--paced-queries must be 1 or more, got {paced_queries}", "for example --paced-queries 100"
        )
    if min_queries < 1 or min_duration < 0 or max_duration <= 0 or rounds < 1:
        raise BenchError(
            "--min-queries and --rounds must be 1 or more, the durations positive",
            "for example --min-queries 662 --min-duration 4",
        )
    settings = Settings(
        min_queries=min_queries,
        min_duration_s=min_duration,
        max_duration_s=max(max_duration, min_duration),
        rounds=rounds,
        fps=fps,
        paced_queries=paced_queries,
    )
    from edgekit.bundle.trust import keys_for, require_trusted

    with open_bundle(bundle) as root:
        # Hashes: never time a corrupt file.  A signature by a trusted key: the workers run its native code.
        trusted, explicit = keys_for(key)
        checked = verify_bundle(root, trusted)
        checked.raise_if_failed()
        require_trusted(
            bundle, checked.signature, checked.key_id, explicit=explicit, allow_unsigned=allow_unsigned
        )
        cands, skipped = plan(root, _names(backends), _names(precisions), _ints(threads))
        if not cands:
            reasons = "; ".join(f"{s.backend}-{s.precision}: {s.reason}" for s in skipped) or "none selected"
            raise BenchError(
                f"nothing in {bundle} can run on this host ({reasons})",
                "run edgekit doctor to see which runtimes are installed, or bench the bundle on its device",
            )
        if as_json:
            report = run(root, cands, skipped, settings)
        else:
            report = _with_progress(root, cands, skipped, settings, run)
    data = report.to_dict(with_samples=True)
    selected = None
    if write_selection:
        selection = selection_from(report)
        write_sel(bundle, selection, sign_key)
        selected = {
            "artifact": selection.chosen,
            "threads": selection.threads,
            "ranked_by": report.ranked_by,
        }
    if plot is not None:
        from edgekit.bench.render import plot as draw

        draw(data, plot)
    if as_json:
        out = report.to_dict(with_samples=samples)
        out["selection_written"] = selected
        out["plot"] = str(plot) if plot else None
        print_json(out)
        return
    from edgekit.bench.render import legend, not_run_lines, table

    console.print(table(data))
    for line in not_run_lines(data):
        console.print(line)
    console.print(f"[dim]{legend(data)}[/]")
    if selected:
        console.print(
            f"selection written: [bold]{selected['artifact']}[/] with {selected['threads']} threads"
            f" (ranked by {selected['ranked_by']})"
        )
    if plot is not None:
        console.print(f"plot: {plot}")
    console.print(f"[dim]{report.wall_s:.0f} s[/]")


def _with_progress(root: Path, cands: Any, skipped: Any, settings: Any, run: Any) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        total = settings.min_queries * settings.rounds
        tasks = {c.key: bar.add_task(f"{c.key:28}", total=total) for c in cands}
        done_rounds: dict[str, int] = {c.key: 0 for c in cands}

        def progress(cand: Any, kind: str, ev: dict[str, Any]) -> None:
            base = done_rounds[cand.key] * settings.min_queries
            if kind == "loaded":
                bar.update(tasks[cand.key], description=f"{cand.key:28} running")
            elif kind == "pacing":
                bar.update(tasks[cand.key], description=f"{cand.key:28} at {ev['fps']:g} fps")
            elif kind == "progress":
                bar.update(tasks[cand.key], completed=min(total, base + ev["queries"]))
            elif kind == "done":
                done_rounds[cand.key] += 1
                bar.update(tasks[cand.key], completed=done_rounds[cand.key] * settings.min_queries)
            elif kind == "error":
                bar.update(tasks[cand.key], description=f"{cand.key:28} [red]failed[/]", completed=total)

        return run(root, cands, skipped, settings, progress)


def _streams(
    bundle: Path,
    streams: int,
    fps: float,
    seconds: float,
    key: list[Path] | None,
    allow_unsigned: bool,
    as_json: bool,
) -> None:
    import edgekit
    from edgekit.bench.streams import StreamStep, check_settings, measure_streams, step_line

    def say(line: str) -> None:
        # stderr, so that --json's stdout stays one document; markup off: paths and keys hold brackets.
        err_console.print(line, highlight=False, markup=False)

    def step_done(step: StreamStep) -> None:
        say(step_line(step))

    check_settings(streams, fps, seconds)  # before the (slow) load
    with edgekit.load(bundle, trusted_keys=key, allow_unsigned=allow_unsigned, progress=say) as model:
        say(f"{model.candidate}: 1..{streams} cameras at {fps:g} fps, {seconds:g} s each")
        report = measure_streams(model, streams, fps=fps, seconds=seconds, progress=step_done)
    data = report.to_dict()
    if as_json:
        print_json(data)
        return
    from rich.table import Table

    t = Table(
        title=f"{data['candidate']}: cameras one pipeline holds at {fps:g} fps, {data['budget_ms']:g} ms"
    )
    for col in ("cameras", "series", "worst p99 ms", "dropped", "mean batch", "held"):
        t.add_column(col, justify="left" if col == "series" else "right")
    for s in data["steps"]:
        t.add_row(
            str(s["n"]),
            s["series"],
            "-" if s["worst_p99_ms"] is None else f"{s['worst_p99_ms']:.2f}",
            str(s["dropped"]),
            "-" if s["batch_mean"] is None else f"{s['batch_mean']:.2f}",
            "yes" if s["held"] else "[red]no[/]",
        )
    console.print(t)
    for name in ("batched", "unbatched"):
        more = " (or more: every number asked held)" if data["capped"][name] else ""
        console.print(f"most cameras held, {name}: [bold]{data['most_held'][name]}[/]{more}")
