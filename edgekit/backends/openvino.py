"""OpenVINO: Intel CPUs, integrated GPUs and the Core Ultra NPU.

Reads OpenVINO IR (``.xml`` + ``.bin``) and ONNX directly.  Device strings are
OpenVINO's own: ``CPU``, ``GPU``, ``NPU``, ``AUTO`` or ``AUTO:NPU,CPU``.  The default
performance hint is LATENCY: a camera pipeline runs one frame at a time.

Batch: a model whose inputs' and outputs' dim 0 is dynamic (``?``) is reshaped to 1 before
it is compiled, and ``batched(n)`` compiles a reshaped clone of the ``ov.Model`` read at load.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.backends.base import (
    Availability,
    Options,
    Session,
    TensorSpec,
    check_artifact,
    known_options,
    load_failed,
)
from edgekit.errors import RunError

if TYPE_CHECKING:
    import numpy as np

    from edgekit.backends.openvino_kernels import Choice

NAME = "openvino"
OPTIONS = frozenset({"device", "hint", "num_threads", "cache_dir", "inference_precision", "kernels"})
# "edgekit": on the CPU, per-layer kernels where the plugin's own were measured slower
# (edgekit.backends.openvino_kernels); "plugin": the plugin's choice throughout.
KERNELS = ("edgekit", "plugin")
_VIRTUAL = ("AUTO", "MULTI", "HETERO", "BATCH")


# What the CPU and GPU plugins compute in unless told: the CPU plugin runs an fp32 model in
# bf16 on CPUs with AVX512-BF16 or AMX and in f16 on Armv8.2+ cores, the GPU plugin in f16.
# edgekit pins f32 unless the caller asks for less (a bf16 or fp16 candidate does, by name).
DEFAULT_PRECISION = "f32"
INFERENCE_PRECISIONS = ("f32", "bf16", "f16")
_PINNABLE = ("CPU", "GPU")  # the NPU computes in f16 whatever it is told, and rejects the hint


def inference_precision(device: str, options: Options | None = None) -> str | None:
    """The ``INFERENCE_PRECISION_HINT`` a load sets on ``device``, or None where the device takes none."""
    opts = options or {}
    value = str(opts.get("inference_precision", DEFAULT_PRECISION))
    if value not in INFERENCE_PRECISIONS:
        from edgekit.errors import ModelLoadError

        raise ModelLoadError(
            f"{NAME}: inference_precision {value!r} is not one of {', '.join(INFERENCE_PRECISIONS)}",
            "name the precision the artifact is for: f32 (fp32 and int8 artifacts), bf16 or f16",
        )
    return value if _physical(device) and all(d in _PINNABLE for d in _physical(device)) else None


def _physical(device: str) -> list[str]:
    """The real devices a device string needs: ``AUTO:NPU,CPU`` -> ``[NPU, CPU]``; ``AUTO`` -> ``[]``."""
    head, _, tail = device.partition(":")
    if head in _VIRTUAL:
        return [d.split(".")[0] for d in tail.split(",") if d]
    return [head.split(".")[0]]


class OpenVINOBackend:
    """Runs OpenVINO IR and ONNX files with OpenVINO."""

    name = NAME
    suffixes = (".xml", ".onnx")
    options = OPTIONS

    def available(self, options: Options | None = None) -> Availability:
        try:
            import openvino as ov
        except ImportError as err:
            return Availability(
                False, f"openvino is not installed ({err})", hint='pip install "edgekit[openvino]"'
            )
        version = ov.get_version().split("-")[0]
        devices = tuple(ov.Core().available_devices)
        device = str((options or {}).get("device", "CPU"))
        need = _physical(device)
        # AUTO with a priority list is usable when any listed device exists; a plain device must exist.
        usable = (
            any(d in devices for d in need)
            if device.startswith("AUTO") and need
            else all(d in devices for d in need)
        )
        if not usable:
            return Availability(
                False,
                f"OpenVINO device {device} is not present (this host has {', '.join(devices) or 'none'})",
                version,
                devices,
                "NPU needs an Intel Core Ultra with the intel_vpu driver; GPU needs the Intel compute runtime",
            )
        return Availability(True, "", version, devices)

    def load(self, artifact: Path, options: Options | None = None) -> Session:
        import openvino as ov

        opts = known_options(NAME, options, OPTIONS)
        artifact = check_artifact(NAME, artifact, self.suffixes)
        if artifact.suffix == ".xml" and not artifact.with_suffix(".bin").is_file():
            from edgekit.errors import ModelLoadError

            raise ModelLoadError(
                f"{NAME}: {artifact} has no weights file {artifact.with_suffix('.bin').name} beside it",
                "an OpenVINO IR is two files, .xml and .bin: copy both",
            )
        device = str(opts.get("device", "CPU"))
        kernels = str(opts.get("kernels", KERNELS[0]))
        if kernels not in KERNELS:
            from edgekit.errors import ModelLoadError

            raise ModelLoadError(
                f"{NAME}: kernels {kernels!r} is not one of {', '.join(KERNELS)}",
                "edgekit: its measured per-layer kernels on the CPU; plugin: OpenVINO's own choice",
            )
        config: dict[str, Any] = {"PERFORMANCE_HINT": str(opts.get("hint", "LATENCY"))}
        precision = inference_precision(device, opts)
        if precision is not None:
            config["INFERENCE_PRECISION_HINT"] = precision
        if "num_threads" in opts and _physical(device) == ["CPU"]:
            config["INFERENCE_NUM_THREADS"] = int(opts["num_threads"])
        core = ov.Core()
        if "cache_dir" in opts:
            # The NPU and GPU plugins compile for seconds; the cache makes the second start fast.
            core.set_property({"CACHE_DIR": str(opts["cache_dir"])})
        # The weights are read into memory, not mapped: a model compiled from a mapped .bin
        # sees whatever the file holds when it is compiled (seen: an in-place overwrite changed
        # the outputs), and the file was verified against its signed hash before this read.
        core.set_property({"ENABLE_MMAP": False})
        try:
            model, choices = read_ir(core, artifact, device, kernels)
            chosen = tuple(str(c) for c in choices)
            if not _free_batch(model):
                compiled = core.compile_model(model, device, config)
                return OpenVINOSession(artifact, compiled, device, kernels=chosen)
            # A free batch is pinned to 1, so that a plain session runs as fast as a static one;
            # the model is kept, so that batched(n) compiles its twins without the file.
            batch = _FreeBatch(core, model, device, config)
            return OpenVINOSession(artifact, batch.compile(1), device, batch, chosen)
        except Exception as err:
            raise load_failed(NAME, artifact, err, "an OpenVINO IR (.xml + .bin) or an ONNX model") from err


def read_ir(
    core: Any, artifact: Path, device: str = "CPU", kernels: str = KERNELS[0]
) -> tuple[Any, list[Choice]]:
    """The model as read from ``artifact``, with edgekit's kernel preferences where they apply."""
    if kernels == KERNELS[0] and artifact.suffix == ".xml" and _physical(device) == ["CPU"]:
        import numpy as np
        import openvino as ov

        from edgekit.backends.openvino_kernels import prefer
        from edgekit.core.cpu import this_cpu

        preferred = prefer(artifact, this_cpu().flags)
        if preferred is not None:
            text, choices = preferred
            # Copied into a tensor OpenVINO owns (not shared with the array): the model's constants
            # keep it alive, and a free-batch session compiles from the model again later.
            weights = ov.Tensor(np.fromfile(artifact.with_suffix(".bin"), dtype=np.uint8))
            return core.read_model(model=text, weights=weights), choices
    return core.read_model(str(artifact)), []


