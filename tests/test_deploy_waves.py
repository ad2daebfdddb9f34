"""Wave rollouts against a real Mosquitto and 100 simulated agents (the real agent's command path).

Who got which command, who was rolled back and what the state file says after a restart are
asserted; never how long anything took.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgekit.bundle.keys import generate_keypair
from edgekit.deploy.publish import Artifact
from edgekit.deploy.sim_agents import AgentFleet, SimVersion
from edgekit.deploy.waves import (
    StateFile,
    WaveOptions,
    WaveRollout,
    WaveState,
    parse_waves,
    plan_waves,
    send_control,
)
from edgekit.errors import DeployError
from edgekit.protocol.broker import BrokerConfig
from edgekit.testing.mosquitto import Mosquitto

FLEET = "waves"
AGENTS = 100
GOOD = SimVersion("2.0", latency=0.5)
# Slow on every second device: agent-0001 (wave 1) holds, wave 2 has slow ones.
BAD = SimVersion("3.0", latency=0.5, slow_latency=2.0, slow_every=2)
SHA = {GOOD.version: "a" * 64, BAD.version: "b" * 64}


def artifact(v: SimVersion) -> Artifact:
    sha = SHA[v.version]
    url = f"http://127.0.0.1:9/artifacts/m-{v.version}.tar.gz"  # the simulated install downloads nothing
    return Artifact(f"m-{v.version}.tar.gz", Path("/nonexistent"), url, sha, 1000, "m", v.version, None)


def wait_for(check: Callable[[], Any], timeout: float, every: float = 0.1) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"not within {timeout} s")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("waves")
    broker = Mosquitto(tmp).start()
    private, public = generate_keypair(tmp / "keys" / "deploy")
    try:
        yield {"broker": broker, "tmp": tmp, "key": private, "pub": public}
    finally:
        broker.stop()


@pytest.fixture
def agents(world: dict[str, Any], request: pytest.FixtureRequest) -> Iterator[AgentFleet]:
    """A fresh fleet of 100 agents on version 1.0 (a fleet name per test: retained messages stay apart)."""
    fleet = AgentFleet(
        BrokerConfig.from_url(world["broker"].url),
        f"{FLEET}-{request.node.name[5:25].replace('_', '-')}",
        AGENTS,
        {SHA[v.version]: v for v in (GOOD, BAD)},
        trusted_keys=[world["pub"]],
        install_s=0.05,
        interval_s=0.5,
    )
    thread = threading.Thread(target=fleet.run, daemon=True)
    thread.start()
    assert fleet.ready.wait(60)
    try:
        yield fleet
    finally:
        fleet.stop()
        thread.join(30)


def rollout(world: dict[str, Any], fleet: AgentFleet, state: Path, window_s: float = 1.5) -> WaveRollout:
    options = WaveOptions(
        shares=parse_waves("1,10,50,100"),
        state_path=state,
        window_s=window_s,
        startup_grace_s=20,
        timeout_s=30,
    )
    return WaveRollout(fleet.fleet, world["broker"].url, options, sign_key=world["key"])


def deploys(fleet: AgentFleet, rid: str) -> dict[str, int]:
    return {d: sum(1 for c in cmds if c == ("deploy", rid)) for d, cmds in fleet.commands().items()}


def test_waves_are_planned_by_name_and_rise_to_everyone() -> None:
    devices = [f"d{i:03d}" for i in range(200)]
    waves = plan_waves(devices, parse_waves("1,10,50,100"))
    assert [len(w) for w in waves] == [2, 18, 80, 100]
    assert [d for w in waves for d in w] == sorted(devices)
    assert [len(w) for w in plan_waves(devices[:3], parse_waves("1,10,50,100"))] == [1, 1, 1]
    for bad in ("10,5,100", "1,10,50", "0,100", "x,100"):
        with pytest.raises(DeployError):
            parse_waves(bad)


def test_a_good_version_goes_out_wave_by_wave_to_every_agent(
    world: dict[str, Any], agents: AgentFleet, tmp_path: Path
) -> None:
    state = rollout(world, agents, tmp_path / "state.json").run(artifact(GOOD), "d-good-1")
    assert state.status == "deployed", state.reason
    assert [len(w) for w in state.waves] == [1, 9, 40, 50]
    assert [g["breach"] for g in state.gates] == [None] * 4
    assert [g["updated"] for g in state.gates] == [1, 10, 50, 100]
    assert all(g["frames"] > 0 and g["p95_ms"] <= g["limit_ms"] for g in state.gates)
    assert set(deploys(agents, "d-good-1").values()) == {1}  # each agent exactly once
    wait_for(lambda: set(agents.active().values()) == {"2.0"}, 10)
    assert not state.rolled_back
    saved = StateFile(tmp_path / "state.json").load()
    assert saved is not None and saved.status == "deployed" and len(saved.results) == AGENTS


def test_a_breach_in_wave_2_stops_the_rollout_and_rolls_back_who_switched(
    world: dict[str, Any], agents: AgentFleet, tmp_path: Path
) -> None:
    state = rollout(world, agents, tmp_path / "state.json").run(artifact(BAD), "d-bad-1")
    assert state.status == "breached"
    assert state.gates[0]["breach"] is None and state.gates[1]["breach"] is not None
    assert "p95" in state.reason or "missed" in state.reason
    first_two = state.waves[0] + state.waves[1]
    assert sorted(state.rolled_back) == sorted(first_two)
    assert all(r["ok"] for r in state.rolled_back.values())
    commands = agents.commands()
    for d, cmds in commands.items():
        if d in first_two:
            assert cmds == [("deploy", "d-bad-1"), ("rollback", "d-bad-1-rb")]
        else:
            assert cmds == []  # nobody beyond wave 2 got anything
    wait_for(lambda: set(agents.active().values()) == {"1.0"}, 10)


def test_pause_resume_and_abort_mid_rollout_roll_back_every_switched_agent(
    world: dict[str, Any], agents: AgentFleet, tmp_path: Path
) -> None:
    waves = rollout(world, agents, tmp_path / "state.json", window_s=2.0)
    out: list[WaveState] = []
    thread = threading.Thread(target=lambda: out.append(waves.run(artifact(GOOD), "d-abort-1")))
    thread.start()
    url = world["broker"].url
    try:
        wait_for(lambda: waves.state is not None and waves.state.wave == 1, 30)
        # The operator's command line: a retained message the rollout reads.
        cli = [sys.executable, "-m", "edgekit.cli", "deploy", "control", "pause", "--fleet", agents.fleet,
               "--id", "d-abort-1", "--mqtt", url, "--reason", "look at the dashboard"]  # fmt: skip
        done = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        wait_for(lambda: getattr(StateFile(tmp_path / "state.json").load(), "status", "") == "paused", 30)
        sent = len(waves.state.sent) if waves.state else 0
        time.sleep(1.0)
        assert waves.state is not None and len(waves.state.sent) == sent <= 10  # nothing more while paused
        send_control(url, agents.fleet, "d-abort-1", "resume")
        wait_for(
            lambda: waves.state is not None and waves.state.wave == 2 and len(waves.state.results) == 50, 30
        )
        send_control(url, agents.fleet, "d-abort-1", "abort", "enough")
    finally:
        thread.join(60)
    state = out[0]
    assert state.status == "aborted" and "wave 3" in state.reason
    assert sorted(state.rolled_back) == sorted(state.waves[0] + state.waves[1] + state.waves[2])
    for d in state.waves[3]:
        assert agents.commands()[d] == []
    wait_for(lambda: set(agents.active().values()) == {"1.0"}, 10)


CHILD = """
import sys
from pathlib import Path
from edgekit.deploy.publish import Artifact
from edgekit.deploy.waves import WaveOptions, WaveRollout, parse_waves
url, fleet, state, key, sha, db = sys.argv[1:7]
a = Artifact("m-2.0.tar.gz", Path("/nonexistent"), "http://127.0.0.1:9/artifacts/m-2.0.tar.gz", sha, 1000, "m", "2.0", None)
o = WaveOptions(parse_waves("1,10,50,100"), Path(state), db, window_s=1.5, startup_grace_s=20, timeout_s=30)
s = WaveRollout(fleet, url, o, sign_key=Path(key)).run(a, "d-restart-1")
print(s.status)
"""


def test_a_rollout_killed_mid_wave_continues_where_it_stopped_and_sends_nobody_twice(
    world: dict[str, Any], agents: AgentFleet, tmp_path: Path
) -> None:
    path = tmp_path / "state.json"
    db = tmp_path / "fleet.db"  # the fleet store keeps the state too
    args = [
        sys.executable,
        "-c",
        CHILD,
        world["broker"].url,
        agents.fleet,
        str(path),
        str(world["key"]),
        SHA["2.0"],
        str(db),
    ]
    first = subprocess.Popen(args)
    try:
        # Killed in wave 3: its commands out and results coming in, its gate not judged yet.
        wait_for(lambda: (s := StateFile(path).load()) is not None and len(s.results) > 10, 60, every=0.02)
    finally:
        first.kill()
        first.wait()
    before = StateFile(path).load()
    assert before is not None and before.status == "running" and before.wave == 2
    # Restarted where the file is not (another host): the store's copy is enough.
    path.unlink()
    kept = StateFile(path, str(db), fleet=agents.fleet)
    assert kept.load() == before
    kept.close()
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().endswith("deployed"), done.stderr[-2000:]
    after = StateFile(path).load()
    assert after is not None and after.status == "deployed" and after.restarts == 1
    assert set(before.results) <= set(after.results)  # results already in are kept
    assert len(after.results) == AGENTS and all(r["ok"] for r in after.results.values())
    counts = deploys(agents, "d-restart-1")
    assert max(counts.values()) == 1  # no agent got the command twice
    assert sum(counts.values()) == AGENTS
    assert json.loads(path.read_text())["id"] == "d-restart-1"


def test_a_fleet_store_out_of_reach_leaves_the_state_in_its_file(tmp_path: Path) -> None:
    said: list[str] = []
    store = StateFile(tmp_path / "s.json", "postgresql://edgekit@127.0.0.1:1/fleet", said.append, fleet="f")
    state = WaveState("f", "d-1", {"sha256": "a" * 64}, [1.0], [["cam-1"]], status="running")
    store.save(state)
    assert said and "cannot be opened" in said[0]
    assert store.load() == state and json.loads((tmp_path / "s.json").read_text())["id"] == "d-1"
