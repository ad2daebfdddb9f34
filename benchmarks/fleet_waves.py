"""Wave rollouts to thousands of simulated agents: waves, a gate that stops a breach, abort, restart.

Starts its own Mosquitto and ``--agents`` simulated agents in a second process
(``edgekit.deploy.sim_agents``: one epoll loop, each agent the real agent's command path with a
simulated install of ``--install-ms``, a telemetry window every ``--interval`` seconds at the
latency of the version it runs).  Then, one after the other, on the same fleet:

1. ``good``: version 2.0, waves 1,10,50,100 %: every wave's gate holds, everyone gets it;
2. ``breach``: version 3.0, slow on every second device past the first wave: wave 2's gate
   breaches, the devices of waves 1-2 are rolled back, nobody beyond wave 2 gets a command;
3. ``abort``: version 4.0; the operator pauses in wave 2, resumes, and aborts once wave 3 is
   installed (``edgekit deploy control``'s retained message): waves 1-3 are rolled back;
4. ``restart``: version 5.0 in a child process, SIGKILLed in wave 3 (results coming in) and
   started again on the same state file: it continues, and no agent gets the command twice.

For each: the time of each wave (its commands and results, then its gate), the total, who got
which command.  Each wave's gate watches the new version for ``--window`` seconds.

    .venv/bin/python -m benchmarks.fleet_waves [--agents 2000] [--window 10] [--interval 5] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._harness import parse, parser, print_doc, run, verdict
from edgekit.deploy.publish import Artifact
from edgekit.deploy.sim_agents import AgentFleet, SimVersion
from edgekit.deploy.waves import StateFile, WaveOptions, WaveRollout, parse_waves, plan_waves, send_control
from edgekit.telemetry.simulate_fleet import FD_SPARE, raise_fd_limit
from edgekit.testing.mosquitto import Mosquitto

FLEET = "waves"
WAVES = "1,10,50,100"
BROKER = "max_queued_messages 100000\n"


def versions(first_wave: int) -> dict[str, SimVersion]:
    """The versions the scenarios roll out, by name (3.0 is slow on every 2nd device past wave 1)."""
    return {
        v.version: v
        for v in (
            SimVersion("2.0", latency=0.5),
            SimVersion("3.0", latency=0.5, slow_latency=2.0, slow_every=2, slow_from=first_wave),
            SimVersion("4.0", latency=0.5),
            SimVersion("5.0", latency=0.5),
        )
    }


def sha_of(version: str) -> str:
    return hashlib.sha256(f"bundle {version}".encode()).hexdigest()


def artifact_of(version: str) -> Artifact:
    url = f"http://127.0.0.1:9/artifacts/m-{version}.tar.gz"  # the simulated install downloads nothing
    return Artifact(
        f"m-{version}.tar.gz", Path("/nonexistent"), url, sha_of(version), 1000, "m", version, None
    )


def first_wave(agents: int) -> int:
    """How many agents the first wave holds (3.0 is slow only past them)."""
    return len(plan_waves([str(i) for i in range(agents)], parse_waves(WAVES))[0])


# -- the agents' process ------------------------------------------------------------------------------


def agents_main(args: argparse.Namespace) -> int:
    """``--agents-process``: run the fleet; write who got which command to ``--ledger`` twice a second."""
    from edgekit.protocol.broker import BrokerConfig

    fleet = AgentFleet(
        BrokerConfig.from_url(args.mqtt),
        FLEET,
        args.agents,
        {sha_of(n): v for n, v in versions(first_wave(args.agents)).items()},
        trusted_keys=[Path(args.key)],
        install_s=args.install_ms / 1000,
        interval_s=args.interval,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    thread = threading.Thread(target=fleet.run, daemon=True)
    thread.start()
    ledger = Path(args.ledger)
    last = ""
    while not stop.wait(0.5):
        doc = json.dumps(
            {"ready": fleet.ready.is_set(), "commands": fleet.commands(), "active": fleet.active()}
        )
        if doc != last:
            part = ledger.with_name(ledger.name + ".part")
            part.write_text(doc)
            part.replace(ledger)
            last = doc
    fleet.stop()
    thread.join(30)
    return 0


def rollout_child_main(args: argparse.Namespace) -> int:
    """``--rollout-child``: one wave rollout in its own process (the one the benchmark kills and restarts)."""
    state = make_rollout(args.mqtt, Path(args.state), args, Path(args.key)).run(
        artifact_of(args.version), args.id
    )
    print(state.status, flush=True)
    return 0


def make_rollout(mqtt: str, state: Path, args: argparse.Namespace, key: Path) -> WaveRollout:
    options = WaveOptions(
        shares=parse_waves(WAVES), state_path=state, window_s=args.window, startup_grace_s=60, timeout_s=120
    )
    return WaveRollout(FLEET, mqtt, options, sign_key=key)


# -- the scenarios ---------------------------------------------------------------------------------------


class Ledger:
    """What the agents' process says: who got which command, which version each runs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, Any]:
        try:
            doc: dict[str, Any] = json.loads(self.path.read_text())
            return doc
        except (OSError, ValueError):
            return {"ready": False, "commands": {}, "active": {}}

    def got(self, action: str, rid: str) -> dict[str, int]:
        return {d: sum(1 for c in cmds if c == [action, rid]) for d, cmds in self.read()["commands"].items()}


