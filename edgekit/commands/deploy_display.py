"""What ``edgekit deploy`` shows: a deploy's steps and the device's verdict, a fleet rollout's events.

``DeployDisplay`` (SSH: a live list of steps, plain lines or JSON lines) and ``print_outcome``
(the verdict and the health gate's numbers); ``FleetDisplay`` (the rollout's events as
lines, or JSON lines).  The device's words are data: printed, never read as markup.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.table import Table

from edgekit.commands.common import console, err_console


class DeployDisplay:
    """Progress of a deploy: a live list of steps (terminal), plain lines (pipe) or JSON lines (``--json``)."""

    def __init__(self, as_json: bool, title: str) -> None:
        self.as_json = as_json
        self.title = title
        self.live = not as_json and err_console.is_terminal
        self._bar: Any = None
        self._tasks: dict[str, Any] = {}  # step -> rich task id, in the order the steps came
        self._done: set[str] = set()

    def __enter__(self) -> DeployDisplay:
        if self.live:
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

            self._bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[size]}"),
                console=err_console,
                transient=False,
            )
            self._bar.__enter__()
        elif not self.as_json:
            err_console.print(self.title, highlight=False, markup=False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def __call__(self, step: str, info: dict[str, Any]) -> None:
        copying = step == "copy"
        last_chunk = copying and info.get("bytes") == info.get("total")
        if self.as_json:
            if not copying or last_chunk:  # one line per step, not one per chunk copied
                sys.stdout.write(json.dumps({"step": step, **info}, default=str) + "\n")
                sys.stdout.flush()
            return
        new = step not in self._tasks
        if new:
            self._mark_done()
        if self._bar is None:
            if new or last_chunk:
                self._tasks.setdefault(step, None)
            if copying and last_chunk:
                err_console.print(f"  copy {_mb(info.get('total'))}", highlight=False, markup=False)
            elif new and not copying:
                # The device's temp path of the archive is noise to a person; the rest is short.
                shown = {k: v for k, v in info.items() if k != "bundle" or step == "pack"}
                detail = " ".join(f"{k}={v}" for k, v in shown.items() if isinstance(v, str | int | float))
                err_console.print(f"  {step} {detail}".rstrip(), highlight=False, markup=False)
            return
        if new:
            self._tasks[step] = self._bar.add_task(
                f"{step} …", total=info.get("total") if copying else None, size=""
            )
        if copying:
            size = f"{_mb(info.get('bytes'))} of {_mb(info.get('total'))}"
            self._bar.update(self._tasks[step], completed=info.get("bytes", 0), size=size)

    def _mark_done(self, failed: str | None = None) -> None:
        if self._bar is None:
            return
        for step, task in self._tasks.items():
            if step == failed:
                self._bar.update(task, total=1, completed=0, description=f"{step} [red]✗[/]")
            elif step not in self._done:
                self._done.add(step)
                self._bar.update(task, total=1, completed=1, description=f"{step} [green]✓[/]")

    def finish(self, result: dict[str, Any]) -> None:
        """Mark every step done, or the failed one failed."""
        failed = None if result.get("ok") else str(result.get("step"))
        if failed and failed not in self._tasks and self._bar is not None:
            self._tasks[failed] = self._bar.add_task(failed, total=1, size="")
        self._mark_done(failed)


def _mb(n: Any) -> str:
    return f"{n / 1e6:.1f} MB" if isinstance(n, int | float) else "?"


def print_outcome(outcome: Any, as_json: bool, what: str) -> None:
    """The final word: a JSON line, or the verdict and the health gate's numbers."""
    from rich.markup import escape

    if as_json:
        sys.stdout.write(json.dumps(outcome.to_dict(), default=str) + "\n")
        return
    r = outcome.result
    if outcome.ok:
        replayed = " (already done: this deploy id's recorded outcome)" if r.get("replayed") else ""
        console.print(
            f"[green]✓[/] {what} {escape(outcome.deploy_id)} on {escape(outcome.host)}: "
            f"{escape(str(r.get('version') or ''))} active in slot {escape(str(r.get('slot') or '?'))}"
            f"{replayed} ({outcome.seconds:.1f} s)",
            highlight=False,
        )
    _health_table(r.get("health") or {})
    if not outcome.ok:
        # The device's words are data: printed, never read as markup.
        err_console.print(
            f"[bold red]{what} refused[/] at step [bold]{escape(str(r.get('step') or '?'))}[/]: "
            f"{escape(str(r.get('reason') or 'no reason given'))}",
            highlight=False,
        )
        if r.get("hint"):
            err_console.print(f"[yellow]hint:[/] {escape(str(r['hint']))}", highlight=False)
        err_console.print(f"the device keeps running what it ran before this {what}", highlight=False)


def _health_table(health: dict[str, Any]) -> None:
    if not health:
        return
    table = Table(title="health gate on the device", title_justify="left")
    # A detector's report carries its gate's numbers: boxes matched, not a top-1 it does not have.
    det = health.get("detection") if isinstance(health.get("detection"), dict) else None
    agreement = ("boxes", "missed", "extra", "IoU") if det else ("top-1 agreement",)
    for col in ("backend", "p50 ms", "p99 ms", "budget ms", *agreement, "frames"):
        table.add_column(col)
    agree = health.get("top1_agreement")
    if det is not None:
        cells = [_detections_matched(det), _count(det.get("missed")), _count(det.get("extra"))]
        cells.append(_num(det.get("mean_iou")))
    else:
        cells = [f"{agree:.0%}" if isinstance(agree, int | float) else "-"]
    table.add_row(
        "-".join(str(health[k]) for k in ("backend", "precision") if health.get(k)) or "-",
        _num(health.get("p50_ms")),
        _num(health.get("p99_ms")),
        _num(health.get("budget_ms")),
        *cells,
        str(health.get("frames", "-")),
    )
    console.print(table)


