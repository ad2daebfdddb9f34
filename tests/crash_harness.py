"""Kill ``edgekit agent install`` with SIGKILL at random points, many times; the active slot must survive.

``sigkill_installs(root, key, (v1, v2))`` (tests/test_deploy_crash.py runs it).  First one uninterrupted install of each bundle (they become the two slots, and their step
timings calibrate the kills).  Then each iteration installs the other bundle under a new
deploy id and SIGKILLs the process: even iterations at a uniformly random time across a
whole install, odd ones inside a chosen step (every step in turn, the split-millisecond
``switch`` included), at a random delay after that step's JSON progress line appeared.
After each kill, this process plays the restarted agent: ``edgekit.deploy.recovery.recover``, then the
active slot must be complete and verify (every hash, a trusted signature).  Returns the
distribution of the steps the kills landed in, the failures (none when every check held) and
the wall time.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from edgekit.bundle import read_manifest, verify
from edgekit.deploy import StateRoot, recover

STEPS = ("signature", "hashes", "unpack", "health", "switch", "done")


def agent_command(
    bundle: Path, root: Path, deploy_id: str, health_runs: int, device: str | None, *extra: str
) -> list[str]:
    cmd = [sys.executable, "-m", "edgekit.cli", "agent", "install", str(bundle), "--root", str(root)]
    cmd += ["--id", deploy_id, "--json", "--health-runs", str(health_runs), *extra]
    return cmd + (["--device", device] if device else [])


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
    state = StateRoot(root)
    recover(state)
    active = state.active_bundle()
    if active is None:
        return False, "no active slot after recover()", None
    report = verify(active, [key], require_signature=True)
    if not report.ok:
        return False, "; ".join(f"{c.name}: {c.detail}" for c in report.failures), None
    return True, "", read_manifest(active).model.version


def sigkill_installs(
    root: Path,
    key: Path,
    bundles: tuple[Path, Path],
    iterations: int = 50,
    seed: int = 1,
    health_runs: int = 10,
    device: str | None = None,
) -> dict[str, Any]:
    """``iterations`` installs of ``bundles`` in turn into ``root`` (emptied first), each SIGKILLed; the summary.

    ``key`` is the public key that signed the bundles (two different model versions);
    ``health_runs`` the frames the health gate times (fewer: quicker); ``device`` the profile
    for the health gate (default: detect).
    """
    if root.exists():
        shutil.rmtree(root)
    state = StateRoot(root)
    trusted = state.keys_dir / "trusted.pub.pem"  # read once: the checks below use this copy
    shutil.copy(key, trusted)
    rng = random.Random(seed)
    wall = time.monotonic()

    # Calibration: both bundles installed whole; their step timings size the kill windows.
    starts: dict[str, list[float]] = {s: [] for s in STEPS}
    ends: list[float] = []
    version_of: dict[str, Path] = {}
    for n, bundle in enumerate(bundles):
        for attempt in range(3):  # a shared machine's hiccup can fail a short health gate: retry
            # Two bundles may share a serial (to take turns): the second is let in once, as an operator would.
            extra = ("--allow-downgrade",) if n else ()
            run = Run(agent_command(bundle, root, f"calibrate-{n}-{attempt}", health_runs, device, *extra))
            rc = run.finish(600)
            if rc == 0 and run.result is not None and run.result.get("ok"):
                break
        else:
            raise AssertionError(
                f"calibration install of {bundle} failed (exit {rc}): {json.dumps(run.result)}\n{run.err[-3000:]}"
            )
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
    assert len(version_of) == 2, "the two bundles must have different model versions"
    active_version: str | None = next(v for v, b in version_of.items() if b == bundles[1])
    for i in range(iterations):
        # Always the version that is not active, so every completed install is a real switch.
        bundle = next(b for v, b in version_of.items() if v != active_version)
        run = Run(agent_command(bundle, root, f"crash-{i}", health_runs, device))
        if i % 2 == 0:
            time.sleep(rng.uniform(0, total))
        else:
            step = STEPS[(i // 2) % len(STEPS)]
            targeted[step] += 1
            if run.wait_for_step(step, timeout=600):
                time.sleep(rng.uniform(0, max(duration[step], 0.0)))
        where = run.kill()
        landed[where] += 1
        ok, why, version = check_root(root, trusted)
        if version:
            versions[version] += 1
            active_version = version
        if not ok:
            failures.append({"iteration": i, "killed_in": where, "problem": why})
            print(f"iteration {i}: killed in {where}: {why}", file=sys.stderr)

    return {
        "iterations": iterations,
        "seed": seed,
        "failures": failures,
        "kills_by_step": {s: landed.get(s, 0) for s in ("startup", *STEPS, "exited")},
        "targeted_steps": dict(targeted),
        "active_versions_after_kills": dict(versions),
        "calibration_s": {"install_total": round(total, 3), **{s: round(d, 3) for s, d in duration.items()}},
        "wall_s": round(time.monotonic() - wall, 1),
    }
