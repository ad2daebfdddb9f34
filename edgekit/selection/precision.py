"""What precision a candidate really computes in on a given CPU: for ``edgekit doctor`` and ``bench``.

The rule that makes it so lives where the runtime is configured (``profiles.pin_precision``
for OpenVINO's inference precision; the build's int8 recipes); this module only says what
the result is, so a person can check that an artifact named fp32 computes in fp32.

- ONNX Runtime's CPU provider computes an fp32 model in fp32 (its bf16 fast-math mode is
  Arm-only and off unless a session option asks for it).  Its int8 kernels on x86 without
  VNNI/AMX multiply u8 x s8 with ``VPMADDUBSW``, whose int16 pair sums saturate on
  full-range weights: the portable int8 recipe halves the weight range for them.
- OpenVINO computes in what ``INFERENCE_PRECISION_HINT`` says (edgekit always sets it on
  CPU and GPU); an NPU computes in fp16.
- LiteRT with XNNPACK computes fp32 models in fp32 (fp16 only when forced, which edgekit
  never does), and int8 models with int32 accumulation on every CPU.
- A TVM library computes in what it was compiled for: fp32.
- TensorRT computes in what its builder was allowed: fp16 when asked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from edgekit.core.cpu import CpuFeatures
from edgekit.device.profiles import PRECISION_OPTIONS, Candidate

if TYPE_CHECKING:
    from edgekit.bundle.manifest import Manifest

_OV_NAMES = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}


def compute_precision(cand: Candidate, cpu: CpuFeatures) -> str:
    """A short description of the arithmetic ``cand`` runs in on ``cpu``, e.g. ``"bf16"``, ``"int8 (7-bit weights)"``."""
    if cand.backend == "openvino":
        device = str(cand.options.get("device", "CPU"))
        if device.startswith("NPU"):
            return "fp16 (the NPU's own)"
        key, values = PRECISION_OPTIONS["openvino"]
        pinned = _OV_NAMES.get(str(cand.options.get(key, values.get(cand.precision, "f32"))), "fp32")
        if pinned in ("bf16", "fp16") and device.startswith("CPU") and not cpu.has(pinned):
            return f"fp32 (no {pinned} on this CPU: {cpu.why(pinned)})"
        return _int8(cand, cpu, float_part=pinned) if cand.precision == "int8" else pinned
    if cand.backend == "onnxruntime":
        # providers: names, or (name, {provider options}) pairs, as a profile gives them.
        pairs = [p for p in cand.options.get("providers", ()) if isinstance(p, (list, tuple)) and len(p) == 2]
        if any(isinstance(opts, Mapping) and opts.get("trt_fp16_enable") for _, opts in pairs):
            return "fp16 (TensorRT execution provider, trt_fp16_enable)"
        return _int8(cand, cpu) if cand.precision == "int8" else cand.precision
    if cand.backend == "litert" and cand.options.get("delegate") == "edgetpu":
        return "int8 (Edge TPU)"
    if cand.backend == "tensorrt" and (cand.options.get("fp16") or cand.precision == "fp16"):
        return "fp16"
    return _int8(cand, cpu) if cand.precision == "int8" else cand.precision


def _int8(cand: Candidate, cpu: CpuFeatures, float_part: str = "fp32") -> str:
    rest = f", float layers {float_part}" if float_part != "fp32" else ""
    if cand.variant == "full":
        if cpu.arch == "x86_64" and not cpu.has("int8-dot"):
            return f"int8 (full-range weights saturate without int8-dot{rest})"
        return f"int8 (full-range weights{rest})"
    if cand.backend in ("onnxruntime", "openvino"):
        return f"int8 (7-bit weights{rest})"
    return f"int8{f' ({rest[2:]})' if rest else ''}"


def int8_pick(candidates: Sequence[Candidate], cpu: CpuFeatures) -> tuple[Candidate | None, str]:
    """The int8 candidate a device with ``cpu`` takes (the first, in profile order, whose needs it meets), and why."""
    for cand in candidates:
        if cand.precision != "int8" or cand.missing(cpu):
            continue
        if cand.variant == "full":
            why = f"full-range weights: this CPU has int8-dot ({cpu.why('int8-dot')})"
        elif any(c.variant == "full" and c.precision == "int8" for c in candidates):
            why = f"the portable recipe (7-bit weights): this CPU has no int8-dot ({cpu.why('int8-dot')})"
        else:
            why = "the only int8 recipe this bundle has for the profile"
        return cand, why
    return None, "no int8 candidate runs on this CPU"


def int8_choice(manifest: Manifest, cpu: CpuFeatures) -> dict[str, Any] | None:
    """Which int8 artifact of a bundle a device with ``cpu`` takes, and why; None without int8 artifacts."""
    from edgekit.device.profiles import get_profile
    from edgekit.errors import EdgekitError
    from edgekit.selection.matching import artifact_for, candidates_for

    if not any(a.precision == "int8" for a in manifest.artifacts):
        return None
    try:
        profile = get_profile(manifest.device.profile)
    except EdgekitError:  # a profile this edgekit does not know: nothing to choose by
        return None
    have = [c for c in candidates_for(profile, manifest.artifacts) if artifact_for(c, manifest.artifacts)]
    cand, why = int8_pick(have, cpu)
    art = artifact_for(cand, manifest.artifacts) if cand is not None else None
    return {"artifact": art.name if art else None, "why": why}