def agreement_text(health: dict[str, Any]) -> str:
    """What the health gate found, in words: a detector's boxes matched, or a classifier's top-1 agreement."""
    det = health.get("detection") if isinstance(health.get("detection"), dict) else None
    if det is not None:
        return (
            f"boxes {_detections_matched(det)} matched, {_count(det.get('missed'))} missed, "
            f"{_count(det.get('extra'))} extra, IoU {_num(det.get('mean_iou'))}"
        )
    agree = health.get("top1_agreement")
    return f"top-1 agreement {f'{agree:.0%}' if isinstance(agree, int | float) else '-'}"


def _count(value: Any) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else "-"


def _detections_matched(det: dict[str, Any]) -> str:
    """``5/6``: decisive reference detections the device's artifact found, of those there are."""
    matched, decisive = det.get("matched"), det.get("decisive")
    if not (isinstance(matched, int) and isinstance(decisive, int)):
        return "-"
    return f"{matched}/{decisive}"


def _num(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) else "-"


class _Blank(dict[str, Any]):
    """``format_map`` values where a missing key reads as ``-``."""

    def __missing__(self, key: str) -> str:
        return "-"


# A wave rollout's events (edgekit.deploy.waves), one line each.
WAVE_LINES = {
    "plan": "rollout {id}: {members} devices in waves of {waves}",
    "resume": "rollout {id}: continuing at wave {wave} ({sent} sent, {results} results kept)",
    "wave": "wave {wave}/{of}: {devices} devices",
    "sent": "  sent {devices} (in all {total})",
    "gate": "  gate of wave {wave}: p95 {p95_ms} ms (limit {limit_ms}) over {frames} frames of "
    "{updated} devices, misses {miss_rate}: {verdict}",
    "control": "operator: {action} {reason}",
    "paused": "paused in wave {wave}: waiting for resume or abort",
    "resumed": "resumed in wave {wave}",
    "rollback": "rolling back {devices} devices ({id})",
    "done": "rollout: {status} {reason}",
    "warning": "warning: {text}",
}


class FleetDisplay:
    """A fleet rollout's events as plain lines on stderr, or JSON lines on stdout (``--json``)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self._steps: dict[str, str] = {}  # device -> the last step shown

    def _say(self, text: str) -> None:
        err_console.print(text, highlight=False, markup=False)

    def __call__(self, kind: str, info: dict[str, Any]) -> None:
        if self.as_json:
            sys.stdout.write(json.dumps({"event": kind, **info}, default=str) + "\n")
            sys.stdout.flush()
            return
        if kind == "artifact":
            self._say(
                f"artifact {info['name']} ({_mb(info['size'])}, sha256 {info['sha256'][:12]}) at {info['url']}"
            )
            if info.get("warning"):
                self._say(f"  warning: {info['warning']}")
        elif kind == "members":
            skipped = "; ".join(f"{d}: {why}" for d, why in info["skipped"].items())
            self._say(
                f"devices: {', '.join(info['members']) or 'none'}"
                + (f" (left out: {skipped})" if skipped else "")
            )
        elif kind == "send":
            self._say(f"{info['phase']}: {info['action']} {info['id']} -> {info['device']}")
        elif kind == "progress":
            device, step = str(info.get("device")), str(info.get("step"))
            if self._steps.get(device) != step:
                self._steps[device] = step
                self._say(f"  {device}: {step}")
        elif kind == "result":
            mark = "ok" if info.get("ok") else f"FAILED at {info.get('step')}: {info.get('reason')}"
            replayed = " (recorded outcome of this id)" if info.get("replayed") else ""
            self._say(f"  {info['device']} {info['phase']}: {mark}{replayed}")
        elif kind == "watch":
            limit = f"p95 <= {info['slo_p95_ms']:g} ms" if info.get("slo_p95_ms") else "p95 <= the budget"
            self._say(
                f"watching {', '.join(info['devices'])} for {info['window_s']:g} s ({limit}, misses <= 1%)"
            )
        elif kind == "verdict":
            for device, h in info["health"].items():
                p95 = "-" if h.get("p95_ms") is None else f"{h['p95_ms']:.2f} ms"
                verdict = f"BREACH: {h['breach']}" if h.get("breach") else "held"
                self._say(
                    f"  {device}: p95 {p95} over {h.get('frames', 0)} frames, {h.get('missed', 0)} missed: {verdict}"
                )
        elif kind in WAVE_LINES:
            self._say(WAVE_LINES[kind].format_map(_Blank(info)))

    def finish(self, report: dict[str, Any]) -> None:
        """The last word: the report as one JSON line, or the outcome."""
        if self.as_json:
            sys.stdout.write(json.dumps(report, default=str) + "\n")
            return
        outcome = report["outcome"]
        if report["ok"]:
            console.print(
                f"[green]✓[/] {report['action']} {report['id']}: {len(report['results'])} device(s) done",
                highlight=False,
            )
        else:
            from rich.markup import escape

            err_console.print(
                f"[bold red]{report['action']} {escape(outcome)}[/]: {escape(report['reason'])}",
                highlight=False,
            )
            if report.get("rolled_back"):
                err_console.print(
                    f"rolled back: {', '.join(report['rolled_back'])}; not sent to: {', '.join(report['rest']) or 'nobody'}",
                    highlight=False,
                )