def wait_for(check: Callable[[], Any], timeout: float, every: float = 0.1) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := check():
            return value
        time.sleep(every)
    return None


def summary(state: Any, seconds: float, ledger: Ledger, rid: str) -> dict[str, Any]:
    """One scenario's numbers and its who-got-what."""
    deploys = ledger.got("deploy", rid)
    rollbacks = ledger.got("rollback", f"{rid[:61]}-rb")
    waves_of = {d: k for k, wave in enumerate(state.waves) for d in wave}
    beyond = max((k for k, g in enumerate(state.gates) if g), default=-1) + 1  # waves judged
    return {
        "id": rid,
        "status": state.status,
        "reason": state.reason,
        "seconds": round(seconds, 2),
        "waves": [
            {
                "wave": k + 1,
                "devices": len(wave),
                **(
                    {
                        "installed_s": g["installed_s"],
                        "gate_s": round(g["seconds"] - g["installed_s"], 2),
                        "p95_ms": g["p95_ms"],
                        "limit_ms": g["limit_ms"],
                        "miss_rate": g["miss_rate"],
                        "frames": g["frames"],
                        "breach": g["breach"],
                        "aborted": g["aborted"],
                    }
                    if (g := _gate(state, k))
                    else {}
                ),
            }
            for k, wave in enumerate(state.waves)
        ],
        "deploy_commands": sum(deploys.values()),
        "most_deploys_to_one_device": max(deploys.values(), default=0),
        "devices_sent_beyond_judged_waves": sum(
            1 for d, n in deploys.items() if n and waves_of.get(d, 0) >= beyond
        ),
        "rolled_back": len(state.rolled_back),
        "rollback_commands": sum(rollbacks.values()),
        "rollback_to_exactly_the_switched": sorted(d for d, n in rollbacks.items() if n)
        == sorted(state.rolled_back),
        "restarts": state.restarts,
    }


def _gate(state: Any, k: int) -> dict[str, Any] | None:
    return state.gates[k] if k < len(state.gates) else None


