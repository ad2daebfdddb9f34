"""The one rule that matches a device profile's candidates to a bundle's artifacts.

The build, the bench and ``load()`` all ask this module which artifact a candidate runs, so
that what was gated, what was measured and what runs are the same file.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

from edgekit.core.elf import host_arch
from edgekit.device.profiles import Candidate, DeviceProfile, pin_precision

if TYPE_CHECKING:
    from edgekit.bundle.manifest import ArtifactEntry


def artifact_for(candidate: Candidate, artifacts: Sequence[ArtifactEntry]) -> ArtifactEntry | None:
    """The bundle artifact a candidate loads: same backend, precision and variant, runnable on this CPU.

    An Edge TPU candidate takes only a compiled ``*_edgetpu.tflite``; every other LiteRT
    candidate takes only a CPU model.
    """
    wants_tpu = candidate.backend == "litert" and candidate.options.get("delegate") == "edgetpu"
    for a in artifacts:
        if (
            a.backend != candidate.backend
            or a.precision != candidate.precision
            or a.variant != candidate.variant
            or a.arch not in ("any", host_arch())
        ):
            continue
        if (a.kind == "tflite-edgetpu") == wants_tpu and a.kind != "tflite-edgetpu-src":
            return a
    return None


def candidates_for(profile: DeviceProfile, artifacts: Sequence[ArtifactEntry]) -> list[Candidate]:
    """The profile's candidates, then one default candidate per artifact none of them takes."""
    found = list(profile.candidates)
    taken = {id(a) for c in found if (a := artifact_for(c, artifacts)) is not None}
    for a in artifacts:
        if id(a) not in taken and a.kind not in ("tflite-edgetpu", "tflite-edgetpu-src"):
            found.append(
                Candidate(
                    a.backend,
                    a.precision,
                    MappingProxyType(pin_precision(a.backend, a.precision, {})),
                    name=f"{a.name} (bundle default)",
                    variant=a.variant,
                    requires=a.requires,
                )
            )
    return found