def _free_batch(model: Any) -> bool:
    """Whether dim 0 of every input and output of ``model`` is free (``?``) in the file."""
    ports = [*model.inputs, *model.outputs]
    for port in ports:
        shape = port.get_partial_shape()
        if shape.rank.is_dynamic or shape.rank.get_length() == 0 or not shape[0].is_dynamic:
            return False
    return bool(ports)


@dataclass(frozen=True)
class _FreeBatch:
    """What a session of a free-batch model keeps to compile its batched twins: the OpenVINO core
    (its cache and properties), the model as read from the file, the device asked for and the config."""

    core: Any
    model: Any
    device: str
    config: dict[str, Any]

    def compile(self, n: int) -> Any:
        """The model compiled with every input's dim 0 set to ``n`` (the kept model is left free)."""
        import openvino as ov

        model = self.model.clone()
        model.reshape(
            {
                i: ov.PartialShape([ov.Dimension(n), *list(port.get_partial_shape())[1:]])
                for i, port in enumerate(model.inputs)
            }
        )
        return self.core.compile_model(model, self.device, self.config)


def _spec(port: Any) -> TensorSpec:
    shape = tuple(None if d.is_dynamic else d.get_length() for d in port.get_partial_shape())
    name = port.get_any_name() if port.get_names() else f"port{port.get_index()}"
    return TensorSpec(name, shape, port.get_element_type().to_dtype().name)