def measure(args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    from edgekit.bundle.keys import generate_keypair

    raise_fd_limit(args.agents + FD_SPARE)
    out: dict[str, Any] = {"agents": args.agents, "waves": WAVES, "window_s": args.window,
                           "interval_s": args.interval, "install_ms": args.install_ms}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="fleet-waves-") as tmp_:
        tmp = Path(tmp_)
        private, public = generate_keypair(tmp / "deploy")
        broker = Mosquitto(tmp, extra=BROKER, log=False).start()
        ledger = Ledger(tmp / "ledger.json")
        me = [sys.executable, "-m", "benchmarks.fleet_waves", "--mqtt", broker.url, "--key"]
        common = [
            "--agents",
            str(args.agents),
            "--interval",
            str(args.interval),
            "--window",
            str(args.window),
        ]
        agents = subprocess.Popen(
            [*me, str(public), *common, "--install-ms", str(args.install_ms), "--agents-process",
             "--ledger", str(ledger.path)]
        )  # fmt: skip
        try:
            t0 = time.monotonic()
            if not wait_for(lambda: ledger.read()["ready"], 180):
                raise RuntimeError("the simulated agents did not come online")
            out["connect_s"] = round(time.monotonic() - t0, 2)
            progress(f"{args.agents} agents online in {out['connect_s']} s")

            def scenario(
                name: str, version: str, during: Callable[[WaveRollout], None] | None = None
            ) -> None:
                rid = f"d-{name}-{int(time.time())}"
                waves = make_rollout(broker.url, tmp / f"{name}.json", args, private)
                started = time.monotonic()
                if during is None:
                    state = waves.run(artifact_of(version), rid)
                else:
                    box: list[Any] = []
                    th = threading.Thread(target=lambda: box.append(waves.run(artifact_of(version), rid)))
                    th.start()
                    during(waves)
                    th.join()
                    state = box[0]
                time.sleep(1.0)  # the ledger catches up (it is written twice a second)
                out[name] = summary(state, time.monotonic() - started, ledger, rid)
                progress(f"{name}: {state.status} in {out[name]['seconds']} s {state.reason}")

            scenario("good", "2.0")
            scenario("breach", "3.0")

            def operator(waves: WaveRollout) -> None:
                def rid() -> str:
                    return waves.state.id if waves.state else ""

                wait_for(lambda: waves.state is not None and waves.state.wave == 1, 120, 0.02)
                send_control(broker.url, FLEET, rid(), "pause", "benchmark: a look at wave 2")
                wait_for(lambda: waves.state is not None and waves.state.status == "paused", 60, 0.02)
                time.sleep(2.0)
                send_control(broker.url, FLEET, rid(), "resume")
                installed = sum(len(w) for w in (waves.state.waves[:3] if waves.state else []))
                wait_for(
                    lambda: waves.state is not None and waves.state.wave == 2
                    and len(waves.state.results) >= installed, 300, 0.02,
                )  # fmt: skip
                send_control(broker.url, FLEET, rid(), "abort", "benchmark: abort mid-wave")

            scenario("abort", "4.0", operator)
            out["restart"] = restart(args, broker.url, tmp, private, ledger, me, common, progress)
        finally:
            agents.send_signal(signal.SIGTERM)
            try:
                agents.wait(60)
            except subprocess.TimeoutExpired:
                agents.kill()
            broker.stop()
    return out


