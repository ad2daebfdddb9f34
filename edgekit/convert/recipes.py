"""The recipes: which artifact each device candidate loads, and how each one is produced.

A recipe (``backend-precision[-variant]``) names one artifact; the build plans the recipes a
device profile's candidates need and produces each through a cached step of the build in
progress (:class:`edgekit.convert.build_steps.BuildSteps`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.convert.artifact import Artifact
from edgekit.convert.build_cache import step_key
from edgekit.errors import BuildError

if TYPE_CHECKING:
    import numpy as np

    from edgekit.convert.build_steps import BuildSteps
    from edgekit.device.profiles import Candidate, DeviceProfile


def recipe_of(c: Candidate) -> str:
    """Which artifact a candidate loads: ``backend-precision[-variant]``, or ``litert-edgetpu`` for the Edge TPU."""
    if c.backend == "litert" and c.options.get("delegate") == "edgetpu":
        return "litert-edgetpu"
    return "-".join(x for x in (c.backend, c.precision, c.variant) if x)


KNOWN_RECIPES = (
    "onnxruntime-fp32",
    "onnxruntime-int8",
    "onnxruntime-int8-full",
    "openvino-fp32",
    "openvino-fp16",
    "openvino-bf16",
    "openvino-int8",
    "openvino-int8-full",
    "litert-fp32",
    "litert-int8",
    "litert-edgetpu",
    "tvm-fp32",
    "tensorrt-fp32",
    "tensorrt-fp16",
)


def plan_recipes(
    profile: DeviceProfile, backends: Sequence[str] = (), precisions: Sequence[str] = ()
) -> list[str]:
    """The artifacts a profile's candidates need, in candidate order, without repeats."""
    recipes: list[str] = []
    for c in profile.candidates:
        if (backends and c.backend not in backends) or (precisions and c.precision not in precisions):
            continue
        r = recipe_of(c)
        if r not in recipes:
            recipes.append(r)
    if not recipes:
        raise BuildError(
            f"no artifact to build for {profile.name} with backends {list(backends) or 'any'} and precisions {list(precisions) or 'any'}",
            f"{profile.name} runs: {', '.join(c.key for c in profile.candidates)}",
        )
    return recipes


UNTUNED_TVM = (
    "no tuned schedules for this model on this CPU; tune with --tune-trials N "
    "or build it untuned with --tvm-untuned"
)


ONNX_HAS_NO_PYTORCH = (
    "LiteRT artifacts are converted from the PyTorch model; an ONNX file has none "
    "(give the .tflite instead, or build from a PyTorch model card)"
)


def litert_left_out(b: BuildSteps) -> str | None:
    """Why the build leaves every LiteRT artifact out, or None when it converts them.

    The converter (litert-torch) is not in ``edgekit[all]``: pip cannot install it beside TVM
    (litert.CONVERTER_HINT says why), so a build without it still makes every other artifact.
    """
    from edgekit.convert.litert import CONVERTER_HINT

    if b.req.onnx is not None and b.req.pytorch_module is None:
        return ONNX_HAS_NO_PYTORCH
    if importlib.util.find_spec("litert_torch") is None:
        return f"litert-torch (the PyTorch to LiteRT converter) is not installed: {CONVERTER_HINT}"
    return None


def untuned_tvm(b: BuildSteps, recipe: str, fp32_hash: str) -> str | None:
    """Why the build leaves ``recipe`` out: a TVM library for this host with no tuned schedules.

    Untuned TVM code is plain loops, tens of times slower than every other artifact of the
    bundle, so selection never picks it, and gating it took most of a build (14.5 of 20
    minutes on YOLOv8s).  A library for another architecture (rpi5, jetson) is still built:
    any schedules it gets are its best chance, and it is gated on the device.
    """
    from edgekit.convert import tvm_database
    from edgekit.core.elf import host_arch

    target = dict(b.profile.tvm_target)
    if recipe != "tvm-fp32" or b.req.tune_trials or b.req.tvm_untuned:
        return None
    if tvm_database.target_arch(target) != host_arch():
        return None
    model_dir = b.req.card.path.parent if b.req.card.path else None
    if tvm_database.find_database(fp32_hash, target, model_dir=model_dir) is not None:
        return None
    return UNTUNED_TVM


