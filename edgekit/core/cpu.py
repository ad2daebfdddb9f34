"""The CPU features that decide which precision an artifact can run in, and how fast.

Read from ``/proc/cpuinfo`` (``flags`` on x86, ``Features`` on ARM), or on aarch64, where it
lists none (QEMU user-mode shows the host's), from the kernel's ``AT_HWCAP`` bits; so a test
can describe any CPU with fixture files.  Three capabilities matter to edgekit, each named the same on
every architecture so that device profiles can ask for them as data:

- ``int8-dot``: int8 dot products that accumulate in int32 without saturating.  x86: AVX512-VNNI,
  AVX-VNNI or AMX-INT8 (``VPDPBUSD``/``TDPBUSD``); ARM: the dot-product extension (``asimddp``,
  ``SDOT``/``UDOT``) or ``i8mm``.  Without it, an x86 CPU multiplies u8 x s8 with ``VPMADDUBSW``,
  whose int16 pair sums saturate when both operands use their full 8 bits: that is why the
  portable int8 recipe halves the weight range (``edgekit.convert.onnx_int8``).
- ``bf16``: bfloat16 arithmetic.  x86: AVX512-BF16 or AMX-BF16; ARM: ``bf16`` (Armv8.6).  OpenVINO's
  CPU plugin runs an fp32 model in bf16 on such CPUs unless told not to.
- ``fp16``: half-precision arithmetic.  ARM: ``fphp`` and ``asimdhp`` (Armv8.2, e.g. Cortex-A76,
  A78); x86: AVX512-FP16 or AMX-FP16.  OpenVINO's CPU plugin runs fp32 models in f16 on such
  ARM cores unless told not to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from edgekit.core.elf import normalize_arch

CAPABILITIES = ("int8-dot", "bf16", "fp16")

# What provides each capability, by architecture; any one flag is enough.
PROVIDERS: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "x86_64": {
        "int8-dot": ("avx512_vnni", "avx_vnni", "amx_int8"),
        "bf16": ("avx512_bf16", "amx_bf16"),
        "fp16": ("avx512_fp16", "amx_fp16"),
    },
    "aarch64": {
        "int8-dot": ("asimddp", "i8mm"),
        "bf16": ("bf16",),
        "fp16": ("fphp", "asimdhp"),
    },
}

# x86 generations by the notable flags they add (also what an LLVM ``mcpu`` implies, below).
_AVX2 = ("sse4_2", "avx", "fma", "avx2")
_AVX512 = (*_AVX2, "avx512f", "avx512bw", "avx512vl")
_SAPPHIRE_RAPIDS = (
    *_AVX512,
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)
_NEON_DOT_FP16 = ("asimd", "asimddp", "fphp", "asimdhp")

# The flags worth showing a person (``edgekit doctor``): the vector and matrix extensions that
# decide kernel choice.  Everything else in /proc/cpuinfo is left out of the report.
NOTABLE: Mapping[str, tuple[str, ...]] = {
    "x86_64": (*_SAPPHIRE_RAPIDS, "amx_fp16"),
    "aarch64": (*_NEON_DOT_FP16, "i8mm", "bf16", "sve", "sve2"),
}


@dataclass(frozen=True)
class CpuFeatures:
    """The instruction-set flags a CPU reports, and what they add up to."""

    arch: str
    flags: frozenset[str]

    def has(self, capability: str) -> bool:
        """Whether this CPU has ``capability`` (one of :data:`CAPABILITIES`)."""
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown CPU capability {capability!r}; known: {', '.join(CAPABILITIES)}")
        providers = PROVIDERS.get(self.arch, {}).get(capability, ())
        if capability == "fp16" and self.arch == "aarch64":
            # Scalar and vector half precision come together on every Armv8.2 core; ask for both.
            return all(f in self.flags for f in providers)
        return any(f in self.flags for f in providers)

    def why(self, capability: str) -> str:
        """The flags that give ``capability`` here, or what would: for reports and refusals."""
        providers = PROVIDERS.get(self.arch, {}).get(capability, ())
        found = [f for f in providers if f in self.flags]
        if self.has(capability):
            return ", ".join(found)
        return f"none of {', '.join(providers) or 'no known flag'}" if providers else f"not on {self.arch}"

    @property
    def capabilities(self) -> tuple[str, ...]:
        return tuple(c for c in CAPABILITIES if self.has(c))

    @property
    def notable(self) -> tuple[str, ...]:
        return tuple(f for f in NOTABLE.get(self.arch, ()) if f in self.flags)

    def to_dict(self) -> dict[str, Any]:
        return {
            "arch": self.arch,
            "flags": list(self.notable),
            "capabilities": {c: {"present": self.has(c), "from": self.why(c)} for c in CAPABILITIES},
        }


# The /proc/cpuinfo line that lists the flags, per architecture (another one's line is not read:
# under QEMU user-mode emulation an aarch64 process sees the x86_64 host's cpuinfo).
_FLAGS_LINE = {"x86_64": ("flags",), "aarch64": ("Features",)}

# The kernel's hardware capability bits (``AT_HWCAP``/``AT_HWCAP2`` in the auxiliary vector;
# Linux arch/arm64/include/uapi/asm/hwcap.h), named as /proc/cpuinfo names them: the ones
# NOTABLE lists.  The same bits ONNX Runtime's MLAS and XNNPACK choose their kernels by.
AT_HWCAP, AT_HWCAP2 = 16, 26
HWCAP_FLAGS: Mapping[str, Mapping[int, Mapping[int, str]]] = {
    "aarch64": {
        AT_HWCAP: {1: "asimd", 9: "fphp", 10: "asimdhp", 20: "asimddp", 22: "sve"},
        AT_HWCAP2: {1: "sve2", 13: "i8mm", 14: "bf16"},
    },
}


def parse_cpuinfo(text: str, arch: str) -> CpuFeatures:
    """The flags of the first processor listed in ``/proc/cpuinfo`` text (every core of these CPUs has the same)."""
    arch = normalize_arch(arch)
    keys = _FLAGS_LINE.get(arch, ("flags", "Features"))
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return CpuFeatures(arch, frozenset(value.split()))
    return CpuFeatures(arch, frozenset())


def parse_auxv(data: bytes, arch: str) -> frozenset[str]:
    """The flags ``HWCAP_FLAGS`` names in an auxiliary vector (``/proc/self/auxv``: 64-bit key, value pairs)."""
    import struct

    names = HWCAP_FLAGS.get(normalize_arch(arch), {})
    if not names or not data or len(data) % 16:
        return frozenset()
    # Native byte order: the vector is this process's own (aarch64 Linux is little-endian).
    words = dict(struct.iter_unpack("=QQ", data))
    return frozenset(
        flag for key, bits in names.items() for bit, flag in bits.items() if words.get(key, 0) >> bit & 1
    )


def read_cpu(root: Path = Path("/"), arch: str | None = None, cpuinfo: str | None = None) -> CpuFeatures:
    """The CPU under ``root`` (``/`` on a real machine, a fixture directory in tests).

    From ``/proc/cpuinfo`` (``cpuinfo``: its text, already read), or, where it lists no flags
    for this architecture, from the auxiliary vector (aarch64): QEMU user-mode emulation shows
    the host's cpuinfo but gives the emulated CPU's ``AT_HWCAP``.
    """
    import platform

    if cpuinfo is None:
        try:
            cpuinfo = (root / "proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    cpu = parse_cpuinfo(cpuinfo, arch or platform.machine())
    if cpu.flags or cpu.arch not in HWCAP_FLAGS:
        return cpu
    try:
        auxv = (root / "proc/self/auxv").read_bytes()
    except OSError:
        return cpu
    return CpuFeatures(cpu.arch, parse_auxv(auxv, cpu.arch))


# The notable flags an LLVM ``mcpu`` implies, for the CPUs device profiles name or a user is
# likely to; an ``mcpu`` not listed here implies nothing (only ``mattr`` counts).
MCPU_FLAGS: Mapping[str, tuple[str, ...]] = {
    **{c: _AVX2 for c in ("haswell", "broadwell", "skylake", "znver1", "znver2", "znver3", "x86-64-v3")},
    "alderlake": (*_AVX2, "avx_vnni"),
    "skylake-avx512": _AVX512,
    "x86-64-v4": _AVX512,
    **{
        c: (*_AVX512, "avx512_vnni") for c in ("cascadelake", "icelake-client", "icelake-server", "tigerlake")
    },
    "cooperlake": (*_AVX512, "avx512_vnni", "avx512_bf16"),
    "znver4": (*_AVX512, "avx512_vnni", "avx512_bf16"),
    "sapphirerapids": _SAPPHIRE_RAPIDS,
    **{c: ("asimd",) for c in ("cortex-a53", "cortex-a55", "cortex-a57", "cortex-a72", "cortex-a73")},
    **{c: _NEON_DOT_FP16 for c in ("cortex-a75", "cortex-a76", "cortex-a77", "cortex-a78", "neoverse-n1")},
}
# LLVM ``mattr`` feature names as ``/proc/cpuinfo`` spells them.
MATTR_FLAGS: Mapping[str, tuple[str, ...]] = {
    "sse4.2": ("sse4_2",),
    "avx": ("avx",),
    "fma": ("fma",),
    "avx2": ("avx2",),
    "avx512f": ("avx512f",),
    "avx512bw": ("avx512bw",),
    "avx512vl": ("avx512vl",),
    "avx512vnni": ("avx512_vnni",),
    "avxvnni": ("avx_vnni",),
    "avx512bf16": ("avx512_bf16",),
    "avx512fp16": ("avx512_fp16",),
    "amx-tile": ("amx_tile",),
    "amx-int8": ("amx_int8",),
    "amx-bf16": ("amx_bf16",),
    "amx-fp16": ("amx_fp16",),
    "neon": ("asimd",),
    "dotprod": ("asimddp",),
    "fullfp16": ("fphp", "asimdhp"),
    "i8mm": ("i8mm",),
    "bf16": ("bf16",),
    "sve": ("sve",),
    "sve2": ("sve2",),
}


def target_attrs(target: Mapping[str, Any]) -> list[str]:
    """A target's ``mattr`` as a list (``"+neon,+dotprod"`` or ``["+neon", "+dotprod"]``)."""
    mattr = target.get("mattr", ())
    return [str(a).strip() for a in (mattr.split(",") if isinstance(mattr, str) else mattr) if str(a).strip()]


def target_flags(target: Mapping[str, Any]) -> frozenset[str] | None:
    """The notable CPU flags a target compiles for (its ``mcpu``, then ``mattr``); ``None``: not known.

    A ``generic`` or unlisted ``mcpu`` without ``mattr`` says nothing about the CPU.
    """
    cpu = str(target.get("mcpu", ""))
    attrs = target_attrs(target)
    if cpu not in MCPU_FLAGS and not attrs:
        return None
    flags = set(MCPU_FLAGS.get(cpu, ()))
    for attr in attrs:
        sign, name = (attr[0], attr[1:]) if attr[0] in "+-" else ("+", attr)
        named = MATTR_FLAGS.get(name, ())
        if sign == "+":
            flags.update(named)
        else:
            flags.difference_update(named)
    return frozenset(flags)


@cache
def this_cpu() -> CpuFeatures:
    """This machine's CPU, read once per process."""
    return read_cpu()
