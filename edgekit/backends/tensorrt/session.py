"""A loaded TensorRT engine: its execution context, CUDA stream and device buffers, and running it.

Both TensorRT APIs are handled here: the tensor API of TensorRT >= 8.5 (the only one in
10.x) and the bindings API of TensorRT 8.0-8.4 (JetPack 4 ships 8.2).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.backends.base import Session, TensorSpec
from edgekit.backends.tensorrt.cuda import _cuda, _CudaError
from edgekit.backends.tensorrt.logger import _CAPTURE, _why
from edgekit.backends.tensorrt.options import NAME
from edgekit.errors import EdgekitError, ModelLoadError, RunError

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)


@dataclass
class _Tensor:
    """One engine input or output, with its device buffer."""

    name: str
    index: int
    is_input: bool
    dtype: str
    shape: tuple[int, ...]  # as the engine reports it: -1 for a free dimension
    min_shape: tuple[int, ...] = ()
    max_shape: tuple[int, ...] = ()
    ptr: int = 0
    nbytes: int = 0


def _numpy_dtype(trt: Any, trt_dtype: Any, name: str) -> str:
    import numpy as np

    try:
        return str(np.dtype(trt.nptype(trt_dtype)).name)
    except TypeError as err:
        # BF16, FP8 and INT4 have no numpy equivalent.
        raise ModelLoadError(
            f"{NAME}: tensor '{name}' has type {trt_dtype}, which numpy cannot hold ({err})",
            "export the model with float32/float16/int8 inputs and outputs",
        ) from err


class TensorRTSession(Session):
    """A TensorRT engine on one CUDA device, with its execution context, stream and device buffers."""

    backend = NAME

    def __init__(
        self, artifact: Path, *, trt: Any, cudart: Any, runtime: Any, engine: Any, device_id: int, gpu: str
    ) -> None:
        self._trt = trt
        self._cudart = cudart
        # The runtime is kept because an engine must not outlive the runtime that deserialized it.
        self._runtime: Any = runtime
        self._engine: Any = engine
        self._context: Any = None
        self._stream: Any = None
        self._device_id = device_id
        self._tensor_api = hasattr(engine, "num_io_tensors")  # TensorRT >= 8.5
        self._tensors: list[_Tensor] = []
        self._bindings: list[int] = []
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()  # one set of device buffers: one run at a time
        self._released = False
        try:
            inputs, outputs = self._setup()
        except BaseException:
            self._release()
            raise
        super().__init__(artifact, inputs, outputs, device=f"cuda:{device_id} ({gpu})")

    # ----- setup

    def _describe(self) -> list[_Tensor]:
        trt, engine = self._trt, self._engine
        tensors = []
        if self._tensor_api:
            for i in range(engine.num_io_tensors):
                name = engine.get_tensor_name(i)
                t = _Tensor(
                    name,
                    i,
                    engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT,
                    _numpy_dtype(trt, engine.get_tensor_dtype(name), name),
                    tuple(int(d) for d in engine.get_tensor_shape(name)),
                )
                if t.is_input and -1 in t.shape:
                    lo, _, hi = engine.get_tensor_profile_shape(name, 0)
                    t.min_shape, t.max_shape = tuple(int(d) for d in lo), tuple(int(d) for d in hi)
                tensors.append(t)
        else:
            for i in range(engine.num_bindings):
                name = engine.get_binding_name(i)
                t = _Tensor(
                    name,
                    i,
                    bool(engine.binding_is_input(i)),
                    _numpy_dtype(trt, engine.get_binding_dtype(i), name),
                    tuple(int(d) for d in engine.get_binding_shape(i)),
                )
                if t.is_input and -1 in t.shape:
                    lo, _, hi = engine.get_profile_shape(0, i)
                    t.min_shape, t.max_shape = tuple(int(d) for d in lo), tuple(int(d) for d in hi)
                tensors.append(t)
        for t in tensors:
            if t.is_input and not t.max_shape:
                t.min_shape = t.max_shape = t.shape
        return tensors

    def _set_shape(self, t: _Tensor, shape: tuple[int, ...]) -> bool:
        if -1 not in t.shape:
            return shape == t.shape  # a static input: nothing to tell TensorRT
        if self._shapes.get(t.name) == shape:
            return True
        if self._tensor_api:
            ok = self._context.set_input_shape(t.name, shape)
        else:
            ok = self._context.set_binding_shape(t.index, shape)
        # TensorRT 8.x returns a bool; some 10.x builds return None and log instead.
        if ok is False:
            return False
        self._shapes[t.name] = shape
        return True

    def _output_shape(self, t: _Tensor) -> tuple[int, ...]:
        dims = (
            self._context.get_tensor_shape(t.name)
            if self._tensor_api
            else self._context.get_binding_shape(t.index)
        )
        return tuple(int(d) for d in dims)

    def _setup(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        cudart = self._cudart
        if getattr(self._engine, "has_implicit_batch_dimension", False):
            raise ModelLoadError(
                f"{NAME}: the engine was built with an implicit batch dimension (UFF/Caffe era)",
                "rebuild it from an ONNX model (explicit batch)",
            )
        self._context = self._engine.create_execution_context()
        if self._context is None:
            raise ModelLoadError(
                f"{NAME}: could not create an execution context (out of GPU memory?)",
                "close other sessions or processes using the GPU",
            )
        self._tensors = self._describe()
        inputs = [t for t in self._tensors if t.is_input]
        outputs = [t for t in self._tensors if not t.is_input]

        # Output sizes at the smallest and largest input shapes: equal dimensions are fixed, the
        # largest sizes the buffers so they are allocated once for every shape the profile allows.
        out_shapes: list[dict[str, tuple[int, ...]]] = []
        for pick in ("min_shape", "max_shape"):
            for t in inputs:
                if not self._set_shape(t, getattr(t, pick)):
                    raise ModelLoadError(
                        f"{NAME}: the engine refused input '{t.name}' shape {getattr(t, pick)}",
                        "rebuild the engine",
                    )
            out_shapes.append({t.name: self._output_shape(t) for t in outputs})
        small, large = out_shapes
        for t in outputs:
            if any(d < 0 for d in large[t.name]):
                raise ModelLoadError(
                    f"{NAME}: output '{t.name}' has a data-dependent shape {large[t.name]}, which edgekit does not support",
                    "export the model with fixed-size outputs (e.g. pad NonZero/NMS results)",
                )

        def dims(lo: tuple[int, ...], hi: tuple[int, ...]) -> tuple[int | None, ...]:
            return tuple(a if a == b and a >= 0 else None for a, b in zip(lo, hi, strict=True))

        import numpy as np

        for t in self._tensors:
            shape = t.max_shape if t.is_input else large[t.name]
            t.nbytes = math.prod(shape) * np.dtype(t.dtype).itemsize
            # cudaMalloc(0) gives a null pointer TensorRT rejects; an empty tensor still gets a byte.
            t.ptr = int(_cuda(cudart, cudart.cudaMalloc(max(t.nbytes, 1)), "cudaMalloc"))
        self._stream = _cuda(cudart, cudart.cudaStreamCreate(), "cudaStreamCreate")
        # The buffers never move, so the addresses are bound once.
        self._bindings = [t.ptr for t in sorted(self._tensors, key=lambda t: t.index)]
        if self._tensor_api:
            for t in self._tensors:
                if not self._context.set_tensor_address(t.name, t.ptr):
                    raise ModelLoadError(f"{NAME}: could not bind tensor '{t.name}'", "rebuild the engine")
        return (
            [TensorSpec(t.name, dims(t.min_shape, t.max_shape), t.dtype) for t in inputs],
            [TensorSpec(t.name, dims(small[t.name], large[t.name]), t.dtype) for t in outputs],
        )

    # ----- run

    def _run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        try:
            with self._lock:
                return self._execute(arrays)
        except EdgekitError:
            raise
        except Exception as err:  # runtime boundary: every failure becomes one RunError
            raise RunError(
                f"{NAME} failed running {self.artifact} on {self.device}: {err}",
                "check the input against session.inputs; a CUDA error may need the process restarted",
            ) from err

    def _execute(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        import numpy as np

        cudart, context, stream = self._cudart, self._context, self._stream
        # The current device is per thread in CUDA; a session may run on another thread than it loaded on.
        _cuda(cudart, cudart.cudaSetDevice(self._device_id), "cudaSetDevice")
        inputs = [t for t in self._tensors if t.is_input]
        outputs = [t for t in self._tensors if not t.is_input]
        # Host arrays must stay alive (and contiguous) until the stream is synchronized.
        hosts = [np.ascontiguousarray(a) for a in arrays]
        mark = _CAPTURE.mark()
        for t, host in zip(inputs, hosts, strict=True):
            if not self._set_shape(t, tuple(host.shape)) or host.nbytes > t.nbytes:
                raise RunError(
                    f"{NAME}: input '{t.name}' shape {tuple(host.shape)} is outside the engine's range "
                    f"{t.min_shape}..{t.max_shape}: {_why(mark, 'refused by the engine')}",
                    "resize the input to the model's shape",
                )
        h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        for t, host in zip(inputs, hosts, strict=True):
            _cuda(
                cudart,
                cudart.cudaMemcpyAsync(t.ptr, host.ctypes.data, host.nbytes, h2d, stream),
                "cudaMemcpyAsync",
            )
        if self._tensor_api:
            ok = context.execute_async_v3(int(stream))
        else:
            # execute_v2 is synchronous and not ordered with our stream: the inputs must have landed.
            _cuda(cudart, cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
            ok = context.execute_v2(self._bindings)
        if ok is False:
            raise RunError(
                f"{NAME}: inference failed on {self.artifact}: {_why(mark, 'the engine returned false')}",
                "see the TensorRT errors logged above",
            )
        results = [np.empty(self._output_shape(t), dtype=t.dtype) for t in outputs]
        d2h = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for t, out in zip(outputs, results, strict=True):
            _cuda(
                cudart,
                cudart.cudaMemcpyAsync(out.ctypes.data, t.ptr, out.nbytes, d2h, stream),
                "cudaMemcpyAsync",
            )
        _cuda(cudart, cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        return results

    # ----- close

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        cudart = self._cudart
        for t in self._tensors:
            if t.ptr:
                try:
                    _cuda(cudart, cudart.cudaFree(t.ptr), "cudaFree")
                except _CudaError as err:
                    # close() runs in __exit__ and finally blocks: it must not hide the error being handled.
                    log.warning("tensorrt: %s", err)
                t.ptr = 0
        if self._stream is not None:
            try:
                _cuda(cudart, cudart.cudaStreamDestroy(self._stream), "cudaStreamDestroy")
            except _CudaError as err:
                log.warning("tensorrt: %s", err)
            self._stream = None
        self._bindings = []
        # Destruction order matters to TensorRT: context, then engine, then runtime.
        self._context = None
        self._engine = None
        self._runtime = None

    def close(self) -> None:
        """Free the device buffers, stream, context and engine; calling it again does nothing."""
        with self._lock:
            self._release()
        super().close()
