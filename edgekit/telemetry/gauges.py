"""Device health gauges read from ``/proc`` and ``/sys``: CPU, memory, temperatures, throttling.

Everything is optional: a path that does not exist (a laptop has no SoC firmware node, a
container hides thermal zones) leaves its gauge out rather than reporting a made-up 0.
Paths covered: Linux thermal zones (x86, Jetson: ``CPU-therm``, ``GPU-therm``…; Raspberry
Pi: ``cpu-thermal``), Raspberry Pi firmware throttling flags, cpufreq current vs maximum.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

SYS = Path("/sys")
PROC = Path("/proc")
# Raspberry Pi firmware: bit 0 under-voltage, 1 frequency capped, 2 throttled, 3 soft temp limit
# (now); bits 16-19 the same "has occurred since boot".
RPI_THROTTLED = "devices/platform/soc/soc:firmware/get_throttled"
# Jetson GPU load in tenths of a percent: Nano/TX2/Xavier, then Orin's GA10B.
JETSON_GPU_LOAD = (
    "devices/gpu.0/load",
    "devices/platform/gpu.0/load",
    "devices/platform/17000000.ga10b/load",
    "devices/platform/17000000.gv11b/load",
)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


class Gauges:
    """Reads the gauges; CPU % is measured between two reads, so keep one instance."""

    def __init__(self, sys_root: Path = SYS, proc_root: Path = PROC) -> None:
        self.sys = sys_root
        self.proc = proc_root
        self._cpu = self._cpu_times()
        self._proc_cpu = (time.process_time(), time.monotonic())

    def _cpu_times(self) -> tuple[int, int] | None:
        line = (_read(self.proc / "stat") or "").splitlines()[:1]
        if not line or not line[0].startswith("cpu "):
            return None
        vals = [int(v) for v in line[0].split()[1:]]
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
        return sum(vals), idle

    def read(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        now = self._cpu_times()
        if now and self._cpu:
            total, idle = now[0] - self._cpu[0], now[1] - self._cpu[1]
            if total > 0:
                out["cpu_percent"] = round(100.0 * (total - idle) / total, 1)
        self._cpu = now
        cpu_t, wall = time.process_time(), time.monotonic()
        if wall > self._proc_cpu[1]:
            out["process_cpu_percent"] = round(
                100.0 * (cpu_t - self._proc_cpu[0]) / (wall - self._proc_cpu[1]), 1
            )
        self._proc_cpu = (cpu_t, wall)
        mem = {}
        for line in (_read(self.proc / "meminfo") or "").splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                mem[key] = int(rest.split()[0]) // 1024
        if mem:
            out["memory_total_mb"] = mem.get("MemTotal")
            out["memory_available_mb"] = mem.get("MemAvailable")
        statm = (_read(self.proc / "self" / "statm") or "").split()
        if len(statm) > 1:
            out["process_rss_mb"] = round(int(statm[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
        temps = {}
        for zone in sorted((self.sys / "class" / "thermal").glob("thermal_zone*")):
            kind, milli = _read(zone / "type"), _read(zone / "temp")
            if kind and milli and milli.lstrip("-").isdigit():
                temps[kind] = round(int(milli) / 1000, 1)
        if temps:
            out["temperature_c"] = temps
        flags = _read(self.sys / RPI_THROTTLED)
        if flags:
            value = int(flags, 16) if flags.startswith("0x") else int(flags)
            out["throttled"] = {
                "now": bool(value & 0xF),
                "since_boot": bool(value & 0xF0000),
                "under_voltage": bool(value & 0x1),
                "raw": value,
            }
        for gpu in JETSON_GPU_LOAD:
            load = _read(self.sys / gpu)
            if load and load.isdigit():
                out["gpu_percent"] = round(int(load) / 10, 1)  # tenths of a percent
                break
        cur = _read(self.sys / "devices/system/cpu/cpu0/cpufreq/scaling_cur_freq")
        top = _read(self.sys / "devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
        if cur and top and cur.isdigit() and top.isdigit() and int(top) > 0:
            out["cpu_freq_ratio"] = round(int(cur) / int(top), 3)
        return out
