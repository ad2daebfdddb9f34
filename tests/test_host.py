"""Host detection: files of real boards under a fixture root map to the right profile."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from edgekit.device.host import HostInfo, detect, match_profile, rank_profiles, read_host
from edgekit.device.profiles import all_profiles
from edgekit.errors import DetectionError

PI5_CPUINFO = "processor\t: 0\nCPU part\t: 0xd0b\n\nprocessor\t: 1\nCPU part\t: 0xd0b\n"


def board(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def usb_device(name: str, vendor: str, product: str) -> dict[str, str]:
    return {
        f"sys/bus/usb/devices/{name}/idVendor": vendor + "\n",
        f"sys/bus/usb/devices/{name}/idProduct": product + "\n",
    }


BOARDS = {
    "jetson-orin-nano": (
        "aarch64",
        {
            "proc/device-tree/model": "NVIDIA Jetson Orin Nano Developer Kit\x00",
            "etc/nv_tegra_release": "# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64\n",
        },
    ),
    "jetson-orin-agx": (
        "aarch64",
        {
            "proc/device-tree/model": "NVIDIA Jetson AGX Orin Developer Kit\x00",
            "etc/nv_tegra_release": "# R35 (release), REVISION: 4.1\n",
        },
    ),
    "jetson-nano": (
        "aarch64",
        {
            "proc/device-tree/model": "NVIDIA Jetson Nano Developer Kit\x00",
            "etc/nv_tegra_release": "# R32 (release), REVISION: 7.1\n",
        },
    ),
    "rpi5": (
        "aarch64",
        {"proc/device-tree/model": "Raspberry Pi 5 Model B Rev 1.0\x00", "proc/cpuinfo": PI5_CPUINFO},
    ),
    "rpi4": ("aarch64", {"proc/device-tree/model": "Raspberry Pi 4 Model B Rev 1.4\x00"}),
    "rpi4-coral-usb": (
        "aarch64",
        {
            "proc/device-tree/model": "Raspberry Pi 4 Model B Rev 1.4\x00",
            **usb_device("1-1.2", "1a6e", "089a"),
        },
    ),
    "coral-devboard": (
        "aarch64",
        {"proc/device-tree/model": "Freescale i.MX8MQ Phanbell\x00", "dev/apex_0": ""},
    ),
    "arm64-cpu": ("aarch64", {"proc/device-tree/model": "Some Unknown Board\x00"}),
    "x86_64-cpu": ("x86_64", {"proc/cpuinfo": "processor\t: 0\nmodel name\t: AMD EPYC 7B13\n"}),
}


@pytest.mark.parametrize("expected", sorted(BOARDS))
def test_board_files_map_to_their_profile(tmp_path: Path, expected: str) -> None:
    arch, files = BOARDS[expected]
    host = read_host(board(tmp_path, files), probe_runtimes=False, arch=arch)
    assert match_profile(host).name == expected


def test_jetson_facts_are_read(tmp_path: Path) -> None:
    arch, files = BOARDS["jetson-orin-nano"]
    host = read_host(board(tmp_path, files), probe_runtimes=False, arch=arch)
    assert host.device_tree_model == "NVIDIA Jetson Orin Nano Developer Kit"  # the NUL terminator is gone
    assert host.l4t_major == "R36"


def test_pi_cpu_part_is_named(tmp_path: Path) -> None:
    host = read_host(board(tmp_path, BOARDS["rpi5"][1]), probe_runtimes=False, arch="aarch64")
    assert host.cpu_model == "Cortex-A76" and host.cpu_count == 2


def test_edgetpu_after_firmware_load_and_on_pcie(tmp_path: Path) -> None:
    files = {
        **usb_device("2-1", "18d1", "9302"),
        **usb_device("2-2", "046d", "0825"),
        "sys/bus/pci/devices/0000:01:00.0/vendor": "0x1ac1\n",
        "sys/bus/pci/devices/0000:01:00.0/device": "0x089a\n",
    }
    host = read_host(board(tmp_path, files), probe_runtimes=False, arch="aarch64")
    assert host.edgetpu == ("usb:0", "pci:0")


def test_intel_npu_is_chosen_when_openvino_sees_an_npu(tmp_path: Path) -> None:
    host = read_host(board(tmp_path, BOARDS["x86_64-cpu"][1]), probe_runtimes=False, arch="x86_64")
    assert match_profile(host).name == "x86_64-cpu"
    with_npu = dataclasses.replace(host, openvino_devices=("CPU", "GPU", "NPU"))
    assert match_profile(with_npu).name == "intel-npu"


def test_more_specific_profile_ranks_first_and_generic_still_fits(tmp_path: Path) -> None:
    arch, files = BOARDS["rpi4-coral-usb"]
    host = read_host(board(tmp_path, files), probe_runtimes=False, arch=arch)
    names = [p.name for p in rank_profiles(host, all_profiles().values())]
    assert names[0] == "rpi4-coral-usb"
    assert names.index("rpi4") < names.index("arm64-cpu")


def test_unknown_architecture_is_a_clear_error(tmp_path: Path) -> None:
    host = read_host(tmp_path, probe_runtimes=False, arch="riscv64")
    with pytest.raises(DetectionError, match="no device profile fits this host") as err:
        match_profile(host)
    assert "--device" in err.value.hint


def test_detect_reads_this_machine_once() -> None:
    first = detect()
    assert isinstance(first, HostInfo) and first is detect()
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.arch = "sparc"  # type: ignore[misc]
    assert "CPUExecutionProvider" in first.ort_providers and "CPU" in first.openvino_devices
    assert match_profile(first).arch == first.arch


def test_openvino_is_probed_only_where_the_device_node_exists(tmp_path: Path) -> None:
    from edgekit.device.host import _may_have

    assert not _may_have("NPU", tmp_path) and not _may_have("GPU.0", tmp_path)
    assert _may_have("CPU", tmp_path)  # no node to look for: probe
    (tmp_path / "dev/accel").mkdir(parents=True)
    (tmp_path / "dev/accel/accel0").touch()
    assert _may_have("NPU", tmp_path) and not _may_have("GPU", tmp_path)
