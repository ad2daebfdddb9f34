"""How a bench report is shown: a terminal table, and a plot of each candidate's latencies against the budget.

Rows are ordered by what selection ranks by (``ranked_by``): the camera-rate p90 when the run
had one, else SingleStream's p90; a report from before the camera rate has only the latter.
"""

from __future__ import annotations

import html
import io
import math
from pathlib import Path
from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from edgekit.bench.loadgen import HEADLINE, label, min_queries
from edgekit.device.pacing import WARM_MAX_DUTY, WARM_MAX_PASSES
from edgekit.errors import EdgekitError


def _ms(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


#: The percentiles the terminal table shows (the JSON has every one in ``PERCENTILES``).
TABLE_PERCENTILES: tuple[float, ...] = (50.0, HEADLINE, 99.0)


def rank_ms(c: dict[str, Any]) -> float:
    """The number a candidate row is ranked by: its camera-rate p90 when measured, else SingleStream's."""
    paced = c.get("camera_rate")
    value = paced["p90_ms"] if paced and paced.get("p90_ms") is not None else c["summary"]["p90_ms"]
    return float(value)


def fps_of(report: dict[str, Any]) -> float:
    """The report's camera rate; 0 when it ran back to back only (or predates the camera rate)."""
    return float(report.get("camera_rate_fps") or 0.0)


def table(report: dict[str, Any]) -> Table:
    """The candidates that ran, fastest headline first (what could not run: ``not_run_lines``)."""
    rows = sorted((c for c in report["candidates"] if c["ok"]), key=rank_ms)
    fps = fps_of(report)
    t = Table(
        title=f"{report['model']} · SingleStream{f' and {fps:g} fps' if fps else ''} on {report['host']['cpu'] or report['host']['arch']}"
        f" ({report['host']['cores']} cores) · budget {report['budget_ms']:g} ms",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    t.add_column("candidate", overflow="fold", min_width=12)
    t.add_column("queries", justify="right", no_wrap=True)
    for q in TABLE_PERCENTILES:
        bold = q == HEADLINE
        t.add_column(
            label(q) + ("★" if bold and not fps else ""),
            justify="right",
            style="bold" if bold and not fps else None,
            no_wrap=True,
        )
    if fps:  # the camera-rate scenario beside it: what selection ranks by
        t.add_column(f"{fps:g}fps p50", justify="right", no_wrap=True)
        t.add_column("p90★", justify="right", style="bold", no_wrap=True)
        t.add_column("wake", justify="right", no_wrap=True)
        t.add_column("over", justify="right", no_wrap=True)
    detector = report.get("task") == "detection"
    for col in ("×best", "cold", "RSS", *(("decode",) if detector else ()), agreement_header(report)):
        t.add_column(col, justify="right", no_wrap=True)
    best = rank_ms(rows[0]) if rows else None
    one_count = len({c["threads"] for c in rows}) == 1  # then "-t2" on every row says nothing
    if one_count and rows:
        t.title = f"{t.title} · {rows[0]['threads']} threads"
    notes = []
    for c in rows:
        s = c["summary"]
        name = c["artifact"] if one_count else c["key"]
        if c.get("caveat"):
            notes.append(f"† {name}: {escape(c['caveat'])}")
        if c.get("kernels"):
            n = len(c["kernels"])
            notes.append(
                f"{name}: {n} layer{'s' * (n != 1)} on kernels edgekit chose over the runtime's (--json lists them)"
            )
        mark = (" ✓" if c["key"] == report.get("fastest") else "") + (" †" if c.get("caveat") else "")
        cells = [name + mark, str(s["count"])]
        for q in TABLE_PERCENTILES:
            v = _ms(s[f"{label(q)}_ms"])
            cells.append(f"[dim]{v}*[/]" if label(q) in s["underpowered"] else v)
        if fps:
            paced = c.get("camera_rate") or {}
            cells += [
                _ms(paced.get("p50_ms")),
                _ms(paced.get("p90_ms")),
                _signed(paced.get("wakeup_ms")),
                str(paced.get("overruns", "-")),
            ]
        cells += [
            f"{rank_ms(c) / best:.2f}" if best else "-",
            f"{c['cold_start_s']:.2f}s" if c["cold_start_s"] is not None else "-",
            f"{c['peak_rss_mb']:.0f}M" if c["peak_rss_mb"] is not None else "-",
            *((_ms((c.get("postprocess") or {}).get("p50_ms")),) if detector else ()),
            agreement_cell(c),
        ]
        t.add_row(*cells)
    if notes:  # below the table, wrapped to its width: a column would not fit in 80
        t.caption = "\n".join(notes)
        t.caption_justify = "left"
    return t


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2f}"


def _agreement(c: dict[str, Any]) -> float | None:
    """The candidate's agreement with fp32; a report from before detectors has only ``top1_agreement``."""
    value = c.get("agreement", c.get("top1_agreement"))
    return value if isinstance(value, int | float) else None


def agreement_header(report: dict[str, Any]) -> str:
    """The agreement column's name: ``boxes`` for a detector (detections matched), else ``top-1``."""
    return "boxes" if report.get("task") == "detection" else "top-1"


def agreement_cell(c: dict[str, Any]) -> str:
    """``97%``; a detector's extra detections (which fail its gate whatever the share) follow: ``100% +1``."""
    agree = _agreement(c)
    if agree is None:
        return "-"
    extra = (c.get("detection") or {}).get("extra", 0)
    return f"{agree:.0%}" + (f" +{extra}" if extra else "")


def legend(report: dict[str, Any]) -> str:
    """The legend under the table, its agreement column described for the report's task."""
    text = LEGEND if report.get("task") != "detection" else LEGEND.replace(_TOP1_LEGEND, _BOXES_LEGEND)
    fps = fps_of(report)
    if fps:
        text = text.replace("★ p90 is SingleStream's headline", _camera_legend(fps))
    return text


def _camera_legend(fps: float) -> str:
    return (
        f"{fps:g}fps: queries issued at the camera rate as the frame loop issues them (warm passes "
        f"just before each, as many as fit in {WARM_MAX_DUTY:.0%} of the period, at most {WARM_MAX_PASSES}); "
        "★ its p90 is what selection "
        "ranks by (×best too); wake: paced p50 with no warm pass − back-to-back p50; "
        "over: queries that ended after the next frame was due"
    )


def not_run_lines(report: dict[str, Any]) -> list[str]:
    """One rich-markup line per candidate that failed or could not run here, with the reason."""
    lines = [
        f"[red]✗ {c['key']}[/]: failed: {escape(c['error'] or '?')}"
        for c in report["candidates"]
        if not c["ok"]
    ]
    if report.get("int8"):
        lines.append(
            f"int8 on this CPU: {report['int8']['artifact'] or '-'} — {escape(report['int8']['why'])}"
        )
    lines += [
        f"[dim]– {s.get('artifact') or s['backend'] + '-' + s['precision']}: {escape(s['reason'])}[/]"
        for s in report["skipped"]
    ]
    return lines


_TOP1_LEGEND = "top-1: agreement with the fp32 reference on the bundle's evaluation frames"
_BOXES_LEGEND = (
    "decode: p50 ms of the postprocess stage per frame (decode, NMS, boxes to frame pixels; p90/p99 "
    "in --json), not in the query times; boxes: the fp32 reference's decisive detections on the "
    "bundle's evaluation frames that the candidate found (same class, IoU >= 0.5), +N: decisive "
    "detections fp32 does not have (any fails the gate)"
)
LEGEND = (
    "ms per query (mean, max, p95, p97, p99.9 in --json); ★ p90 is SingleStream's headline; * underpowered: fewer queries than LoadGen's "
    f"early-stopping rule needs for that percentile (p99: {min_queries(99.0)}); cold: process start → "
    f"first label; {_TOP1_LEGEND}; "
    "✓ fastest that passes the accuracy gate; † read with the caveat under the table"
)


def plot(report: dict[str, Any], out: Path) -> Path:
    """Draw each candidate's latency distribution against the budget to ``out`` (.png, .svg or .html)."""
    suffix = out.suffix.lower()
    if suffix not in (".png", ".svg", ".html"):
        raise EdgekitError(f"cannot write a plot as {out.name}", "name the file .png, .svg or .html")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise EdgekitError(
            "plotting needs matplotlib, which is not installed", 'pip install "edgekit[plot]"'
        ) from err
    rows = [c for c in report["candidates"] if c["ok"] and c.get("latencies_ms")]
    if not rows:
        raise EdgekitError("no candidate ran, so there is nothing to plot", "see the table for why")
    rows.sort(key=rank_ms)
    budget = report["budget_ms"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 2), 4.8), dpi=110)
    data = [c["latencies_ms"] for c in rows]
    parts = ax.violinplot(data, showextrema=False, widths=0.8)
    for body in parts["bodies"]:  # type: ignore[attr-defined]
        body.set_alpha(0.45)
    ax.boxplot(data, widths=0.18, showfliers=False, medianprops={"color": "black"})
    for i, c in enumerate(rows, start=1):
        p90 = c["summary"]["p90_ms"]
        ax.plot([i - 0.3, i + 0.3], [p90, p90], color="tab:blue", lw=2)
        ax.annotate(f"p90 {p90:.1f}", (i + 0.32, p90), fontsize=7, va="center")
        paced = (c.get("camera_rate") or {}).get("p90_ms")
        if paced is not None:  # the camera-rate p90 beside it: the wake-up cost shows as the gap
            ax.plot([i - 0.3, i + 0.3], [paced, paced], color="tab:orange", lw=2, ls=":")
    ax.axhline(budget, color="tab:red", ls="--", lw=1.2, label=f"budget {budget:g} ms")
    ax.set_yscale("log")
    from matplotlib.ticker import ScalarFormatter

    for axis_formatter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        fmt = ScalarFormatter()
        fmt.set_scientific(False)
        axis_formatter(fmt)
    ax.set_xticks(range(1, len(rows) + 1), [c["key"] for c in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("query latency (ms, log scale)")
    ax.set_title(
        f"{report['model']}: SingleStream latency per candidate ({report['host']['arch']})", fontsize=10
    )
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".html":
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
        out.write_text(_page(report, buf.getvalue()), encoding="utf-8")
    else:
        fig.savefig(out)
    plt.close(fig)
    return out


def _page(report: dict[str, Any], svg: str) -> str:
    detector = report.get("task") == "detection"
    fps = fps_of(report)
    head = ["candidate", "queries", "p50", "p90", "p99"]
    if fps:
        head += [f"{fps:g} fps p50", f"{fps:g} fps p90", f"{fps:g} fps p99", "wake-up ms", "overruns"]
    head += ["cold start s", "peak RSS MB"]
    head += ["decode+NMS p50", "decode+NMS p99", "detections vs fp32"] if detector else ["top-1 vs fp32"]
    body, caveats = [], []
    for c in sorted((c for c in report["candidates"] if c["ok"]), key=rank_ms):
        s = c["summary"]
        cells = [
            c["key"] + (" †" if c.get("caveat") else ""),
            s["count"],
            _ms(s["p50_ms"]),
            _ms(s["p90_ms"]),
            _ms(s["p99_ms"]) + ("" if s["p99_valid"] else "*"),
        ]
        if fps:
            paced = c.get("camera_rate") or {}
            cells += [_ms(paced.get(f"{q}_ms")) for q in ("p50", "p90", "p99")]
            cells += [_signed(paced.get("wakeup_ms")), paced.get("overruns", "-")]
        cells += [c["cold_start_s"], c["peak_rss_mb"]]
        if detector:
            post = c.get("postprocess") or {}
            cells += [_ms(post.get("p50_ms")), _ms(post.get("p99_ms"))]
        cells.append(agreement_cell(c))
        body.append("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in cells) + "</tr>")
        if c.get("caveat"):
            caveats.append(f"<p>† {html.escape(c['key'])}: {html.escape(c['caveat'])}</p>")
    return (
        "<!doctype html><meta charset=utf-8><title>edgekit bench</title>"
        "<style>body{font:14px system-ui;margin:2em}td,th{padding:2px 10px;text-align:right}"
        "td:first-child{text-align:left}</style>"
        f"<h1>{html.escape(report['model'])} on {html.escape(str(report['host']['cpu']))}</h1>"
        f"<p>{html.escape(report['started'])} · budget {report['budget_ms']:g} ms · SingleStream"
        + (f" and paced at {fps:g} fps (ranked by its p90)" if fps else "")
        + "</p>"
        + svg
        + "<table><tr>"
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr>"
        + "".join(body)
        + "</table>"
        + "".join(caveats)
        + "<p>* fewer than 662 queries: LoadGen would not report this p99.</p>"
    )
