"""``edgekit keys generate``, ``edgekit verify BUNDLE`` and ``edgekit inspect BUNDLE``.

The bundle code (pydantic, cryptography) is imported inside each command, so ``edgekit
--help`` and the other commands work on a device that has neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from edgekit.commands.common import JsonOpt, console, err_console, print_json

if TYPE_CHECKING:
    from edgekit.bundle import Manifest, VerifyReport
    from edgekit.bundle.manifest import Accuracy

keys_app = typer.Typer(help="Signing keys for bundles (Ed25519).", no_args_is_help=True)

BundleArg = Annotated[Path, typer.Argument(help="A bundle folder or .tar.gz written by edgekit build.")]

_STATUS = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]"}
#: The artifact notes ``edgekit inspect`` prints under the table (all of them are in --json):
#: a TVM library's schedules tuned on another CPU, or functions left untuned.
NOTE_KEYS = ("schedules", "untuned_functions")


@keys_app.command("generate")
def keys_generate(
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Path stem: writes STEM.pem (private, 0600) and STEM.pub.pem. "
            "Default: ~/.config/edgekit/keys/edgekit (outside any project, so it is never committed).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Make an Ed25519 key pair: sign bundles with the .pem, give devices the .pub.pem."""
    from edgekit.bundle import default_key_stem, generate_keypair, key_id, load_public_key

    private, public = generate_keypair(out or default_key_stem())
    kid = key_id(load_public_key(public))
    if as_json:
        print_json({"private_key": str(private), "public_key": str(public), "key_id": kid})
        return
    console.print(f"key [bold]{kid}[/]", highlight=False)
    console.print(
        f"  private: {private}  (keep it secret; sign with: edgekit build ... --sign-key {private})",
        highlight=False,
    )
    console.print(
        f"  public:  {public}  (give it to devices; check with: edgekit verify BUNDLE --key {public})",
        highlight=False,
    )