def restart(
    args: argparse.Namespace,
    mqtt: str,
    tmp: Path,
    key: Path,
    ledger: Ledger,
    me: list[str],
    common: list[str],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Scenario 4: the rollout's process SIGKILLed in wave 3, then started again on its state file."""
    rid = f"d-restart-{int(time.time())}"
    path = tmp / "restart.json"
    argv = [*me, str(key), *common, "--rollout-child", "--state", str(path), "--version", "5.0", "--id", rid]
    started = time.monotonic()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    store = StateFile(path)

    def in_wave_3() -> bool:
        s = store.load() if path.exists() else None
        return s is not None and s.wave == 2 and len(s.results) > sum(len(w) for w in s.waves[:2])

    wait_for(in_wave_3, 300, 0.02)
    child.kill()
    child.wait()
    killed_at = time.monotonic() - started
    before = store.load()
    assert before is not None
    progress(
        f"restart: killed in wave {before.wave + 1} at {killed_at:.1f} s ({len(before.results)} results in)"
    )
    again = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    state = store.load()
    assert state is not None
    time.sleep(1.0)
    r = summary(state, time.monotonic() - started, ledger, rid)
    r |= {
        "killed_at_s": round(killed_at, 2),
        "killed_in_wave": before.wave + 1,
        "results_before_kill": len(before.results),
        "results_kept": all(state.results.get(d) == v for d, v in before.results.items()),
        "child_said": again.stdout.strip().splitlines()[-1:] or again.stderr[-500:],
    }
    progress(f"restart: {state.status} after the restart, {r['deploy_commands']} deploy commands")
    return r


def render(r: dict[str, Any]) -> str:
    lines = [f"fleet     : {r['agents']} simulated agents online in {r['connect_s']} s; waves {r['waves']} %, "
             f"gate window {r['window_s']:g} s, a window every {r['interval_s']:g} s, install {r['install_ms']} ms"]  # fmt: skip
    lines.append(f"{'scenario':<9} {'wave':>4} {'devices':>7} {'install s':>9} {'gate s':>7} {'p95 ms':>7} "
                 f"{'limit':>6} {'miss':>7}  verdict")  # fmt: skip
    for name in ("good", "breach", "abort", "restart"):
        s = r[name]
        for w in s["waves"]:
            verdict_ = (
                "not reached"
                if "p95_ms" not in w
                else "aborted"
                if w["aborted"]
                else "BREACH"
                if w["breach"]
                else "held"
            )
            lines.append(
                f"{name:<9} {w['wave']:>4} {w['devices']:>7} {w.get('installed_s', '-'):>9} "
                f"{w.get('gate_s', '-'):>7} {w.get('p95_ms', '-')!s:>7} {w.get('limit_ms', '-')!s:>6} "
                f"{w.get('miss_rate', '-')!s:>7}  {verdict_}"
            )
        lines.append(
            f"{'':<9} {s['status']} in {s['seconds']} s; {s['deploy_commands']} deploy commands (at most "
            f"{s['most_deploys_to_one_device']} to one device), {s['devices_sent_beyond_judged_waves']} beyond the "
            f"waves judged; {s['rollback_commands']} rollbacks, to exactly those that switched: "
            f"{s['rollback_to_exactly_the_switched']}"
        )
    rs = r["restart"]
    lines.append(
        f"restart   : killed in wave {rs['killed_in_wave']} at {rs['killed_at_s']} s with {rs['results_before_kill']} "
        f"results; continued: {rs['status']}, results kept: {rs['results_kept']}"
    )
    lines.append(f"goal: breach stops in wave 2, nobody twice, rollbacks exact: {verdict(goal(r))}")
    return "\n".join(lines)


def goal(r: dict[str, Any]) -> bool:
    b = r["breach"]
    return (
        r["good"]["status"] == "deployed"
        and b["status"] == "breached"
        and b["reason"].startswith("wave 2")
        and b["devices_sent_beyond_judged_waves"] == 0
        and r["abort"]["status"] == "aborted"
        and r["restart"]["status"] == "deployed"
        and r["restart"]["results_kept"]
        and all(r[n]["most_deploys_to_one_device"] <= 1 for n in ("good", "breach", "abort", "restart"))
        and all(r[n]["rollback_to_exactly_the_switched"] for n in ("breach", "abort"))
    )


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, json_flag=True)
    ap.add_argument("--agents", type=int, default=2000)
    ap.add_argument("--window", type=float, default=10.0, help="seconds each wave's gate watches")
    ap.add_argument(
        "--interval", type=float, default=5.0, help="seconds between an agent's windows (the agent's default)"
    )
    ap.add_argument("--install-ms", type=float, default=500.0, help="a simulated install's time")
    # The benchmark's own child processes:
    ap.add_argument("--agents-process", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rollout-child", action="store_true", help=argparse.SUPPRESS)
    for flag in ("--mqtt", "--key", "--ledger", "--state", "--version", "--id"):
        ap.add_argument(flag, help=argparse.SUPPRESS)
    args = parse(ap, argv)
    if args.agents_process:
        return agents_main(args)
    if args.rollout_child:
        return rollout_child_main(args)
    r = measure(args, progress=lambda s: print(f"fleet_waves: {s}", file=sys.stderr, flush=True))
    print_doc(r, args.json, render)
    return 0 if goal(r) else 1


if __name__ == "__main__":
    run(main)
