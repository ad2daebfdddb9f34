"""The CPU features that decide which precision an artifact can run in, and how fast.

Read from ``/proc/cpuinfo`` (``flags`` on x86, ``Features`` on ARM), so a test can describe
any CPU with a fixture file.  Three capabilities matter to edgekit, each named the same on
every architecture so that device profiles can ask for them as data:

- ``int8-dot``: int8 dot products that accumulate in int32 without saturating.  x86: AVX512-VNNI,
  AVX-VNNI or AMX-INT8 (``VPDPBUSD``/``TDPBUSD``); ARM: the dot-product extension (``asimddp``,
  ``SDOT``/``UDOT``) or ``i8mm``.  Without it, an x86 CPU multiplies u8 x s8 with ``VPMADDUBSW``,
  whose int16 pair sums saturate when both operands use their full 8 bits: that is why the
  portable int8 recipe halves the weight range (``edgekit.build.onnx_int8``).
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

from edgekit.elf import normalize_arch

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

# The flags worth showing a person (``edgekit doctor``): the vector and matrix extensions that
# decide kernel choice.  Everything else in /proc/cpuinfo is left out of the report.
NOTABLE: Mapping[str, tuple[str, ...]] = {
    "x86_64": (
        "sse4_2",
        "avx",
        "fma",
        "avx2",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "amx_tile",
        "amx_int8",
        "amx_bf16",
        "amx_fp16",
    ),
    "aarch64": ("asimd", "asimddp", "i8mm", "fphp", "asimdhp", "bf16", "sve", "sve2"),
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


def parse_cpuinfo(text: str, arch: str) -> CpuFeatures:
    """The flags of the first processor listed in ``/proc/cpuinfo`` text (every core of these CPUs has the same)."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return CpuFeatures(normalize_arch(arch), frozenset(value.split()))
    return CpuFeatures(normalize_arch(arch), frozenset())


def read_cpu(root: Path = Path("/"), arch: str | None = None) -> CpuFeatures:
    """The CPU under ``root`` (``/`` on a real machine, a fixture directory in tests)."""
    import platform

    try:
        text = (root / "proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    return parse_cpuinfo(text, arch or platform.machine())


@cache
def this_cpu() -> CpuFeatures:
    """This machine's CPU, read once per process."""
    return read_cpu()