def verify_command(
    bundle: BundleArg,
    key: Annotated[
        list[Path] | None,
        typer.Option("--key", "-k", help="A trusted public key (.pub.pem); repeat for several."),
    ] = None,
    require_signature: Annotated[
        bool,
        typer.Option("--require-signature", help="Fail unless a trusted key's valid signature is there."),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Check a bundle: manifest, every file's SHA-256 and size, no missing or extra file, signature."""
    from edgekit.bundle import verify

    report = verify(bundle, key or (), require_signature=require_signature)
    if as_json:
        print_json(report.to_dict())
    else:
        _print_report(report)
    report.raise_if_failed()  # prints error: and exits 2 through the CLI's one error boundary


def _print_report(report: VerifyReport) -> None:
    table = Table(title=f"verify {report.bundle}", title_justify="left")
    for col in ("check", "result", "detail"):
        table.add_column(col, overflow="fold")
    for c in report.checks:
        table.add_row(c.name, _STATUS[c.status], c.detail)
    console.print(table)
    if report.ok:
        sig = {
            "verified": f"signed by trusted key {report.key_id}",
            "unchecked": f"signed by key {report.key_id}, signature NOT checked (pass --key)",
            "unsigned": "unsigned",
        }.get(report.signature or "", report.signature or "")
        console.print(f"[green]ok[/]: every file matches the manifest; {sig}", highlight=False)


def inspect_command(bundle: BundleArg, as_json: JsonOpt = False) -> None:
    """Show what a bundle holds: model, device, artifacts (size, latency, accuracy), signer. Checks nothing."""
    from edgekit.bundle import SIGNATURE_FILE, open_bundle, read_manifest

    with open_bundle(bundle) as folder:
        manifest = read_manifest(folder)
        has_sig = (folder / SIGNATURE_FILE).is_file()
    signature = {
        "signed": manifest.signature is not None,
        "key_id": manifest.signature.key_id if manifest.signature else None,
        "signature_file": has_sig,
        "checked": False,
    }
    if as_json:
        print_json(
            {"bundle": str(bundle), "manifest": manifest.model_dump(mode="json"), "signature": signature}
        )
        return
    _print_manifest(bundle, manifest, signature)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def _print_manifest(bundle: Path, m: Manifest, signature: dict[str, Any]) -> None:
    console.print(f"[bold]{m.model.name}[/] {m.model.version} — {m.model.description}", highlight=False)
    info = Table(show_header=False, box=None, pad_edge=False)
    b = m.build
    rows = [
        ("bundle", str(bundle)),
        ("license", f"{m.model.license}" + (f" ({m.model.attribution})" if m.model.attribution else "")),
        ("source sha256", m.model.source_sha256),
        ("device", f"{m.device.profile} ({m.device.arch}), budget {m.device.budget_ms:g} ms"),
        (
            "preprocess",
            f"{m.preprocess.size[0]}x{m.preprocess.size[1]} {m.preprocess.color} {m.preprocess.layout}, "
            f"{m.preprocess.resize}, mean {list(m.preprocess.mean)}, std {list(m.preprocess.std)}",
        ),
        ("labels", f"{len(m.labels)}" + (f" ({', '.join(m.labels[:3])}, ...)" if m.labels else "")),
        *(
            [
                (
                    "detection",
                    f"{m.detection.decoder} decoder, {m.detection.num_classes} class(es), score >= "
                    f"{m.detection.score_threshold:g}, NMS {m.detection.nms} at IoU {m.detection.iou_threshold:g}, "
                    f"at most {m.detection.max_detections}",
                )
            ]
            if m.detection is not None
            else []
        ),
        ("built", f"{b.created.isoformat()} on {b.host.arch} ({b.host.cpu or '?'}) by edgekit {b.edgekit}"),
        ("serial", f"{b.serial}" if b.serial else "0 (none: built before serials)"),
        (
            "accuracy rule",
            (
                f"decisive fp32 detections matched >= {b.accuracy_threshold:.0%}, no extra"
                if m.detection is not None
                else f"top-1 agreement >= {b.accuracy_threshold:.0%}"
            )
            + (", drop allowed" if b.allow_accuracy_drop else ""),
        ),
        (
            "signature",
            f"key {signature['key_id']} (not checked here: edgekit verify BUNDLE --key KEY.pub.pem)"
            if signature["signed"]
            else "unsigned",
        ),
    ]
    for k, v in rows:
        info.add_row(f"[dim]{k}[/]", v)
    console.print(info, highlight=False)
    table = Table(title="artifacts (latency measured on the build host)", title_justify="left")
    table.add_column("name", no_wrap=True)
    detector = m.detection is not None
    gate_columns = (
        ("matched", "mean IoU", "missed", "extra") if detector else ("top-1 agree", "max |Δ logit|")
    )
    for col in ("arch", "size", "p50/p99 ms", *gate_columns, "gate"):
        table.add_column(col)
    for a in m.artifacts:
        acc = a.accuracy
        gate = "-"
        if acc is not None:
            gate = (
                "[green]pass[/]"
                if acc.passed
                else "[yellow]drop allowed[/]"
                if acc.allowed_drop
                else "[red]fail[/]"
            )
            gate += " (smoke)" if acc.smoke_set else ""
        table.add_row(
            a.name,
            a.arch,
            _size(a.size),
            f"{a.latency.p50_ms:.2f} / {a.latency.p99_ms:.2f}" if a.latency else "-",
            *(_detection_cells(acc) if detector else _top1_cells(acc)),
            gate,
        )
    console.print(table)
    from rich.markup import escape

    for a in m.artifacts:  # what the build says about an artifact's speed (TVM: whose schedules)
        for key in NOTE_KEYS:
            if a.notes.get(key):
                console.print(f"[yellow]{a.name}[/]: {escape(str(a.notes[key]))}", highlight=False)
    _print_precision_choice(m)
    sel = m.selection
    if sel is not None:
        ranked = ", ".join(f"{c.artifact} t{c.threads} {c.p90_ms:.2f}" for c in sel.candidates[:4])
        console.print(
            f"selected by measurement: [bold]{sel.chosen}[/] with {sel.threads} threads on {sel.host.cpu or sel.host.arch} "
            f"({sel.profile}, {sel.measured:%Y-%m-%d}; p90 ms: {ranked})",
            highlight=False,
        )
    if any(a.accuracy and a.accuracy.smoke_set for a in m.artifacts):
        err_console.print("[dim]smoke set: a sanity check on a few built-in images, not an accuracy claim[/]")


def _top1_cells(acc: Accuracy | None) -> tuple[str, str]:
    if acc is None:
        return "-", "-"
    return f"{acc.top1_agreement:.1%}", f"{acc.max_abs_logit_diff:.3f}"


def _detection_cells(acc: Accuracy | None) -> tuple[str, str, str, str]:
    det = acc.detection if acc is not None else None
    if acc is None or det is None:
        return "-", "-", "-", "-"
    return (
        f"{det.matched}/{det.decisive_detections} ({acc.top1_agreement:.1%})",
        f"{det.mean_iou:.3f}",
        str(det.missed),
        str(det.extra),
    )


def register(app: typer.Typer) -> None:
    """Add ``keys``, ``verify`` and ``inspect`` to ``app``."""
    app.add_typer(keys_app, name="keys")
    app.command("verify")(verify_command)
    app.command("inspect")(inspect_command)


def _print_precision_choice(m: Manifest) -> None:
    """Which artifacts need what of a CPU, and which int8 recipe this machine's CPU takes."""
    from rich.markup import escape

    from edgekit.core.cpu import this_cpu
    from edgekit.selection.precision import int8_choice

    cpu = this_cpu()
    for a in m.artifacts:
        if a.requires:
            have = all(cpu.has(c) for c in a.requires)
            console.print(
                f"[cyan]{a.name}[/]: for CPUs with {', '.join(a.requires)} "
                f"(this one: {'yes' if have else 'no'}, {escape('; '.join(cpu.why(c) for c in a.requires))})",
                highlight=False,
            )
    choice = int8_choice(m, cpu)
    if choice is not None:
        console.print(
            f"int8 on this CPU: [bold]{choice['artifact'] or '-'}[/] — {escape(choice['why'])}",
            highlight=False,
        )
