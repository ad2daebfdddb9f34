"""What the OS does to a paced runtime's latency, and what to set: ``edgekit doctor``'s latency section.

At 30 fps a runtime idles ~30 ms between frames.  In that gap the cores drop their clock
(the cpufreq governor) and enter idle states (cpuidle); the next inference pays the wake-up
and the clock ramp.  ``read_latency_os(root)`` reads what decides this: the cpufreq governor
per CPU, the cpuidle driver, governor and states, the kernel command line flags that limit
them, and on a Jetson its power mode.  It is a pure reader of files under ``root`` (``/`` on a
real machine, a fixture tree in tests) plus, on a Jetson, ``nvpmodel -q`` and
``jetson_clocks --show``; it changes nothing.  The advice says what to set and why.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgekit.core.sysfs import read_sysfs

NO_CPUFREQ = "no cpufreq (virtual machine or fixed clock)"
#: Governors that lower the clock while the runtime waits for the next frame.
SCALING_GOVERNORS = frozenset({"powersave", "ondemand", "schedutil", "conservative"})
#: Kernel command line flags that decide idle states, clock ticks and which CPUs the scheduler uses.
CMDLINE_FLAGS = (
    "idle",
    "intel_idle.max_cstate",
    "processor.max_cstate",
    "cpuidle.off",
    "nohz_full",
    "isolcpus",
    "cpuidle_haltpoll.force",
    "haltpoll.guest_halt_poll_ns",
)
_TOOL_TIMEOUT_S = 5.0
_TOOL_OUTPUT_CHARS = 4000  # jetson_clocks --show lists every CPU, GPU and EMC clock: enough, bounded


@dataclass(frozen=True)
class CpuFreq:
    """One CPU's clock policy (frequencies in kHz, as sysfs gives them)."""

    cpu: str
    governor: str | None
    driver: str | None
    cur_khz: int | None
    min_khz: int | None
    max_khz: int | None


@dataclass(frozen=True)
class IdleState:
    """One cpuidle state of cpu0: exit latency and target residency in µs; ``usage`` counts entries."""

    index: int
    name: str | None
    desc: str | None
    latency_us: int | None
    residency_us: int | None
    disabled: bool | None
    usage: int | None


@dataclass(frozen=True)
class CpuIdle:
    """The cpuidle driver and governor, cpu0's states, and whether other CPUs' states differ."""

    driver: str | None
    governor: str | None
    states: tuple[IdleState, ...]
    cpus_differ: bool
    haltpoll: dict[str, str] = field(default_factory=dict)  # /sys/module/haltpoll/parameters (VM guests)


@dataclass(frozen=True)
class ToolRun:
    """A read-only Jetson tool's output (bounded); ``rc`` None when it could not be run or timed out."""

    command: str
    rc: int | None
    output: str


@dataclass(frozen=True)
class Jetson:
    """A Jetson's power mode and clocks, from ``/etc/nv_tegra_release`` and its tools where present."""

    nv_tegra_release: str | None
    power_mode: str | None  # "15W", "MAXN"
    power_mode_id: int | None
    nvpmodel: ToolRun | None
    jetson_clocks: ToolRun | None


@dataclass(frozen=True)
class Advice:
    """A finding, what to set (None: nothing to set, a fact worth knowing) and why it matters."""

    finding: str
    set: str | None
    why: str


