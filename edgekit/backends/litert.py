"""LiteRT (the runtime formerly called TensorFlow Lite), with XNNPACK or the Edge TPU delegate.

``ai-edge-litert`` is the maintained runtime; ``tflite-runtime`` is accepted as a fallback
import (frozen since 2023, but it is what some boards still ship).  A model compiled by
``edgetpu_compiler`` (``*_edgetpu.tflite``) needs the Edge TPU delegate
(``libedgetpu.so.1``) and a Coral device (``usb``, ``usb:N``, ``pci:N``); without them it
is refused with a message saying what to install, the way pycoral does it.

Batch: fixed (``batchable`` is False, ``batched`` refuses).  The build writes a batch-1
flatbuffer, and an Edge TPU model is compiled for its shapes; resizing a CPU interpreter's input
would need the model kept in memory and every op re-checked at the new batch, for no artifact
edgekit makes.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from edgekit.backends.base import (
    Availability,
    Options,
    Quantization,
    Session,
    TensorSpec,
    check_artifact,
    known_options,
    load_failed,
)
from edgekit.errors import ModelLoadError, RunError

if TYPE_CHECKING:
    import numpy as np

NAME = "litert"
OPTIONS = frozenset({"num_threads", "delegate", "edgetpu_device", "edgetpu_library"})
DELEGATES = ("xnnpack", "edgetpu", "none")
EDGETPU_LIBRARY = {"linux": "libedgetpu.so.1", "darwin": "libedgetpu.1.dylib", "win32": "edgetpu.dll"}
EDGETPU_HINT = (
    "install the Edge TPU runtime (Debian: libedgetpu1-std from Coral's apt repository), plug in the "
    'accelerator, or use a plain .tflite with delegate = "xnnpack"'
)


def runtime() -> tuple[ModuleType, str]:
    """The interpreter module and the name of the package it came from (ai-edge-litert first)."""
    try:
        from ai_edge_litert import interpreter

        return interpreter, "ai-edge-litert"
    except ImportError:
        from tflite_runtime import interpreter  # the fallback runtime some boards still ship

        return interpreter, "tflite-runtime"


def _version(package: str) -> str:
    from edgekit.core.packages import installed_version

    found = installed_version(package)
    return f"{found} ({package})" if found else package


def _edgetpu_library(opts: Options) -> str:
    return str(opts.get("edgetpu_library") or EDGETPU_LIBRARY.get(sys.platform, "libedgetpu.so.1"))


class LiteRTBackend:
    """Runs ``.tflite`` files with LiteRT."""

    name = NAME
    suffixes = (".tflite",)
    options = OPTIONS

    def available(self, options: Options | None = None) -> Availability:
        opts = options or {}
        try:
            _, package = runtime()
        except ImportError as err:
            return Availability(
                False,
                f"neither ai-edge-litert nor tflite-runtime is installed ({err})",
                hint='pip install "edgekit[litert]"',
            )
        version = _version(package)
        if opts.get("delegate") != "edgetpu":
            return Availability(True, "", version, ("CPU",))
        from edgekit.core.sysfs import edgetpu_devices

        lib = _edgetpu_library(opts)
        try:
            ctypes.CDLL(lib)
        except OSError as err:
            return Availability(
                False, f"the Edge TPU runtime {lib} is not installed ({err})", version, ("CPU",), EDGETPU_HINT
            )
        tpus = edgetpu_devices()
        if not tpus:
            return Availability(
                False,
                "no Edge TPU is attached (no Coral USB id, no /dev/apex_*)",
                version,
                ("CPU",),
                EDGETPU_HINT,
            )
        return Availability(True, "", version, ("CPU", *tpus))

    def load(self, artifact: Path, options: Options | None = None) -> Session:
        opts = known_options(NAME, options, OPTIONS)
        artifact = check_artifact(NAME, artifact, self.suffixes)
        interpreter, _ = runtime()
        delegate_name = str(opts.get("delegate", "xnnpack"))
        if delegate_name not in DELEGATES:
            raise ModelLoadError(
                f"{NAME}: unknown delegate {delegate_name!r}", f"use one of {', '.join(DELEGATES)}"
            )
        if artifact.name.endswith("_edgetpu.tflite") and delegate_name != "edgetpu":
            raise ModelLoadError(
                f"{NAME}: {artifact} is compiled for the Edge TPU and needs the edgetpu delegate",
                'load it with delegate = "edgetpu", or use the plain .tflite for the CPU',
            )
        kwargs: dict[str, Any] = {"model_path": str(artifact)}
        if "num_threads" in opts:
            kwargs["num_threads"] = int(opts["num_threads"])
        device = "CPU (XNNPACK)"
        if delegate_name == "none":
            # XNNPACK is applied by default; this resolver leaves the reference kernels only.
            kwargs["experimental_op_resolver_type"] = (
                interpreter.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
            )
            device = "CPU (reference kernels)"
        elif delegate_name == "edgetpu":
            lib = _edgetpu_library(opts)
            tpu = opts.get("edgetpu_device")
            try:
                delegate = interpreter.load_delegate(lib, {"device": str(tpu)} if tpu else {})
            except (OSError, ValueError, RuntimeError) as err:
                raise ModelLoadError(
                    f"{NAME}: the Edge TPU delegate {lib} could not be loaded for {artifact}"
                    + (f" on {tpu}" if tpu else "")
                    + f": {err}",
                    EDGETPU_HINT,
                ) from err
            kwargs["experimental_delegates"] = [delegate]
            device = f"Edge TPU ({tpu or 'first found'})"
        try:
            interp = interpreter.Interpreter(**kwargs)
            interp.allocate_tensors()
        except Exception as err:
            raise load_failed(
                NAME, artifact, err, "a TFLite flatbuffer (.tflite) with ops this LiteRT supports"
            ) from err
        return LiteRTSession(artifact, interp, device)


def _spec(detail: dict[str, Any]) -> TensorSpec:
    signature = detail.get("shape_signature")
    dims = signature if signature is not None and len(signature) else detail["shape"]
    shape = tuple(None if int(d) < 0 else int(d) for d in dims)
    scale, zero_point = detail.get("quantization", (0.0, 0))
    q = Quantization(float(scale), int(zero_point)) if scale else None
    import numpy as np

    return TensorSpec(detail["name"], shape, np.dtype(detail["dtype"]).name, q)


class LiteRTSession(Session):
    backend = NAME

    def __init__(self, artifact: Path, interp: Any, device: str) -> None:
        ins, outs = interp.get_input_details(), interp.get_output_details()
        super().__init__(artifact, [_spec(d) for d in ins], [_spec(d) for d in outs], device)
        self._interp = interp
        self._in_index = [d["index"] for d in ins]
        self._out_index = [d["index"] for d in outs]

    def _run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        try:
            for index, arr in zip(self._in_index, arrays, strict=True):
                self._interp.set_tensor(index, arr)
            self._interp.invoke()
            return [self._interp.get_tensor(i) for i in self._out_index]  # get_tensor returns a copy
        except Exception as err:
            raise RunError(
                f"{NAME} failed running {self.artifact}: {err}", "check the input against session.inputs"
            ) from err

    def close(self) -> None:
        self._interp = None
        super().close()
