"""Fast at the camera's rate, by default: bench, first load, a long run, and the stages before/after, in one sitting.

    .venv/bin/python -m benchmarks.camera_rate [BUNDLE] [--frames 10000] [--before REV] [--json]

Everything runs on this machine, one step after another, with a state folder of its own
(so no selection is written beforehand):

1. ``edgekit bench BUNDLE --json`` at the camera rate (the budget's fps): every candidate's
   back-to-back p50 (bare ``session.run``), its cold paced p50 and its paced p50 as the frame
   loop runs it (warm passes before each query).
2. The first ``edgekit.load`` of the bundle here (it measures its candidates at the camera
   rate and keeps the choice), then a second one, which reads the choice back.
3. ``edgekit run BUNDLE --source synthetic:640x480@30 --frames N --json``: the candidate it
   uses, its end-to-end p50 and each stage's, the misses, the warm passes.
4. The same run with the code of ``--before`` (a git revision, checked out in a temporary
   worktree; it reads the same kept choice, so the same candidate runs): each stage before
   and after.  With ``--profile``, py-spy samples a shorter run of each (``--native``) and
   the loop thread's time inside each stage is split by the function at the top of the stack.

It then checks issue 19's bars: the candidate ``run`` uses is within 10% (p50) of the
fastest one bench measured at the camera rate; end-to-end p50 ≤ 1.25x that candidate's
back-to-back bare p50 and ≤ 1.1x its paced bare p50; no misses; the second load under 1 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks._harness import bundle_of, parse, parser, print_json, progress_on_stderr, verdict

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "synthetic:640x480@30"


def cli(env: dict[str, str], *args: str, pythonpath: Path | None = None) -> dict[str, Any]:
    """``edgekit ARGS --json`` in a fresh process (``pythonpath``: another checkout's code); its JSON."""
    run_env = {**env, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    code = "import sys; from edgekit.cli import main; sys.exit(main())"
    # Run from that checkout: ``python -c`` puts the working folder first on sys.path, ahead of
    # PYTHONPATH and of the editable install that points at this one.
    r = subprocess.run(
        [sys.executable, "-c", code, *args, "--json"],
        env=run_env,
        capture_output=True,
        text=True,
        cwd=pythonpath or ROOT,
    )
    if r.returncode != 0:
        raise SystemExit(f"edgekit {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def first_loads(bundle: Path, env: dict[str, str]) -> dict[str, Any]:
    """Two loads in one fresh process: the first measures (its progress lines kept), the second reads the choice."""
    code = f"""
import json, time, edgekit
lines = []
t0 = time.perf_counter()
with edgekit.load({str(bundle)!r}, allow_unsigned=True, progress=lines.append) as m:
    first = time.perf_counter() - t0
    chose = m.candidate
t0 = time.perf_counter()
with edgekit.load({str(bundle)!r}, allow_unsigned=True) as m:
    second = time.perf_counter() - t0
    again = m.candidate
print(json.dumps({{"first_s": first, "second_s": second, "chose": chose, "second_chose": again,
                  "progress": lines}}))
"""
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"the loads failed:\n{r.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return doc


def profile(
    bundle: Path, env: dict[str, str], frames: int, out: Path, pythonpath: Path | None
) -> dict[str, dict[str, float]]:
    """py-spy over a run of ``frames``: per stage, the share of its samples by the function on top."""
    run_env = {**env, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    code = "import sys; from edgekit.cli import main; sys.exit(main())"
    spy = Path(sys.executable).with_name("py-spy")
    # 250 Hz: --native stops the process for each sample, and at 1000 Hz it slowed the loop down.
    cmd = [str(spy), "record", "--native", "--rate", "250", "--format", "raw", "-o", str(out), "--"]
    cmd += [sys.executable, "-c", code, "run", str(bundle), "--source", SOURCE, "--frames", str(frames)]
    cmd += ["--allow-unsigned", "--json"]
    subprocess.run(cmd, env=run_env, capture_output=True, text=True, check=True, cwd=pythonpath or ROOT)
    shares: dict[str, Counter[str]] = {}
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames_ = stack.split(";")
        at = [i for i, f in enumerate(frames_) if f.startswith("Pipeline._label ")]
        below = frames_[at[-1] + 1 :] if at else []
        if not below:
            continue
        # The stage is what _label called; within it, the deepest Python function and the library
        # the sample was in (native frames are often bare addresses, their library is not).
        stage = _stage_of(below[0])
        python = [f.split(" (")[0] for f in below if ".py:" in f]
        library = below[-1].rpartition("(")[2].rstrip(")").rsplit("/", 1)[-1]
        shares.setdefault(stage, Counter())[f"{python[-1] if python else '-'} in {library}"] += int(count)
    return {
        stage: {fn: n / total for fn, n in c.most_common(5)}
        for stage, c in shares.items()
        if (total := sum(c.values()))
    }


def _stage_of(frame: str) -> str:
    if frame.startswith(("Preprocessor", "preprocess")):
        return "preprocess"
    if frame.startswith(("Session.run", "OpenVINOSession", "OrtSession", "LiteRTSession", "TVMSession")):
        return "inference"
    return "postprocess"


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, bundle=True, device=False, json_flag=True)
    ap.add_argument("--frames", type=int, default=10_000)
    ap.add_argument("--before", default="", help="a git revision to compare the stages with")
    ap.add_argument("--before-frames", type=int, default=2000)
    ap.add_argument(
        "--profile", type=int, default=0, metavar="FRAMES", help="py-spy runs of this many frames"
    )
    args = parse(ap, argv)
    with progress_on_stderr(args.json):
        doc = measure(args)
    if args.json:
        print_json(doc, indent=1)


def measure(args: Any) -> dict[str, Any]:
    bundle = bundle_of(args)
    work = Path(tempfile.mkdtemp(prefix="edgekit-camera-rate-"))
    env = {**os.environ, "EDGEKIT_STATE": str(work / "state"), "EDGEKIT_MEASURE": "1"}
    env.pop("PYTHONPATH", None)
    started = time.time()

    print("1/4 edgekit bench at the camera rate ...", flush=True)
    bench = cli(env, "bench", str(bundle), "--allow-unsigned")
    # One thread count each by default (the profile's): keyed by the artifact, as `edgekit run` names it.
    cands = {c["artifact"]: c for c in bench["candidates"] if c["ok"]}
    gated = {k: c for k, c in cands.items() if c.get("passed_gate")}
    paced = {k: c["camera_rate"]["p50_ms"] for k, c in gated.items()}
    fastest = min(paced, key=lambda k: paced[k])

    print("2/4 the first load (it measures) and a second one ...", flush=True)
    loads = first_loads(bundle, env)

    print(f"3/4 edgekit run --source {SOURCE} --frames {args.frames} ...", flush=True)
    after = cli(env, "run", str(bundle), "--source", SOURCE, "--frames", str(args.frames), "--allow-unsigned")
    used = after["candidate"]
    b2b = cands[used]["summary"]["p50_ms"]
    cold = cands[used]["camera_rate"]["cold_p50_ms"]
    e2e = after["latency_ms"]["p50"]

    before = None
    profiles: dict[str, Any] = {}
    if args.before:
        tree = work / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.before],
            check=True,
            capture_output=True,
        )
        try:
            print(f"4/4 the same run with {args.before}'s code ({args.before_frames} frames) ...", flush=True)
            before = cli(
                env,
                "run",
                str(bundle),
                "--source",
                SOURCE,
                "--frames",
                str(args.before_frames),
                "--allow-unsigned",
                pythonpath=tree,
            )
            if args.profile:
                print("    py-spy, before and after ...", flush=True)
                profiles["before"] = profile(bundle, env, args.profile, work / "before.txt", tree)
                profiles["after"] = profile(bundle, env, args.profile, work / "after.txt", None)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)

    bars = {
        "candidate within 10% of the fastest at the camera rate": paced.get(used, float("inf"))
        <= 1.10 * paced[fastest],
        "e2e p50 <= 1.25x back-to-back bare p50": e2e <= 1.25 * b2b,
        "e2e p50 <= 1.1x paced bare p50": e2e <= 1.10 * cold,
        "0 misses": after["counters"]["missed"] == 0,
        "second load < 1 s": loads["second_s"] < 1.0,
    }
    doc = {
        "bundle": str(bundle),
        "frames": args.frames,
        "bench": {
            k: {"back_to_back_p50_ms": c["summary"]["p50_ms"], **c["camera_rate"]} for k, c in cands.items()
        },
        "fastest_at_camera_rate": fastest,
        "loads": loads,
        "run": {
            "candidate": used,
            "latency_ms": after["latency_ms"],
            "stages_p50_ms": {s: v["p50"] for s, v in after["stages_ms"].items()},
            "counters": after["counters"],
            "selection": after.get("selection"),
        },
        "before": None
        if before is None
        else {
            "revision": args.before,
            "candidate": before["candidate"],
            "latency_ms": before["latency_ms"],
            "stages_p50_ms": {s: v["p50"] for s, v in before["stages_ms"].items()},
            "counters": before["counters"],
        },
        "profiles": profiles,
        "ratios": {"e2e / back-to-back bare": e2e / b2b, "e2e / paced bare": e2e / cold},
        "bars": bars,
        "wall_s": time.time() - started,
    }
    print(render(doc), flush=True)
    return doc


