"""``edgekit select BUNDLE``: the candidate choice kept for a bundle on this host; measure it again or drop it.

The first load of a bundle here measures its candidates and keeps the ranking in the state
folder (``edgekit.selection.choice_cache``); this command shows what was measured, what was
ranked from the build's figures instead, when, and how busy the host was.  ``--measure``
measures again now (the next runs use it); ``--forget`` drops the kept choice (the next
load measures).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from edgekit.commands.common import JsonOpt, console, err_console, print_json


def register(app: typer.Typer) -> None:
    app.command("select")(select_command)


@contextlib.contextmanager
def _bundle_folder(bundle: Path) -> Iterator[Path]:
    """The bundle as a folder: itself, or a .tar.gz unpacked for the length of the block."""
    if bundle.is_dir():
        yield bundle
        return
    from edgekit.bundle import unpack

    tmp = Path(tempfile.mkdtemp(prefix="edgekit-select-"))
    try:
        yield unpack(bundle, tmp / "bundle")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def kept_choice(folder: Path, profile_name: str) -> dict[str, Any] | None:
    """The kept choice of the bundle in ``folder`` as plain data (None: none kept, or none to trust)."""
    from edgekit.selection.choice_cache import host_fingerprint, manifest_sha256, read_record

    record = read_record(manifest_sha256(folder))
    if record is None:
        return None
    out = record.to_dict()
    del out["format"], out["bundle_sha256"]
    runtimes = out["host"].get("runtimes")
    here = host_fingerprint(profile_name, runtimes if isinstance(runtimes, dict) else ())
    differs = sorted(k for k in set(here) | set(record.host) if here.get(k) != record.host.get(k))
    out["chosen"] = record.chosen
    out["host_matches"] = not differs
    out["host_differs"] = differs
    out["next_load"] = (
        "measures again: " + ("this host differs" if differs else "stale" if record.stale else "provisional")
        if differs or record.stale or record.provisional
        else "uses it"
    )
    return out


def select_command(
    bundle: Annotated[Path, typer.Argument(help="A bundle directory or .tar.gz (edgekit build).")],
    measure: Annotated[
        bool, typer.Option("--measure", help="Measure the candidates again now and keep the result.")
    ] = False,
    forget: Annotated[
        bool, typer.Option("--forget", help="Drop the kept choice: the next load measures again.")
    ] = False,
    device: Annotated[
        str, typer.Option("--device", "-d", help="Device profile, or auto to detect this host.")
    ] = "auto",
    key: Annotated[
        list[Path] | None,
        typer.Option("--key", help="Trusted public key (repeat), for --measure (default: the trust store)."),
    ] = None,
    allow_unsigned: Annotated[
        bool,
        typer.Option("--allow-unsigned", help="With --measure: load a bundle not signed by a trusted key."),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Show the candidate choice kept for a bundle on this host: what was measured, what was ranked
    from the build's figures, when, how busy the host was; --measure measures again now, --forget drops it."""
    from edgekit.bundle import read_manifest
    from edgekit.device.host import match_profile
    from edgekit.device.profiles import get_profile
    from edgekit.selection.choice_cache import forget as drop
    from edgekit.selection.choice_cache import manifest_sha256

    with _bundle_folder(bundle) as folder:
        manifest = read_manifest(folder)
        profile = match_profile() if device == "auto" else get_profile(device)
        sha = manifest_sha256(folder)
        report: dict[str, Any] = {
            "bundle": str(bundle),
            "bundle_sha256": sha,
            "profile": profile.name,
            "bundle_selection": manifest.selection is not None,
        }
        if forget or measure:
            report["forgot"] = drop(sha)
        if measure:
            report["measured_now"] = _measure(folder, profile.name, key, allow_unsigned)
        report["kept"] = kept_choice(folder, profile.name)
    if as_json:
        print_json(report)
        return
    _print(report)


def _measure(folder: Path, device: str, keys: list[Path] | None, allow_unsigned: bool) -> Any:
    import edgekit
    from edgekit.selection.candidate_timing import MeasureLimits

    def progress(line: str) -> None:
        err_console.print(line, highlight=False, markup=False)

    with edgekit.load(
        folder,
        device=device,
        trusted_keys=keys,
        allow_unsigned=allow_unsigned,
        measure=MeasureLimits(),
        progress=progress,
    ) as model:
        return model.selection.to_dict()


def _print(report: dict[str, Any]) -> None:
    def say(line: str) -> None:
        console.print(line, highlight=False, markup=False, soft_wrap=True)

    say(f"{report['bundle']} on profile {report['profile']}")
    if report.get("forgot"):
        say("dropped the kept choice")
    if report["bundle_selection"]:
        say("the bundle carries its own selection (edgekit bench --write-selection): it wins where it fits")
    kept = report["kept"]
    if kept is None:
        say("no choice kept here: the next load measures the candidates")
        return
    say(f"chosen: {kept['chosen']} at {kept['fps']:.3g} fps, measured {kept['measured_at']}")
    for name, p90 in sorted(kept["p90_ms"].items(), key=lambda kv: kv[1]):
        p50 = kept["p50_ms"].get(name)
        say(f"  measured  {name}: p90 {p90:.2f} ms" + (f", p50 {p50:.2f} ms" if p50 is not None else ""))
    for name, est in sorted(kept["estimated_ms"].items(), key=lambda kv: kv[1]):
        say(f"  not timed {name}: ~{est:.2f} ms from the build's figures")
    load = kept["load_per_core"]
    say("host load: " + (f"{load:.2f} per core" if load is not None else "unknown"))
    if kept["busy"]:
        say(f"busy: {kept['busy']} (measurement {kept['attempt']})")
    if kept["stale"]:
        say(f"stale: {kept['stale']}")
    if kept["host_differs"]:
        say(f"measured with another {', '.join(kept['host_differs'])}")
    say(f"next load: {kept['next_load']}")