@dataclass(frozen=True)
class LatencyOS:
    """What the OS does to latency between frames, and the advice that follows."""

    frame_ms: float
    cpufreq: tuple[CpuFreq, ...]
    cpufreq_note: str | None
    cpuidle: CpuIdle | None
    cmdline: dict[str, str]
    jetson: Jetson | None
    advice: tuple[Advice, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _cpu_dirs(root: Path) -> list[Path]:
    base = root / "sys/devices/system/cpu"
    try:
        dirs = [d for d in base.iterdir() if d.name.startswith("cpu") and d.name[3:].isdigit()]
    except OSError:
        return []
    return sorted(dirs, key=lambda d: int(d.name[3:]))


def read_cpufreq(root: Path = Path("/")) -> tuple[CpuFreq, ...]:
    """Each CPU's governor, driver and cur/min/max clock; empty where cpufreq is absent."""
    found = []
    for cpu in _cpu_dirs(root):
        f = cpu / "cpufreq"
        governor = read_sysfs(f / "scaling_governor")
        driver = read_sysfs(f / "scaling_driver")
        if governor is None and driver is None:
            continue
        found.append(
            CpuFreq(
                cpu=cpu.name,
                governor=governor,
                driver=driver,
                cur_khz=_int(read_sysfs(f / "scaling_cur_freq")),
                min_khz=_int(read_sysfs(f / "scaling_min_freq")),
                max_khz=_int(read_sysfs(f / "scaling_max_freq")),
            )
        )
    return tuple(found)


def _states(cpu: Path) -> tuple[IdleState, ...]:
    base = cpu / "cpuidle"
    try:
        dirs = [d for d in base.iterdir() if d.name.startswith("state") and d.name[5:].isdigit()]
    except OSError:
        return ()
    states = []
    for d in sorted(dirs, key=lambda d: int(d.name[5:])):
        disable = read_sysfs(d / "disable")
        states.append(
            IdleState(
                index=int(d.name[5:]),
                name=read_sysfs(d / "name"),
                desc=read_sysfs(d / "desc"),
                latency_us=_int(read_sysfs(d / "latency")),
                residency_us=_int(read_sysfs(d / "residency")),
                disabled=None if disable is None else disable != "0",
                usage=_int(read_sysfs(d / "usage")),
            )
        )
    return tuple(states)


def read_cpuidle(root: Path = Path("/")) -> CpuIdle | None:
    """The cpuidle driver, governor and cpu0's states; None where the kernel has no cpuidle."""
    base = root / "sys/devices/system/cpu/cpuidle"
    driver = read_sysfs(base / "current_driver")
    governor = read_sysfs(base / "current_governor_ro") or read_sysfs(base / "current_governor")
    cpus = _cpu_dirs(root)
    states = _states(cpus[0]) if cpus else ()
    if driver is None and governor is None and not states:
        return None

    # Usage counters differ on every CPU; what matters is whether the states on offer do.
    def offered(cpu: Path) -> list[tuple[str | None, int | None, bool | None]]:
        return [(s.name, s.latency_us, s.disabled) for s in _states(cpu)]

    first = offered(cpus[0]) if cpus else []
    differ = any(offered(cpu) != first for cpu in cpus[1:])
    params = root / "sys/module/haltpoll/parameters"
    haltpoll: dict[str, str] = {}
    try:
        for p in sorted(params.iterdir()):
            value = read_sysfs(p)
            if value is not None:
                haltpoll[p.name] = value
    except OSError:
        pass
    return CpuIdle(driver=driver, governor=governor, states=states, cpus_differ=differ, haltpoll=haltpoll)


def parse_cmdline(text: str) -> dict[str, str]:
    """The latency-relevant flags of a kernel command line (a bare flag maps to "")."""
    flags: dict[str, str] = {}
    for word in text.split():
        if word == "--":  # what follows is init's arguments, not the kernel's
            break
        key, _, value = word.partition("=")
        if key in CMDLINE_FLAGS:
            flags[key] = value
    return flags


def _run_tool(argv: list[str]) -> ToolRun | None:
    """Run a read-only tool found on PATH, bounded in time and output; None if it is not installed."""
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    command = " ".join(argv)
    try:
        done = subprocess.run(
            [exe, *argv[1:]], capture_output=True, text=True, errors="replace", timeout=_TOOL_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return ToolRun(command, None, f"timed out after {_TOOL_TIMEOUT_S:g} s")
    except OSError as err:
        return ToolRun(command, None, str(err))
    output = (done.stdout + done.stderr).strip()
    return ToolRun(command, done.returncode, output[:_TOOL_OUTPUT_CHARS])


def _power_mode(nvpmodel: ToolRun | None) -> tuple[str | None, int | None]:
    # nvpmodel -q prints "NV Power Mode: 15W" and the mode's number on the next line.
    if nvpmodel is None or nvpmodel.rc != 0:
        return None, None
    m = re.search(r"NV Power Mode:\s*(\S+)\s*\n\s*(\d+)", nvpmodel.output)
    if m:
        return m.group(1), int(m.group(2))
    m = re.search(r"NV Power Mode:\s*(\S+)", nvpmodel.output)
    return (m.group(1) if m else None), None


def read_jetson(root: Path = Path("/")) -> Jetson | None:
    """A Jetson's release and power mode; None on anything else.  ``jetson_clocks`` runs only with
    ``--show``: without it, it pins every clock at its maximum."""
    release = read_sysfs(root / "etc/nv_tegra_release")
    nvpmodel = _run_tool(["nvpmodel", "-q"])
    if release is None and nvpmodel is None:
        return None
    clocks = _run_tool(["jetson_clocks", "--show"])
    mode, mode_id = _power_mode(nvpmodel)
    first = release.lstrip("# ").splitlines()[0] if release else None
    return Jetson(
        nv_tegra_release=first,
        power_mode=mode,
        power_mode_id=mode_id,
        nvpmodel=nvpmodel,
        jetson_clocks=clocks,
    )


def _cpu_list(cpus: list[str]) -> str:
    return ", ".join(cpus) if len(cpus) <= 4 else f"{len(cpus)} CPUs ({cpus[0]}..{cpus[-1]})"


def _clock_advice(cpufreq: tuple[CpuFreq, ...], jetson: Jetson | None) -> list[Advice]:
    if jetson is not None:
        # jetson_clocks sets min = max on every CPU (and the GPU and memory clocks), so the governor stops mattering.
        unpinned = [f.cpu for f in cpufreq if f.min_khz is not None and f.min_khz != f.max_khz]
        low_mode = jetson.power_mode_id not in (None, 0)
        if not (low_mode or unpinned):
            return []
        found = []
        if low_mode:
            found.append(f"power mode {jetson.power_mode or '?'} (nvpmodel mode {jetson.power_mode_id})")
        if unpinned:
            found.append(f"clocks not pinned on {_cpu_list(unpinned)} (min < max)")
        return [
            Advice(
                finding="Jetson: " + "; ".join(found),
                set=("sudo nvpmodel -m 0 && " if low_mode else "") + "sudo jetson_clocks",
                why="mode 0 is the fastest power mode on most modules (see /etc/nvpmodel.conf); jetson_clocks "
                "holds CPU, GPU and memory clocks at that mode's maximum until reboot, so a frame "
                "after an idle gap does not start on a low clock (sudo jetson_clocks --store first "
                "to --restore later)",
            )
        ]
    by_governor: dict[str, list[str]] = {}
    for f in cpufreq:
        if f.governor in SCALING_GOVERNORS:
            by_governor.setdefault(f.governor, []).append(f.cpu)
    return [
        Advice(
            finding=f"cpufreq governor {gov} on {_cpu_list(cpus)}"
            + (f" (driver {cpufreq[0].driver})" if cpufreq[0].driver else ""),
            set="sudo cpupower frequency-set -g performance",
            why=f"{gov} lowers the clock while the runtime waits for the next frame; each inference "
            "then starts slow and pays the ramp-up, which shows as jitter in p95/p99",
        )
        for gov, cpus in by_governor.items()
    ]


def _idle_advice(idle: CpuIdle | None, frame_ms: float) -> list[Advice]:
    if idle is None:
        return []
    advice = []
    if idle.driver == "haltpoll" or idle.haltpoll:
        advice.append(
            Advice(
                finding=f"virtual machine guest (cpuidle driver {idle.driver or '-'})",
                set=None,
                why="an idle vCPU is descheduled by the host: its wake-up cost is the hypervisor's and "
                "no guest setting removes it; measure on the device",
            )
        )
    # Like tuned's latency-performance profile: allow the shallowest real sleep (C1), nothing deeper.
    real = [s for s in idle.states if s.latency_us is not None and s.latency_us > 0]
    if not real:
        return advice
    allowed = min(s.latency_us or 0 for s in real)
    slack_us = frame_ms * 1000.0
    # The governor enters a state only when it expects to idle at least its target residency:
    # every enabled state whose residency fits in the gap between frames will be used.
    deep = [
        s
        for s in real
        if (s.latency_us or 0) > allowed
        and s.disabled is not True
        and (s.residency_us is None or s.residency_us < slack_us)
    ]
    if deep:
        names = ", ".join(f"{s.name} ({s.latency_us} µs)" for s in deep)
        advice.append(
            Advice(
                finding=f"idle states deeper than {allowed} µs are enabled: {names}",
                set=f"hold /dev/cpu_dma_latency at {allowed} µs while the runtime runs (PM QoS; "
                f"tuned-adm profile latency-performance does this), or sudo cpupower idle-set -D {allowed + 1}",
                why=f"in the ~{frame_ms:.0f} ms between frames the cores reach these states; waking "
                "takes their exit latency plus cold caches, paid by the next inference",
            )
        )
    return advice


def _cmdline_advice(cmdline: dict[str, str]) -> list[Advice]:
    advice = []
    if cmdline.get("idle") == "poll":
        advice.append(
            Advice(
                finding="idle=poll on the kernel command line: idle cores spin instead of sleeping",
                set=None,
                why="no wake-up cost at all, at full power and heat; a passively cooled device "
                "may throttle its clock instead",
            )
        )
    cpus = cmdline.get("isolcpus") or cmdline.get("nohz_full")
    if cpus:
        advice.append(
            Advice(
                finding=f"isolated CPUs on the kernel command line: {cpus}",
                set=f"pin the runtime there: taskset -c <CPUs of {cpus}> edgekit run ...",
                why="the kernel keeps other work and timer ticks off those CPUs, which helps only "
                "a runtime that runs on them",
            )
        )
    return advice


def read_latency_os(root: Path = Path("/"), frame_ms: float = 1000.0 / 30) -> LatencyOS:
    """What the OS does to latency on this machine (files under ``root``), and what to set.

    ``frame_ms`` is the frame period whose idle gap the cores sleep through (30 fps by default).
    Advice only: nothing is changed."""
    cpufreq = read_cpufreq(root)
    idle = read_cpuidle(root)
    cmdline = parse_cmdline(read_sysfs(root / "proc/cmdline") or "")
    jetson = read_jetson(root)
    advice = _clock_advice(cpufreq, jetson) + _idle_advice(idle, frame_ms) + _cmdline_advice(cmdline)
    return LatencyOS(
        frame_ms=frame_ms,
        cpufreq=cpufreq,
        cpufreq_note=None if cpufreq else NO_CPUFREQ,
        cpuidle=idle,
        cmdline=cmdline,
        jetson=jetson,
        advice=tuple(advice),
    )
