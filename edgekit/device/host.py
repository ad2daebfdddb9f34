"""Read this machine once into a frozen description, and map it to the closest device profile.

``read_host(root)`` is a pure reader of files under ``root`` (``/`` on a real machine, a
directory of fixture files in tests); ``detect()`` caches it for the process.  Runtime
probes (OpenVINO devices, ONNX Runtime providers) are made only for runtimes that are
installed, and a probe that fails is recorded, not raised.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from edgekit.core.cpu import read_cpu
from edgekit.core.elf import normalize_arch
from edgekit.core.sysfs import edgetpu_devices, read_sysfs
from edgekit.device.profiles import DeviceProfile, all_profiles
from edgekit.errors import DetectionError


@dataclass(frozen=True)
class HostInfo:
    """What ``detect()`` found on this machine."""

    arch: str
    os: str
    cpu_model: str
    cpu_count: int
    memory_mb: int | None
    device_tree_model: str | None
    nv_tegra_release: str | None  # e.g. "R36 (release), REVISION: 4.0"
    edgetpu: tuple[str, ...]  # "usb:0", "pci:0", ...
    openvino_devices: tuple[str, ...]
    ort_providers: tuple[str, ...]
    #: The vector/matrix extensions that decide kernels and precisions (``edgekit.core.cpu.NOTABLE``),
    #: and what they add up to (``int8-dot``, ``bf16``, ``fp16``).
    cpu_flags: tuple[str, ...] = ()
    cpu_capabilities: tuple[str, ...] = ()

    @property
    def l4t_major(self) -> str | None:
        """The L4T release major (``R32`` = JetPack 4, ``R35`` = JetPack 5, ``R36`` = JetPack 6)."""
        return self.nv_tegra_release.split()[0].lstrip("#").strip() if self.nv_tegra_release else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "l4t_major": self.l4t_major}


def _cpu_model(text: str) -> str:
    for key in ("model name", "Hardware", "Model", "cpu model"):
        for line in text.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key and value.strip():
                return value.strip()
    # Many ARM boards print only a part number: 0xd0b is Cortex-A76, 0xd08 Cortex-A72 ...
    parts = {
        "0xd03": "Cortex-A53",
        "0xd07": "Cortex-A57",
        "0xd08": "Cortex-A72",
        "0xd0b": "Cortex-A76",
        "0xd41": "Cortex-A78",
        "0xd42": "Cortex-A78AE",
        "0xd4b": "Cortex-A78C",
    }
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "CPU part" and value.strip() in parts:
            return parts[value.strip()]
    return platform.processor() or "unknown"


def _memory_mb(root: Path) -> int | None:
    for line in (read_sysfs(root / "proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return None


def _openvino_devices() -> tuple[str, ...]:
    try:
        import openvino as ov
    except ImportError:
        return ()
    try:
        return tuple(ov.Core().available_devices)
    except Exception:  # noqa: BLE001 - a broken plugin must not stop detection; it shows as "no devices"
        return ()


def _ort_providers() -> tuple[str, ...]:
    try:
        import onnxruntime as ort
    except ImportError:
        return ()
    return tuple(ort.get_available_providers())


def read_host(root: Path = Path("/"), probe_runtimes: bool = True, arch: str | None = None) -> HostInfo:
    """Read the host under ``root``; with ``probe_runtimes`` also ask OpenVINO and ONNX Runtime what they see.

    ``arch`` overrides ``platform.machine()`` (for describing another machine from its files).
    """
    is_real = root == Path("/")
    cpuinfo = read_sysfs(root / "proc/cpuinfo") or ""  # read once: model, count and flags come from it
    cpu = read_cpu(root, arch, cpuinfo)
    tegra = (read_sysfs(root / "etc/nv_tegra_release") or "").lstrip("# ").splitlines()
    return HostInfo(
        arch=normalize_arch(arch or platform.machine()),
        os=platform.system().lower() if is_real else "linux",
        cpu_model=_cpu_model(cpuinfo),
        cpu_count=(os.cpu_count() or 1)
        if is_real
        else sum(line.startswith("processor") for line in cpuinfo.splitlines()),
        memory_mb=_memory_mb(root),
        device_tree_model=read_sysfs(root / "proc/device-tree/model") or None,
        nv_tegra_release=tegra[0] if tegra else None,
        edgetpu=edgetpu_devices(root),
        openvino_devices=_openvino_devices() if probe_runtimes else (),
        ort_providers=_ort_providers() if probe_runtimes else (),
        cpu_flags=cpu.notable,
        cpu_capabilities=cpu.capabilities,
    )


@cache
def detect() -> HostInfo:
    """This machine, read once per process (the hardware does not change under a running program)."""
    return read_host()


def _matches(profile: DeviceProfile, host: HostInfo) -> bool:
    m = profile.match
    if profile.arch != host.arch:
        return False
    if m.device_tree_model and not any(s in (host.device_tree_model or "") for s in m.device_tree_model):
        return False
    if m.nv_tegra_release and host.l4t_major not in m.nv_tegra_release:
        return False
    if m.edgetpu and not any(m.edgetpu == "any" or t.startswith(m.edgetpu) for t in host.edgetpu):
        return False
    return not (m.openvino_device and m.openvino_device not in host.openvino_devices)


def rank_profiles(host: HostInfo, profiles: Iterable[DeviceProfile]) -> list[DeviceProfile]:
    """Profiles this host satisfies, best first: more specific match first, then by name (deterministic)."""
    fits = [p for p in profiles if _matches(p, host)]
    return sorted(fits, key=lambda p: (-p.match.specificity, p.name))


# The device node an OpenVINO device needs on Linux.  Without it, probing OpenVINO cannot
# find that device, and the probe is what makes a cold start slow: importing OpenVINO and
# starting its Core took 0.45 s and ~35 MB of a 1.2 s start to the first label (x86_64).
_OPENVINO_DEVICE_NODES = {"NPU": "dev/accel/accel*", "GPU": "dev/dri/renderD*"}


def _may_have(openvino_device: str, root: Path = Path("/")) -> bool:
    pattern = _OPENVINO_DEVICE_NODES.get(openvino_device.split(".")[0].upper())
    return pattern is None or any(root.glob(pattern))


@cache
def _files_only() -> HostInfo:
    return read_host(probe_runtimes=False)


def match_profile(
    host: HostInfo | None = None, profiles: Mapping[str, DeviceProfile] | None = None
) -> DeviceProfile:
    """The profile closest to ``host`` (default: this machine).

    For this machine the runtimes are probed (``detect()``) only when a profile that fits
    it otherwise asks for an OpenVINO device whose device node exists.
    """
    found = profiles or all_profiles()
    if host is None:
        host = _files_only()
        if any(
            p.match.openvino_device
            and _may_have(p.match.openvino_device)
            and _matches(p, replace(host, openvino_devices=(p.match.openvino_device,)))
            for p in found.values()
        ):
            host = detect()
    ranked = rank_profiles(host, found.values())
    if not ranked:
        raise DetectionError(
            f"no device profile fits this host (arch {host.arch}, model {host.device_tree_model or host.cpu_model})",
            "pass --device NAME, or add a profile for it to a directory in EDGEKIT_DEVICES_PATH",
        )
    return ranked[0]