def render(doc: dict[str, Any]) -> str:
    run, loads = doc["run"], doc["loads"]
    used = run["candidate"]
    lines = [f"## Camera rate, {doc['frames']} frames of {SOURCE}", ""]
    lines += [
        "| candidate | back to back p50 | paced cold p50 | paced as the loop runs it p50 / p90 | warm passes |"
    ]
    lines += ["| --- | --- | --- | --- | --- |"]
    for k, c in sorted(doc["bench"].items(), key=lambda kv: kv[1]["p50_ms"]):
        mark = (" (run uses it)" if k == used else "") + (
            " (fastest)" if k == doc["fastest_at_camera_rate"] else ""
        )
        warm = f"{c['warm_pass_ms']:.2f}" if c.get("warm_pass_ms") is not None else "-"
        lines.append(
            f"| {k}{mark} | {c['back_to_back_p50_ms']:.2f} | {c['cold_p50_ms']:.2f} | "
            f"{c['p50_ms']:.2f} / {c['p90_ms']:.2f} | {warm} |"
        )
    lines += [
        "",
        f"First load (measures): {loads['first_s']:.2f} s, chose {loads['chose']}; "
        f"second load: {loads['second_s']:.3f} s ({loads['second_chose']})",
        "",
    ]
    stages = list(run["stages_p50_ms"])
    before = doc["before"]
    lines += ["| stage p50 (ms) | " + (f"before ({before['revision']}) | " if before else "") + "after |"]
    lines += ["| --- | " + ("--- | " if before else "") + "--- |"]
    for s in stages:
        lines.append(
            f"| {s} | "
            + (f"{before['stages_p50_ms'][s]:.3f} | " if before else "")
            + f"{run['stages_p50_ms'][s]:.3f} |"
        )
    lines.append(
        "| end to end | "
        + (f"{before['latency_ms']['p50']:.3f} | " if before else "")
        + f"{run['latency_ms']['p50']:.3f} |"
    )
    c = run["counters"]
    lines += [
        "",
        f"misses {c['missed']}, drops {c['dropped']}, warm passes {c.get('warm_passes', 0)} "
        f"(late {c.get('warm_late', 0)})",
        "",
    ]
    for name, ratio in doc["ratios"].items():
        lines.append(f"{name}: {ratio:.3f}")
    for bar, ok in doc["bars"].items():
        lines.append(f"{bar}: {verdict(ok)}")
    for when, prof in doc["profiles"].items():
        lines.append(f"\npy-spy, {when}: share of each stage's samples by the function on top")
        for stage, fns in prof.items():
            lines.append(f"  {stage}: " + ", ".join(f"{fn} {share:.0%}" for fn, share in fns.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
