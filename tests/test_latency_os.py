"""What the OS does to latency (``edgekit doctor``'s ``latency_os``), read from fake /sys and /proc trees:
a laptop (intel_pstate powersave, C-states), a VM guest (haltpoll, no cpufreq), a Jetson (fake
``nvpmodel`` and ``jetson_clocks`` on PATH), and trees that are missing or unreadable."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgekit.device import latency_os
from edgekit.device.latency_os import NO_CPUFREQ, LatencyOS, read_latency_os
from edgekit.device.profiles import get_profile

CPU = "sys/devices/system/cpu"
# name, desc, exit latency µs, target residency µs (an Alder Lake laptop's intel_idle table, trimmed)
LAPTOP_STATES = [
    ("POLL", "CPUIDLE CORE POLL IDLE", 0, 0),
    ("C1", "MWAIT 0x00", 1, 1),
    ("C1E", "MWAIT 0x01", 2, 4),
    ("C3", "MWAIT 0x10", 70, 100),
    ("C6", "MWAIT 0x20", 85, 200),
]


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def write_states(
    root: Path, cpu: int, states: Iterable[tuple[str, str, int, int]], disabled: set[str]
) -> None:
    for i, (name, desc, latency, residency) in enumerate(states):
        base = f"{CPU}/cpu{cpu}/cpuidle/state{i}"
        write(root, f"{base}/name", name)
        write(root, f"{base}/desc", desc)
        write(root, f"{base}/latency", str(latency))
        write(root, f"{base}/residency", str(residency))
        write(root, f"{base}/disable", "1" if name in disabled else "0")
        write(root, f"{base}/usage", str(1000 * (i + 1) + cpu))  # differs per CPU, as on a real machine


def laptop(root: Path, disabled: set[str] | None = None, cpu1_disabled: set[str] | None = None) -> Path:
    for cpu in range(4):
        f = f"{CPU}/cpu{cpu}/cpufreq"
        write(root, f"{f}/scaling_governor", "powersave")
        write(root, f"{f}/scaling_driver", "intel_pstate")
        write(root, f"{f}/scaling_cur_freq", "800000")
        write(root, f"{f}/scaling_min_freq", "400000")
        write(root, f"{f}/scaling_max_freq", "4700000")
        off = cpu1_disabled if cpu == 1 and cpu1_disabled is not None else disabled or set()
        write_states(root, cpu, LAPTOP_STATES, off)
    write(root, f"{CPU}/cpuidle/current_driver", "intel_idle")
    write(root, f"{CPU}/cpuidle/current_governor_ro", "menu")
    write(
        root,
        "proc/cmdline",
        "BOOT_IMAGE=/vmlinuz-6.8.0 root=UUID=1234 ro quiet splash processor.max_cstate=6",
    )
    return root


def vm(root: Path, governor_file: str = "current_governor_ro") -> Path:
    for cpu in range(2):
        write_states(
            root, cpu, [("POLL", "CPUIDLE CORE POLL IDLE", 0, 0), ("haltpoll idle", "default", 1, 1)], set()
        )
    write(root, f"{CPU}/cpuidle/current_driver", "haltpoll")
    write(root, f"{CPU}/cpuidle/{governor_file}", "haltpoll")
    write(root, "sys/module/haltpoll/parameters/guest_halt_poll_ns", "0")
    write(root, "sys/module/haltpoll/parameters/guest_halt_poll_grow", "2")
    # After "--" come init's arguments: an isolcpus there is not the kernel's.
    write(
        root,
        "proc/cmdline",
        "console=ttyS0 quiet cpuidle_haltpoll.force=1 haltpoll.guest_halt_poll_ns=0 -- --init isolcpus=1",
    )
    return root


@pytest.fixture
def no_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty PATH: a real nvpmodel on the machine running the tests must not leak into a fake tree."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def set_of(report: LatencyOS) -> list[str | None]:
    return [a.set for a in report.advice]


@pytest.mark.usefixtures("no_tools")
def test_laptop_powersave_and_deep_c_states(tmp_path: Path) -> None:
    r = read_latency_os(laptop(tmp_path))
    assert [f.cpu for f in r.cpufreq] == ["cpu0", "cpu1", "cpu2", "cpu3"]
    assert {(f.governor, f.driver, f.min_khz, f.max_khz) for f in r.cpufreq} == {
        ("powersave", "intel_pstate", 400000, 4700000)
    }
    assert r.cpufreq_note is None and r.jetson is None
    assert r.cpuidle is not None
    assert (r.cpuidle.driver, r.cpuidle.governor, r.cpuidle.cpus_differ) == ("intel_idle", "menu", False)
    assert [(s.name, s.latency_us, s.residency_us, s.disabled) for s in r.cpuidle.states] == [
        (name, lat, res, False) for name, _, lat, res in LAPTOP_STATES
    ]
    assert r.cmdline == {"processor.max_cstate": "6"}

    gov, idle = r.advice
    assert "powersave" in gov.finding and "cpu0, cpu1, cpu2, cpu3" in gov.finding
    assert gov.set == "sudo cpupower frequency-set -g performance"
    # C1 (1 µs) is what tuned's latency-performance keeps; everything deeper is named.
    assert "C1E (2 µs), C3 (70 µs), C6 (85 µs)" in idle.finding and "C1 (1 µs)" not in idle.finding
    assert idle.set is not None
    assert "/dev/cpu_dma_latency at 1 µs" in idle.set and "cpupower idle-set -D 2" in idle.set


@pytest.mark.usefixtures("no_tools")
def test_only_states_the_frame_gap_reaches_and_that_are_enabled(tmp_path: Path) -> None:
    # C6 disabled by the user: not advised against again.
    r = read_latency_os(laptop(tmp_path / "a", disabled={"C6"}))
    assert "C6" not in r.advice[-1].finding and "C3 (70 µs)" in r.advice[-1].finding
    # A 150 µs gap between frames is shorter than C6's 200 µs residency: the governor never picks it.
    r = read_latency_os(laptop(tmp_path / "b"), frame_ms=0.15)
    assert "C6" not in r.advice[-1].finding and "C3 (70 µs)" in r.advice[-1].finding
    # Every deep state disabled: nothing left to say about idle states, the governor still.
    r = read_latency_os(laptop(tmp_path / "c", disabled={"C1E", "C3", "C6"}))
    assert set_of(r) == ["sudo cpupower frequency-set -g performance"]


@pytest.mark.usefixtures("no_tools")
def test_cpus_whose_states_differ_are_flagged(tmp_path: Path) -> None:
    r = read_latency_os(laptop(tmp_path, cpu1_disabled={"C6"}))
    assert r.cpuidle is not None and r.cpuidle.cpus_differ is True


@pytest.mark.usefixtures("no_tools")
@pytest.mark.parametrize("governor_file", ["current_governor_ro", "current_governor"])
def test_vm_guest_haltpoll_without_cpufreq(tmp_path: Path, governor_file: str) -> None:
    r = read_latency_os(vm(tmp_path, governor_file))
    assert r.cpufreq == () and r.cpufreq_note == NO_CPUFREQ
    assert r.cpuidle is not None
    assert (r.cpuidle.driver, r.cpuidle.governor) == ("haltpoll", "haltpoll")
    assert [(s.name, s.latency_us) for s in r.cpuidle.states] == [("POLL", 0), ("haltpoll idle", 1)]
    assert r.cpuidle.haltpoll == {"guest_halt_poll_grow": "2", "guest_halt_poll_ns": "0"}
    assert r.cmdline == {"cpuidle_haltpoll.force": "1", "haltpoll.guest_halt_poll_ns": "0"}
    # Nothing deeper than the one halt state, no clock governor: only the fact that the host decides.
    (only,) = r.advice
    assert "virtual machine" in only.finding and only.set is None


@pytest.mark.usefixtures("no_tools")
def test_isolated_cpus_and_idle_poll_on_the_kernel_command_line(tmp_path: Path) -> None:
    write(tmp_path, "proc/cmdline", "ro idle=poll isolcpus=2-3 nohz_full=2-3 intel_idle.max_cstate=1")
    r = read_latency_os(tmp_path)
    assert r.cmdline == {"idle": "poll", "isolcpus": "2-3", "nohz_full": "2-3", "intel_idle.max_cstate": "1"}
    poll, iso = r.advice
    assert "idle=poll" in poll.finding and poll.set is None
    assert "2-3" in iso.finding and iso.set is not None and "taskset" in iso.set


def jetson_tools(bin_dir: Path, mode: str, mode_id: int) -> Path:
    """Fake nvpmodel and jetson_clocks; jetson_clocks logs its arguments so the test sees how it was run."""
    bin_dir.mkdir()
    log = bin_dir / "jetson_clocks.log"
    (bin_dir / "nvpmodel").write_text(
        f'#!/bin/sh\necho "NV Fan Mode:quiet"\necho "NV Power Mode: {mode}"\necho {mode_id}\n'
    )
    (bin_dir / "jetson_clocks").write_text(
        f'#!/bin/sh\necho "$@" >> "{log}"\necho "cpu0: Online=1 Governor=schedutil"\n'
    )
    for tool in ("nvpmodel", "jetson_clocks"):
        (bin_dir / tool).chmod(0o755)
    return log


def jetson_tree(root: Path, pinned: bool) -> Path:
    write(
        root, "etc/nv_tegra_release", "# R36 (release), REVISION: 4.0, GCID: 1, BOARD: generic, EABI: aarch64"
    )
    for cpu in range(6):
        f = f"{CPU}/cpu{cpu}/cpufreq"
        write(root, f"{f}/scaling_governor", "schedutil")
        write(root, f"{f}/scaling_driver", "tegra194")
        write(root, f"{f}/scaling_min_freq", "1510400" if pinned else "115200")
        write(root, f"{f}/scaling_max_freq", "1510400")
    return root


def test_jetson_in_a_low_power_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = jetson_tools(tmp_path / "bin", "7W", 1)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    r = read_latency_os(jetson_tree(tmp_path / "root", pinned=False))
    assert r.jetson is not None
    assert r.jetson.nv_tegra_release == "R36 (release), REVISION: 4.0, GCID: 1, BOARD: generic, EABI: aarch64"
    assert (r.jetson.power_mode, r.jetson.power_mode_id) == ("7W", 1)
    assert r.jetson.jetson_clocks is not None and "Governor=schedutil" in r.jetson.jetson_clocks.output
    # jetson_clocks without --show would pin the clocks: doctor only ever asks it to show them.
    assert log.read_text().split("\n") == ["--show", ""]
    # On a Jetson, jetson_clocks replaces the governor advice (it pins min = max).
    assert set_of(r) == ["sudo nvpmodel -m 0 && sudo jetson_clocks"]
    assert "7W" in r.advice[0].finding and "6 CPUs" in r.advice[0].finding


def test_jetson_at_mode_0_with_clocks_pinned_needs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jetson_tools(tmp_path / "bin", "MAXN", 0)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    r = read_latency_os(jetson_tree(tmp_path / "root", pinned=True))
    assert r.jetson is not None and (r.jetson.power_mode, r.jetson.power_mode_id) == ("MAXN", 0)
    assert r.advice == ()
    # Mode 0 but clocks free to drop: jetson_clocks alone.
    r = read_latency_os(jetson_tree(tmp_path / "root2", pinned=False))
    assert set_of(r) == ["sudo jetson_clocks"]


@pytest.mark.usefixtures("no_tools")
def test_jetson_without_its_tools_is_known_by_its_release_file(tmp_path: Path) -> None:
    r = read_latency_os(jetson_tree(tmp_path, pinned=False))
    assert r.jetson is not None and r.jetson.nvpmodel is None and r.jetson.power_mode is None
    assert set_of(r) == ["sudo jetson_clocks"]


def test_a_tool_that_hangs_or_floods_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvpmodel").write_text("#!/bin/sh\nexec sleep 30\n")
    (bin_dir / "jetson_clocks").write_text("#!/bin/sh\nhead -c 100000 /dev/zero | tr '\\0' x\n")
    for tool in ("nvpmodel", "jetson_clocks"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.defpath}")  # sleep, head, tr
    monkeypatch.setattr(latency_os, "_TOOL_TIMEOUT_S", 0.5)
    r = read_latency_os(tmp_path / "no-such-root")
    assert r.jetson is not None and r.jetson.nvpmodel is not None and r.jetson.jetson_clocks is not None
    assert r.jetson.nvpmodel.rc is None and "timed out" in r.jetson.nvpmodel.output
    assert r.jetson.power_mode is None
    assert (
        r.jetson.jetson_clocks.rc == 0 and len(r.jetson.jetson_clocks.output) == latency_os._TOOL_OUTPUT_CHARS
    )


@pytest.mark.usefixtures("no_tools")
def test_missing_tree_reports_nothing_and_raises_nothing(tmp_path: Path) -> None:
    r = read_latency_os(tmp_path / "no-such-root")
    assert (r.cpufreq, r.cpufreq_note, r.cpuidle, r.cmdline, r.jetson, r.advice) == (
        (),
        NO_CPUFREQ,
        None,
        {},
        None,
        (),
    )
    json.dumps(r.to_dict())  # what doctor --json prints


@pytest.mark.usefixtures("no_tools")
def test_unreadable_files_are_unknown_not_errors(tmp_path: Path) -> None:
    laptop(tmp_path)
    # A directory where a file should be cannot be read (as root, chmod 000 still can).
    for rel in (f"{CPU}/cpu0/cpufreq/scaling_governor", f"{CPU}/cpuidle/current_driver", "proc/cmdline"):
        (tmp_path / rel).unlink()
        (tmp_path / rel).mkdir()
    write(tmp_path, f"{CPU}/cpu0/cpuidle/state3/latency", "garbage")
    r = read_latency_os(tmp_path)
    assert r.cpufreq[0].governor is None and r.cpufreq[0].driver == "intel_pstate"
    assert r.cpuidle is not None and r.cpuidle.driver is None and r.cpuidle.states[3].latency_us is None
    assert r.cmdline == {}
    # The other three CPUs still say powersave; the unreadable C3 is not guessed at.
    assert "cpu1, cpu2, cpu3" in r.advice[0].finding and "cpu0" not in r.advice[0].finding
    assert "C3" not in r.advice[1].finding and "C6 (85 µs)" in r.advice[1].finding


@pytest.mark.usefixtures("no_tools")
def test_edgekit_doctor_carries_latency_os(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgekit.cli import app
    from edgekit.selection import doctor

    tree = laptop(tmp_path / "laptop")
    seen: list[float] = []

    def fake(root: Path = Path("/"), frame_ms: float = 1000.0 / 30) -> LatencyOS:
        seen.append(frame_ms)
        return read_latency_os(tree, frame_ms)

    monkeypatch.setattr(doctor, "read_latency_os", fake)
    runner = CliRunner()
    r = runner.invoke(app, ["doctor", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    lat = report["latency_os"]
    assert [f["governor"] for f in lat["cpufreq"]] == ["powersave"] * 4
    assert [s["name"] for s in lat["cpuidle"]["states"]] == [s[0] for s in LAPTOP_STATES]
    assert len(lat["advice"]) == 2 and lat["advice"][0]["set"] == "sudo cpupower frequency-set -g performance"
    # The frame gap is the matched profile's budget (its frame period).
    assert seen == [get_profile(report["profile"]).budget_ms] and lat["frame_ms"] == seen[0]

    r = runner.invoke(app, ["doctor"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())  # rich wraps at the runner's 80 columns
    assert "What the OS does to latency" in text
    assert "cpufreq governor powersave" in text and "intel_idle/menu: POLL 0 µs, C1 1 µs" in text
    assert "set: sudo cpupower frequency-set -g performance" in text
