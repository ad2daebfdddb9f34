"""Read what a shared library was built for from its ELF header, without loading it.

Loading a library built for another CPU fails inside ``dlopen`` with a misleading
"cannot open shared object file: No such file or directory", and loading a truncated
one can kill the process with SIGBUS.  Reading the headers first turns both into clear
errors ("built for aarch64, this host is x86_64"; "truncated").
"""

from __future__ import annotations

import platform
import struct
from dataclasses import dataclass
from pathlib import Path

# e_machine values from the System V ABI (elf.h: EM_*).
MACHINES = {0x03: "x86", 0x28: "armv7l", 0x3E: "x86_64", 0xB7: "aarch64", 0xF3: "riscv64"}
_ALIASES = {
    "amd64": "x86_64",
    "x64": "x86_64",
    "arm64": "aarch64",
    "armv8l": "armv7l",
    "armv7": "armv7l",
    "armv6l": "armv7l",
}
_PT_LOAD = 1


def normalize_arch(machine: str) -> str:
    """One spelling per architecture: ``AMD64`` -> ``x86_64``, ``arm64`` -> ``aarch64``."""
    m = machine.strip().lower()
    return _ALIASES.get(m, m)


def host_arch() -> str:
    """This machine's architecture, normalized."""
    return normalize_arch(platform.machine())


@dataclass(frozen=True)
class ElfInfo:
    """The architecture an ELF file targets, and whether everything its headers promise is in the file."""

    arch: str
    complete: bool


def read_elf(path: Path) -> ElfInfo | None:
    """Read the ELF headers of ``path``; ``None`` when the file is not ELF."""
    data = Path(path).read_bytes()
    if len(data) < 52 or data[:4] != b"\x7fELF":
        return None
    is64, order = data[4] == 2, "<" if data[5] == 1 else ">"
    (machine,) = struct.unpack_from(order + "H", data, 18)
    arch = MACHINES.get(machine, f"unknown ELF machine 0x{machine:x}")
    try:
        if is64:
            phoff, shoff = struct.unpack_from(order + "QQ", data, 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", data, 54)
            segments = [
                struct.unpack_from(order + "I4xQ16xQ", data, phoff + i * phentsize) for i in range(phnum)
            ]
        else:
            phoff, shoff = struct.unpack_from(order + "II", data, 28)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", data, 42)
            segments = [
                struct.unpack_from(order + "II8xI", data, phoff + i * phentsize) for i in range(phnum)
            ]
    except struct.error:  # the program headers themselves are cut off
        return ElfInfo(arch, False)
    size = len(data)
    complete = shoff + shnum * shentsize <= size and all(
        offset + filesz <= size for kind, offset, filesz in segments if kind == _PT_LOAD
    )
    return ElfInfo(arch, complete)


def elf_arch(path: Path) -> str | None:
    """The architecture an ELF file was built for, or ``None`` when the file is not ELF."""
    info = read_elf(path)
    return info.arch if info else None
