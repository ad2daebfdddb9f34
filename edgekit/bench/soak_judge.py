"""A soak's verdict: how each resource moved after the warm-up, against stated bounds, and the frames lost.

``slope_per_hour`` fits a least-squares line through the windows after the warm-up (a
leak is a trend; one window's noise is not).  ``judge`` compares the later half of the
windows after the warm-up with the earlier half, peak with peak (``Bounds``: how much RSS,
Python heap, fds and threads may grow): a camera caught reconnecting holds one socket and
one thread fewer, and a window caught before a garbage collection more objects, so one
window against another would flag noise; a leak raises every later peak.  Then, where given, where given, the process after the soak with the process before it (everything
the run opened is closed again).  ``frames_lost`` is a camera's account: frames it should
have sent (its rate times the time it was up, outside its counted outages) against the
frames captured.  ``report`` puts it all in one JSON-ready document; ``render`` in a table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from edgekit.bench.soak import CameraTrack, Window
from edgekit.core.resources import Resources

MIB = 1024 * 1024
#: What is followed in each window, and how each is shown (bytes as MiB).
MEASURES = ("rss_bytes", "heap_bytes", "blocks", "fds", "threads", "tasks")


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float | None:
    """The least-squares slope of ``(seconds, value)`` points, per hour; None under two distinct times."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    if sxx == 0:
        return None
    sxy = sum((t - mx) * (v - my) for t, v in points)
    return sxy / sxx * 3600.0


def after_warmup(windows: Sequence[Window], warmup_s: float) -> list[Window]:
    """The windows that start after ``warmup_s`` (at least the last one, when there are any)."""
    kept = [w for w in windows if w.start_s >= warmup_s]
    return kept or list(windows[-1:])


def slopes(windows: Sequence[Window]) -> dict[str, float | None]:
    """Each measure's slope per hour over ``windows`` (bytes per hour for the memory ones)."""
    out: dict[str, float | None] = {}
    for m in MEASURES:
        pts = [(w.end_s, float(v)) for w in windows if (v := getattr(w.resources, m)) is not None]
        out[m] = slope_per_hour(pts)
    return out


@dataclass(frozen=True)
class Bounds:
    """How much each resource may grow from the first window after the warm-up to the last."""

    rss_mib: float
    heap_mib: float  # with tracemalloc on
    blocks: int  # Python's allocated blocks (objects)
    fds: int
    threads: int  # Python threads and OS tasks alike


def _growth(first: Resources, last: Resources) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for m in MEASURES:
        a, b = getattr(first, m), getattr(last, m)
        out[m] = None if a is None or b is None else float(b - a)
    return out