def recipe_artifacts(
    b: BuildSteps, recipe: str, fp32: Path, fp32_hash: str, calib: np.ndarray, calib_hash: str
) -> list[Artifact]:
    req, stem = b.req, b.stem
    backend, _, precision = recipe.partition("-")
    precision, _, variant = precision.partition("-")
    full = variant == "full"
    if recipe == "onnxruntime-fp32":
        return [Artifact(fp32, "onnxruntime", "fp32", kind="onnx")]
    if recipe in ("onnxruntime-int8", "onnxruntime-int8-full"):
        from edgekit.convert.heads import cache_params
        from edgekit.convert.onnx_int8 import opset_params, quantize_onnx_int8

        return b.step(
            recipe,
            step_key(recipe, [fp32_hash, calib_hash], {**cache_params(fp32), **opset_params(fp32)}),
            lambda d: [
                quantize_onnx_int8(
                    fp32,
                    d / f"{stem}-{recipe.removeprefix('onnxruntime-')}.onnx",
                    calib,
                    req.card.input_name,
                    full_range=full,
                    on_image=b.tick,
                )
            ],
        )
    if backend == "openvino":
        from edgekit.convert import openvino_ir

        if precision == "int8":
            from edgekit.convert.heads import cache_params

            return b.step(
                recipe,
                step_key(recipe, [fp32_hash, calib_hash], cache_params(fp32)),
                lambda d: [
                    openvino_ir.quantize_openvino_int8(fp32, d, calib, full_range=full, on_image=b.tick)
                ],
            )
        return b.step(
            recipe,
            step_key(recipe, [fp32_hash], {}),
            lambda d: [openvino_ir.convert_openvino(fp32, d, precision)],
        )
    if recipe == "tvm-fp32":
        from edgekit.convert import ops
        from edgekit.convert import tvm as tvm_build

        target = dict(b.profile.tvm_target)
        ops.require_supported(
            fp32, "tvm", f"{b.profile.name} {target.get('mtriple', '')} {target.get('mcpu', '')}".strip()
        )
        from edgekit.convert import tvm_cpu, tvm_database

        model_dir = req.card.path.parent if req.card.path else None
        # The schedules applied decide the library: a new shipped or cached database is a new build.
        database = (
            None if req.tune_trials else tvm_database.find_database(fp32_hash, target, model_dir=model_dir)
        )
        params = {
            "target": target,
            "tune_trials": req.tune_trials,
            "database": tvm_database.fingerprint(database),
            "io": 2,  # 2: the library's .io.json records its target (an older cached one does not)
        }
        made = b.step(
            recipe,
            step_key(recipe, [fp32_hash], params),
            lambda d: [
                tvm_build.compile_onnx(
                    fp32,
                    d / f"{stem}-{b.profile.arch}.so",
                    target,
                    tune_trials=req.tune_trials,
                    model_dir=model_dir,
                )
            ],
        )
        if database is not None:
            # Whose CPU the schedules were timed on, against this build's: said here, outside the
            # cached step, because a cached library may have been built on another host.
            note = tvm_cpu.schedule_note(database, target)
            fresh = {"schedules_tuned_on_cpu": database.meta.get("tuned_on_cpu")}
            made = [
                replace(
                    a,
                    notes={
                        **{k: v for k, v in a.notes.items() if k != "schedules"},
                        **fresh,
                        **({"schedules": note} if note else {}),
                    },
                )
                for a in made
            ]
        if any(c.precision == "int8" for c in b.profile.candidates):
            # Said here, outside the cached step, so bundles built from an older cache say it too.
            made = [replace(a, notes={**a.notes, "no-tvm-int8": tvm_build.INT8_NOT_BUILT}) for a in made]
        return made
    if backend == "tensorrt":
        from edgekit.convert.tensorrt import tensorrt_artifact

        options = next((c.options for c in b.profile.candidates if recipe_of(c) == recipe), {})
        return [tensorrt_artifact(fp32, b.stage, precision, options, stem)]
    raise BuildError(
        f"no recipe for {recipe} (device {b.profile.name})", f"known: {', '.join(KNOWN_RECIPES)}"
    )


def litert_artifacts(
    b: BuildSteps, recipes: list[str], fp32: Path, calib: np.ndarray, calib_hash: str
) -> dict[str, Artifact]:
    """The LiteRT artifacts ``recipes`` ask for, converted from the PyTorch module in one cached step.

    ``fp32`` (the fp32 ONNX of the same module) says whether the int8 model keeps float
    output heads, which is part of the step's cache key.
    """
    from edgekit.convert.heads import cache_params
    from edgekit.convert.litert import convert_tflite
    from edgekit.convert.model_sources import load_pytorch

    precisions = [r.split("-", 1)[1] for r in recipes]

    def produce(d: Path) -> list[Artifact]:
        module = b.req.pytorch_module if b.req.pytorch_module is not None else load_pytorch(b.req.card)
        return convert_tflite(module, b.req.card.preprocess, d, calib, precisions, stem=b.stem)

    made = b.step(
        "litert",
        step_key("litert", [b.source_hash, calib_hash], {"precisions": precisions, **cache_params(fp32)}),
        produce,
    )
    found: dict[str, Artifact] = {}
    for a in made:
        found["litert-edgetpu" if a.kind.startswith("tflite-edgetpu") else f"litert-{a.precision}"] = a
    return found
