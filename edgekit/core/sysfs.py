"""Facts read from /sys and /dev: a file's text, the Coral Edge TPUs attached.

Low in the package on purpose: the LiteRT backend asks for Edge TPUs when it opens a
delegate, and host detection reports them; neither should import the other.
"""

from __future__ import annotations

from pathlib import Path

# Coral's USB accelerator before and after its firmware loads, and its PCIe/M.2 module.
EDGETPU_USB_IDS = {("1a6e", "089a"), ("18d1", "9302")}
EDGETPU_PCI_IDS = {("0x1ac1", "0x089a")}


def read_sysfs(path: Path) -> str | None:
    """A sysfs/procfs file's text, stripped (NULs too: device-tree strings end in one); None if unreadable."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").replace("\x00", "").strip()
    except OSError:
        return None


def edgetpu_devices(root: Path = Path("/")) -> tuple[str, ...]:
    """Coral Edge TPUs attached to this machine, named as the delegate wants them (``usb:0``, ``pci:0``)."""
    found: list[str] = []
    usb = root / "sys/bus/usb/devices"
    n = 0
    for dev in sorted(usb.iterdir()) if usb.is_dir() else ():
        ids = (read_sysfs(dev / "idVendor"), read_sysfs(dev / "idProduct"))
        if ids in EDGETPU_USB_IDS:
            found.append(f"usb:{n}")
            n += 1
    apex = sorted((root / "dev").glob("apex_*")) if (root / "dev").is_dir() else []
    pci = root / "sys/bus/pci/devices"
    pci_count = sum(
        (read_sysfs(d / "vendor"), read_sysfs(d / "device")) in EDGETPU_PCI_IDS
        for d in (pci.iterdir() if pci.is_dir() else ())
    )
    found += [f"pci:{i}" for i in range(max(len(apex), pci_count))]
    return tuple(found)