def _peak_growth(windows: Sequence[Window]) -> dict[str, float | None]:
    """Each measure's peak over the later half of ``windows`` less its peak over the earlier half."""
    half = max(1, len(windows) // 2)
    early, late = windows[:half], windows[half:] or windows[-1:]
    out: dict[str, float | None] = {}
    for m in MEASURES:
        a = [v for w in early if (v := getattr(w.resources, m)) is not None]
        b = [v for w in late if (v := getattr(w.resources, m)) is not None]
        out[m] = float(max(b) - max(a)) if a and b else None
    return out


def judge(
    windows: Sequence[Window],
    warmup_s: float,
    bounds: Bounds,
    before: Resources | None = None,
    after: Resources | None = None,
) -> list[str]:
    """What grew past ``bounds`` (empty: nothing did), each a sentence with the numbers."""
    kept = after_warmup(windows, warmup_s)
    if not kept:
        return ["no windows were recorded"]
    problems: list[str] = []
    grew = _peak_growth(kept)
    for m, limit, unit, scale in (
        ("rss_bytes", bounds.rss_mib, "MiB", MIB),
        ("heap_bytes", bounds.heap_mib, "MiB", MIB),
        ("blocks", bounds.blocks, "", 1),
        ("fds", bounds.fds, "", 1),
        ("threads", bounds.threads, "", 1),
        ("tasks", bounds.threads, "", 1),
    ):
        g = grew[m]
        if g is not None and g / scale > limit:
            problems.append(
                f"{m.removesuffix('_bytes')} grew {g / scale:.{1 if unit else 0}f}{unit} after the warm-up "
                f"(bound {limit:g}{unit}; later peak against earlier, {kept[0].start_s:.0f}-{kept[-1].end_s:.0f} s)"
            )
    if before is not None and after is not None:
        left = _growth(before, after)
        # Not tasks: a runtime's native thread pool starts on first use and stays, by design.
        for m in ("fds", "threads"):
            g = left[m]
            if g is not None and g > 0:
                problems.append(f"{m}: {g:.0f} more after the soak than before it (left open)")
    return problems


#: A camera's capture count may run this share over its rate (clock drift, jitter) ...
INDEX_SLACK = 0.01
#: ... and this many frames a reopen (the backlog read in a burst: a jitter buffer's worth).
BACKLOG_FRAMES = 30


def frames_lost(track: CameraTrack, fps: float | None) -> dict[str, Any]:
    """A camera's account at ``fps``: frames captured, counted outages, and frames lost outside them.

    ``lost`` is the recorder's count between frames (``CameraTrack.lost``): 0 when the camera's
    every frame outside its counted outages was captured (labelled or dropped by the slot).
    ``lost_at_edges``: frames short in the last interval before an outage (a frame late as the
    camera went away, or lost with it), not judged.  ``expected`` is the clock's count, one frame
    a period from its first frame to its last less each counted outage's time without frames; against ``captured`` it checks the rate,
    and a backlog read in a burst after a reopen shows as more captured than expected.
    """
    d: dict[str, Any] = {
        "captured": track.captured,
        "span_s": round(track.span_s, 3),
        "outage_gaps": track.gaps,
        "outage_s": round(track.gap_s, 3),
        "uncounted_gaps": track.uncounted_gaps,
        "uncounted_gap_s": round(track.uncounted_gap_s, 3),
    }
    if fps and fps > 0 and track.captured:
        d["expected"] = round(1 + fps * (track.span_s - track.gap_s) + track.gaps)
        d["lost"] = track.lost
        d["lost_at_edges"] = track.at_edges
    else:
        # As fast as it goes: no rate to expect frames at.
        d["expected"] = d["lost"] = d["lost_at_edges"] = None
    return d


def camera_problems(cameras: Mapping[str, Mapping[str, Any]], lost: bool = True) -> list[str]:
    """Each camera's frames lost outside its outages (unless not ``lost``), and an index that ran
    ahead of its rate.

    More frames captured than the camera's rate allows is not a camera's doing: the frame index
    counts frames that never were (a source miscounting its drops), and such an index hides any
    frame really lost.  A reopen's backlog, read in a burst, is a few frames a gap: allowed.
    """
    problems: list[str] = []
    for name, c in cameras.items():
        if lost and c.get("lost"):
            problems.append(f"{name}: {c['lost']} frames lost outside its counted outages")
        expected = c.get("expected")
        allowed = expected and expected * (1 + INDEX_SLACK) + BACKLOG_FRAMES * (c["outage_gaps"] + 1)
        if allowed and c["captured"] > allowed:
            problems.append(
                f"{name}: {c['captured']} frames captured where its rate allows {expected}: "
                "its frame index runs ahead of the camera"
            )
    return problems


def report(
    windows: Sequence[Window],
    warmup_s: float,
    bounds: Bounds,
    *,
    before: Resources | None = None,
    after: Resources | None = None,
    cameras: Mapping[str, dict[str, Any]] | None = None,
    coarse: Sequence[Any] = (),
    config: Mapping[str, Any] | None = None,
    judge_lost: bool = True,
) -> dict[str, Any]:
    """The soak in one JSON-ready document: config, totals, resources, slopes, windows, cameras, verdict.

    ``judge_lost``: frames a camera lost fail the verdict (a soak of live cameras at their rate);
    not where a source as fast as the loop takes the CPU from the camera's capture on purpose.
    """
    kept = after_warmup(windows, warmup_s)
    problems = judge(windows, warmup_s, bounds, before, after)
    cams = dict(cameras or {})
    problems += camera_problems(cams, lost=judge_lost)
    lost = [c["lost"] for c in cams.values() if c.get("lost") is not None]
    return {
        "config": dict(config or {}),
        "frames": sum(w.frames for w in windows),
        "seconds": windows[-1].end_s if windows else 0.0,
        "resources": {
            "before": before.to_dict() if before else None,
            "start": kept[0].resources.to_dict() if kept else None,  # the first window after the warm-up
            "end": kept[-1].resources.to_dict() if kept else None,
            "after": after.to_dict() if after else None,
        },
        "warmup_s": warmup_s,
        "slope_per_hour": slopes(kept),
        "growth": _peak_growth(kept) if kept else None,
        "bounds": asdict(bounds),
        "windows": [w.to_dict() for w in windows],
        "p99_coarse": [asdict(c) for c in coarse],
        "cameras": cams,
        "frames_lost": sum(lost) if lost else None,
        "problems": problems,
        "ok": not problems,
    }


def _mib(v: float | None) -> str:
    return "-" if v is None else f"{v / MIB:.1f}"


def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def render(doc: Mapping[str, Any]) -> str:
    """The soak for a person: one line per window, the slopes, each camera's account, the verdict."""
    lines = [
        f"{'t (s)':>8} {'frames':>8} {'fps':>7} {'drop':>5} {'out':>4} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'RSS MiB':>8} {'heap MiB':>8} {'blocks':>8} {'fds':>4} {'thr':>4} {'tasks':>5}"
    ]
    for w in doc["windows"]:
        r = w["resources"]
        lines.append(
            f"{w['end_s']:>8.0f} {w['frames']:>8} {w['fps']:>7.1f} {w['dropped']:>5} {w['outages']:>4} "
            f"{_num(w['p50_ms'], '{:.2f}'):>7} {_num(w['p99_ms'], '{:.2f}'):>7} {_mib(r['rss_bytes']):>8} "
            f"{_mib(r['heap_bytes']):>8} {r['blocks']:>8} {_num(r['fds']):>4} {r['threads']:>4} {_num(r['tasks']):>5}"
        )
    for c in doc["p99_coarse"]:
        lines.append(
            f"p99 {c['start_s']:.0f}-{c['end_s']:.0f} s: {_num(c['p99_ms'], '{:.2f}')} ms over {c['frames']} frames"
        )
    res = doc["resources"]
    if res["start"] and res["end"]:
        a, b = res["start"], res["end"]
        lines.append(
            f"after the warm-up -> end: RSS {_mib(a['rss_bytes'])} -> {_mib(b['rss_bytes'])} MiB, "
            f"heap {_mib(a['heap_bytes'])} -> {_mib(b['heap_bytes'])} MiB, blocks {a['blocks']} -> {b['blocks']}, "
            f"fds {_num(a['fds'])} -> {_num(b['fds'])}, threads {a['threads']} -> {b['threads']}, "
            f"tasks {_num(a['tasks'])} -> {_num(b['tasks'])}"
        )
    if res["before"] and res["after"]:
        a, b = res["before"], res["after"]
        lines.append(
            f"before -> after the soak: fds {_num(a['fds'])} -> {_num(b['fds'])}, "
            f"threads {a['threads']} -> {b['threads']}, tasks {_num(a['tasks'])} -> {_num(b['tasks'])}"
        )
    s = doc["slope_per_hour"]
    lines.append(
        f"slope per hour after {doc['warmup_s']:g} s: RSS {_num(_div(s['rss_bytes']), '{:+.2f}')} MiB, "
        f"heap {_num(_div(s['heap_bytes']), '{:+.2f}')} MiB, blocks {_num(s['blocks'], '{:+.0f}')}, fds {_num(s['fds'], '{:+.2f}')}, "
        f"threads {_num(s['threads'], '{:+.2f}')}, tasks {_num(s['tasks'], '{:+.2f}')}"
    )
    g = doc.get("growth") or {}
    if g:
        lines.append(
            f"growth (later peak - earlier peak): RSS {_num(_div(g['rss_bytes']), '{:+.2f}')} MiB, "
            f"heap {_num(_div(g['heap_bytes']), '{:+.2f}')} MiB, blocks {_num(g['blocks'], '{:+.0f}')}, "
            f"fds {_num(g['fds'], '{:+.0f}')}, threads {_num(g['threads'], '{:+.0f}')}, tasks {_num(g['tasks'], '{:+.0f}')}"
        )
    for name, c in doc["cameras"].items():
        acct = f"expected {c['expected']}, lost {c['lost']}" if c.get("expected") is not None else "unpaced"
        if c.get("lost_at_edges"):
            acct += f" (and {c['lost_at_edges']} at outages' edges)"
        lines.append(
            f"camera {name}: {c['captured']} captured, {acct}; {c['outage_gaps']} counted outages "
            f"({c['outage_s']:.1f} s), {c['uncounted_gaps']} uncounted gaps ({c['uncounted_gap_s']:.1f} s)"
        )
    lines.append("bounds met" if doc["ok"] else "NOT met: " + "; ".join(doc["problems"]))
    return "\n".join(lines)


def _div(v: float | None) -> float | None:
    return None if v is None else v / MIB
