"""The ``edgekit`` command.

User mistakes (an unknown device, a corrupt model) print ``error:`` and ``hint:`` lines and
exit 2 without a traceback; ``--debug`` shows the traceback.  Commands that report take
``--json`` and then print one JSON document on stdout and nothing else.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from edgekit._version import __version__
from edgekit.commands import register_all
from edgekit.commands.common import JsonOpt, console, err_console
from edgekit.commands.common import print_json as _print_json
from edgekit.errors import EdgekitError, command_line_hints

app = typer.Typer(
    name="edgekit",
    help="Take a trained vision model to edge devices and keep it within its frame budget there.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
devices_app = typer.Typer(
    help="Device profiles: what each device is and which backends it tries.", no_args_is_help=True
)
app.add_typer(devices_app, name="devices")

_state = {"debug": False}


def _version(value: bool) -> None:
    if value:
        console.print(f"edgekit {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs.")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show info logs (fallbacks, chosen backend).")
    ] = False,
) -> None:
    _state["debug"] = debug
    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


@app.command()
def doctor(as_json: JsonOpt = False) -> None:
    """Show this host, the device profile it matches, and every backend: available, version, why not."""
    from edgekit.selection.doctor import doctor_report

    report = doctor_report()
    if as_json:
        _print_json(report)
        return
    host = report["host"]
    console.print(f"[bold]edgekit {report['edgekit']}[/] on Python {report['python']}")
    facts = Table(show_header=False, box=None, pad_edge=False)
    for key in (
        "arch",
        "cpu_model",
        "cpu_count",
        "memory_mb",
        "device_tree_model",
        "nv_tegra_release",
        "edgetpu",
        "openvino_devices",
        "ort_providers",
        "cpu_flags",
    ):
        value = host[key]
        facts.add_row(
            f"[dim]{key}[/]", ", ".join(value) if isinstance(value, list | tuple) else str(value or "-")
        )
    console.print(facts)
    for name, c in report["cpu"]["capabilities"].items():  # what decides precisions and int8 recipes
        console.print(
            f"[dim]{name:<9}[/]" + ("[green]yes[/]" if c["present"] else "[red]no[/]") + f" ({c['from']})",
            highlight=False,
        )
    console.print(
        f"profile: [bold cyan]{report['profile'] or 'none'}[/]"
        + (f" (also fits: {', '.join(report['also_matches'])})" if report["also_matches"] else "")
    )
    table = Table(title="backends", title_justify="left")
    for col in ("backend", "available", "version", "devices", "why not / what to do"):
        table.add_column(col)
    for name, b in report["backends"].items():
        why = " — ".join(x for x in (b["reason"], b["hint"]) if x)
        table.add_row(
            name,
            "[green]yes[/]" if b["available"] else "[red]no[/]",
            b["version"] or "-",
            ", ".join(b["devices"]) or "-",
            why or "",
        )
    console.print(table)
    if report["candidates"]:
        order = Table(title=f"{report['profile']}: candidates in order", title_justify="left")
        for col in ("#", "candidate", "computes in", "runs here", "why not"):
            order.add_column(col)
        for i, c in enumerate(report["candidates"], 1):
            order.add_row(
                str(i),
                c["name"],
                c["computes_in"],
                "[green]yes[/]" if c["available"] else "[red]no[/]",
                escape(c["reason"]),
            )
        console.print(order)
    _print_video_decode(report["video_decode"])
    _print_latency_os(report["latency_os"])


def _print_video_decode(dec: dict[str, Any]) -> None:
    """GStreamer or not, the decoder each codec takes here, and what each hardware path needs."""
    console.print(f"[bold]Video decode[/] (profile decoder: {dec['profile_decoder']})")
    gst = dec["gstreamer"]
    console.print(
        "[dim]gstreamer [/]"
        + (
            f"[green]yes[/] {escape(gst['version'])} through PyGObject"
            if gst["available"]
            else f"[red]no[/] {escape(gst['reason'])} — {escape(gst['hint'])}"
        ),
        highlight=False,
    )
    for codec, c in dec["codecs"].items():
        console.print(
            f"[dim]{codec:<9}[/]{c['path']} ({c['element'] or 'no decoder'})"
            + (f" — {escape(c['note'])}" if c["note"] else ""),
            highlight=False,
        )
    for kind, how in dec["sources"].items():
        console.print(f"[dim]{kind}:[/] {escape(how)}", highlight=False)
    for path, need in dec["needs"].items():
        if path != "software":
            console.print(f"[dim]{path} needs:[/] {escape(need)}", highlight=False)


def _print_latency_os(lat: dict[str, Any]) -> None:
    """The short form of ``latency_os``: clock and idle policy in a line each, then the advice."""
    console.print("[bold]What the OS does to latency[/]")
    governors = sorted({f["governor"] or "-" for f in lat["cpufreq"]})
    console.print(
        "[dim]cpufreq  [/]"
        + escape(f"governor {', '.join(governors)}" if governors else lat["cpufreq_note"] or "-"),
        highlight=False,
    )
    idle = lat["cpuidle"]
    if idle:
        states = ", ".join(
            f"{s['name']} {s['latency_us']} µs" + (" (disabled)" if s["disabled"] else "")
            for s in idle["states"]
        )
        console.print(
            "[dim]cpuidle  [/]"
            + escape(f"{idle['driver'] or '-'}/{idle['governor'] or '-'}: {states or 'no states'}")
            + (" [yellow](CPUs differ)[/]" if idle["cpus_differ"] else ""),
            highlight=False,
        )
    else:
        console.print("[dim]cpuidle  [/]none", highlight=False)
    if lat["cmdline"]:
        flags = " ".join(f"{k}={v}" if v else k for k, v in lat["cmdline"].items())
        console.print("[dim]cmdline  [/]" + escape(flags), highlight=False)
    jetson = lat["jetson"]
    if jetson:
        console.print(
            "[dim]jetson   [/]"
            + escape(f"{jetson['nv_tegra_release'] or '-'}, power mode {jetson['power_mode'] or '?'}"),
            highlight=False,
        )
    for a in lat["advice"]:
        console.print(f"- {escape(a['finding'])}", highlight=False)
        if a["set"]:
            console.print(f"  [green]set:[/] {escape(a['set'])}", highlight=False)
        console.print(f"  [dim]why: {escape(a['why'])}[/]", highlight=False)
    if not lat["advice"]:
        console.print("nothing to set: clocks and idle states do not add to latency between frames")


@devices_app.command("list")
def devices_list(as_json: JsonOpt = False) -> None:
    """List the known device profiles."""
    from edgekit.device.profiles import all_profiles

    profiles = all_profiles()
    if as_json:
        _print_json([p.to_dict() for p in profiles.values()])
        return
    table = Table()
    for col in ("name", "aliases", "arch", "cpu", "budget", "first choice", "description"):
        table.add_column(col)
    for p in profiles.values():
        table.add_row(
            p.name,
            ", ".join(p.aliases),
            p.arch,
            p.cpu,
            f"{p.budget_ms:g} ms",
            p.candidates[0].key,
            p.description,
        )
    console.print(table)


@devices_app.command("show")
def devices_show(
    name: Annotated[str, typer.Argument(help="A profile name or alias (jetson, pi, coral).")],
    as_json: JsonOpt = False,
) -> None:
    """Show one device profile in full (aliases resolve)."""
    from edgekit.device.profiles import get_profile

    p = get_profile(name)
    data = p.to_dict()
    if as_json:
        _print_json(data)
        return
    console.print(
        f"[bold]{p.name}[/] — {p.description}" + (f"  (aliases: {', '.join(p.aliases)})" if p.aliases else "")
    )
    info = Table(show_header=False, box=None, pad_edge=False)
    for key in ("arch", "cpu", "budget_ms", "camera", "runtime_packages", "tvm_target", "match", "source"):
        value = data[key]
        info.add_row(f"[dim]{key}[/]", json.dumps(value) if isinstance(value, dict | list) else str(value))
    console.print(info)
    table = Table(title="candidates, in order", title_justify="left")
    for col in ("#", "name", "backend", "precision", "options"):
        table.add_column(col)
    for i, c in enumerate(data["candidates"], 1):
        table.add_row(str(i), c["name"], c["backend"], c["precision"], json.dumps(c["options"]))
    console.print(table)


register_all(app)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 usage error, 2 edgekit error)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        # Typer reports its own usage errors and always ends with SystemExit.  Hints name options.
        with command_line_hints():
            app(args=args, prog_name="edgekit")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except EdgekitError as err:
        if _state["debug"] or "--debug" in args:
            err_console.print_exception()
        # Messages carry user input (paths, hosts like [pi.local]:2222): never read them as markup.
        err_console.print(f"[bold red]error:[/] {escape(err.message)}", highlight=False)
        if err.hint:
            err_console.print(f"[yellow]hint:[/] {escape(err.hint)}", highlight=False)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
