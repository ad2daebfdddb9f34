"""Kill ``edgekit agent install`` with SIGKILL at random points, many times; the active slot must survive.

Usage::

    python tools/crash_agent_install.py --root /tmp/crash-root --key builder.pub.pem \\
        --bundle v1.tar.gz --bundle v2.tar.gz [--iterations 50] [--seed 1] [--health-runs 10]

First one uninterrupted install of each bundle (they become the two slots, and their step
timings calibrate the kills).  Then each iteration installs the other bundle under a new
deploy id and SIGKILLs the process: even iterations at a uniformly random time across a
whole install, odd ones inside a chosen step (every step in turn, the split-millisecond
``switch`` included), at a random delay after that step's JSON progress line appeared.
After each kill, this process plays the restarted agent: ``StateRoot.recover()``, then the
active slot must be complete and verify (every hash, a trusted signature).  Prints the
distribution of the steps the kills landed in and the wall time; ``--json`` prints it as
one document.  Exit code 0 when every check held.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

STEPS = ("signature", "hashes", "unpack", "health", "switch", "done")


def agent_command(bundle: Path, root: Path, deploy_id: str, args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, "-m", "edgekit.cli", "agent", "install", str(bundle), "--root", str(root)]
    cmd += ["--id", deploy_id, "--json", "--health-runs", str(args.health_runs)]
    return cmd + (["--device", args.device] if args.device else [])


class Run:
    """One agent process, its JSON progress lines read as they come (with the time each arrived)."""

    def __init__(self, cmd: list[str]) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events: list[tuple[float, str]] = []  # (seconds since start, step)
        self.result: dict[str, Any] | None = None
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.err = ""
        self.err_reader = threading.Thread(target=self._read_err, daemon=True)
        self.err_reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self.changed:
                if "step" in doc:
                    self.events.append((time.monotonic() - self.started, doc["step"]))
                elif "result" in doc:
                    self.result = doc["result"]
                self.changed.notify_all()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self.err = self.proc.stderr.read()

    def wait_for_step(self, step: str, timeout: float) -> bool:
        """Block until ``step``'s line arrived (True), or the process ended or time ran out (False)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not any(s == step for _, s in self.events):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    return False
                self.changed.wait(0.005)
        return True

    def kill(self) -> str:
        """SIGKILL now; return the step the process was in (its last line), or ``exited`` if it had ended."""
        if self.proc.poll() is not None:
            landed = "exited"
        else:
            self.proc.send_signal(signal.SIGKILL)
            with self.changed:
                landed = self.events[-1][1] if self.events else "startup"
        self.proc.wait()
        self.reader.join(5)
        self.err_reader.join(5)
        return landed

    def finish(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        self.reader.join(5)
        self.err_reader.join(5)
        return rc


def check_root(root: Path, key: Path) -> tuple[bool, str, str | None]:
    """What a restarted agent does first, then the invariant: ``(ok, why not, active version)``."""
    from edgekit.bundle import read_manifest, verify
    from edgekit.deploy import StateRoot

    state = StateRoot(root)
    state.recover()
    active = state.active_bundle()
    if active is None:
        return False, "no active slot after recover()", None
    report = verify(active, [key], require_signature=True)
    if not report.ok:
        return False, "; ".join(f"{c.name}: {c.detail}" for c in report.failures), None
    return True, "", read_manifest(active).model.version


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", type=Path, required=True, help="state root (created; emptied first)")
    p.add_argument("--key", type=Path, required=True, help="the public key that signed the bundles")
    p.add_argument(
        "--bundle", type=Path, action="append", required=True, help="two bundles, installed in turn"
    )
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--health-runs", type=int, default=10, help="frames the health gate times (fewer: quicker)"
    )
    p.add_argument("--device", default=None, help="device profile for the health gate (default: detect)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON document")
    args = p.parse_args(argv)
    if len(args.bundle) != 2:
        p.error("pass --bundle twice (two versions to alternate)")

    import shutil

    from edgekit.deploy import StateRoot

    if args.root.exists():
        shutil.rmtree(args.root)
    state = StateRoot(args.root)
    key = state.keys_dir / "trusted.pub.pem"  # read once: the checks below use this copy
    shutil.copy(args.key, key)
    rng = random.Random(args.seed)
    wall = time.monotonic()

    # Calibration: both bundles installed whole; their step timings size the kill windows.
    starts: dict[str, list[float]] = {s: [] for s in STEPS}
    ends: list[float] = []
    version_of: dict[str, Path] = {}
    for n, bundle in enumerate(args.bundle):
        for attempt in range(3):  # a shared machine's hiccup can fail a short health gate: retry
            run = Run(agent_command(bundle, args.root, f"calibrate-{n}-{attempt}", args))
            rc = run.finish(600)
            if rc == 0 and run.result is not None and run.result.get("ok"):
                break
        else:
            print(f"calibration install of {bundle} failed (exit {rc}):\n{run.err[-3000:]}", file=sys.stderr)
            print(json.dumps(run.result), file=sys.stderr)
            return 2
        assert run.result is not None
        version_of[str(run.result["version"])] = bundle
        for t, s in run.events:
            starts[s].append(t)
        ends.append(time.monotonic() - run.started)
    total = max(ends)
    t_of = {s: sum(v) / len(v) for s, v in starts.items()}
    duration = {
        s: (t_of[STEPS[i + 1]] if i + 1 < len(STEPS) else total) - t_of[s] for i, s in enumerate(STEPS)
    }

    landed: Counter[str] = Counter()
    targeted: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    versions: Counter[str] = Counter()
    if len(version_of) != 2:
        p.error("the two bundles must have different model versions")
    active_version: str | None = next(v for v, b in version_of.items() if b == args.bundle[1])
    for i in range(args.iterations):
        # Always the version that is not active, so every completed install is a real switch.
        bundle = next(b for v, b in version_of.items() if v != active_version)
        run = Run(agent_command(bundle, args.root, f"crash-{i}", args))
        if i % 2 == 0:
            time.sleep(rng.uniform(0, total))
        else:
            step = STEPS[(i // 2) % len(STEPS)]
            targeted[step] += 1
            if run.wait_for_step(step, timeout=600):
                time.sleep(rng.uniform(0, max(duration[step], 0.0)))
        where = run.kill()
        landed[where] += 1
        ok, why, version = check_root(args.root, key)
        if version:
            versions[version] += 1
            active_version = version
        if not ok:
            failures.append({"iteration": i, "killed_in": where, "problem": why})
            print(f"iteration {i}: killed in {where}: {why}", file=sys.stderr)

    summary = {
        "iterations": args.iterations,
        "seed": args.seed,
        "failures": failures,
        "kills_by_step": {s: landed.get(s, 0) for s in ("startup", *STEPS, "exited")},
        "targeted_steps": dict(targeted),
        "active_versions_after_kills": dict(versions),
        "calibration_s": {"install_total": round(total, 3), **{s: round(d, 3) for s, d in duration.items()}},
        "wall_s": round(time.monotonic() - wall, 1),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{args.iterations} SIGKILLs in {summary['wall_s']} s (an install takes {total:.2f} s):")
        for s, n in summary["kills_by_step"].items():
            print(f"  {s:10} {n:3}  {'#' * n}")
        print(f"active version after the kills: {dict(versions)}")
        print(
            "every time: the active slot was complete and verified"
            if not failures
            else f"{len(failures)} FAILED"
        )
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