class OpenVINOSession(Session):
    backend = NAME

    def __init__(
        self,
        artifact: Path,
        compiled: Any,
        device: str,
        batch: _FreeBatch | None = None,
        kernels: tuple[str, ...] = (),
    ) -> None:
        self._batch = batch
        super().__init__(
            artifact, [_spec(p) for p in compiled.inputs], [_spec(p) for p in compiled.outputs], device
        )
        self.kernels = kernels
        import numpy as np
        import openvino as ov

        self._request = compiled.create_infer_request()
        self._tensor, self._contiguous = ov.Tensor, np.ascontiguousarray
        # With AUTO, the device really used is decided by the plugin: report that one
        # (an older plugin without the property keeps the requested name).
        with contextlib.suppress(Exception):
            self.device = ",".join(compiled.get_property("EXECUTION_DEVICES"))
        with contextlib.suppress(Exception):  # e.g. "f32", "bf16": what the plugin settled on
            self.compute_precision = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()

    @property
    def batchable(self) -> bool:
        return self._batch is not None

    def _batched(self, n: int) -> Session:
        assert self._batch is not None  # Session.batched asked batchable first
        try:
            compiled = self._batch.compile(n)
        except Exception as err:
            raise load_failed(NAME, self.artifact, err, f"a model that runs at batch {n}") from err
        # The kept model carries the preferences: the twin runs the same kernels.
        return OpenVINOSession(self.artifact, compiled, self._batch.device, self._batch, self.kernels)

    def _run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        try:
            # OpenVINO reads the caller's arrays in place (the call is synchronous and Session.run
            # has checked their dtype and shape) instead of copying 600 kB a frame.  Tensors set
            # directly and a bare infer(): infer(arrays, share_inputs=True) took 70-110 us longer
            # a call on EfficientNet-Lite0, in its Python dispatch and the outputs it copies.
            for i, array in enumerate(arrays):
                # A read-only array (np.frombuffer over a request's bytes, a memory map) cannot be
                # shared: OpenVINO refuses it ("array is not writeable").  Those alone are copied.
                shared = self._contiguous(array) if array.flags.writeable else array.copy()
                self._request.set_input_tensor(i, self._tensor(shared, shared_memory=True))
            self._request.infer(share_outputs=True)
            # Copy: OpenVINO reuses its output tensors on the next infer.
            return [self._request.get_output_tensor(i).data.copy() for i in range(len(self.outputs))]
        except Exception as err:
            raise RunError(
                f"{NAME} failed running {self.artifact}: {err}", "check the input against session.inputs"
            ) from err

    def close(self) -> None:
        self._request = None
        super().close()
