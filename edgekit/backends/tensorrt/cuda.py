"""cuda-python's runtime bindings as the TensorRT backend uses them: the import and the error check.

cuda-python returns ``(err, *values)`` from every call instead of raising; :func:`_cuda`
unpacks that and raises :class:`_CudaError`, which the backend turns into a
``ModelLoadError`` or ``RunError`` at its boundary.
"""

from __future__ import annotations

from typing import Any


def _import_cudart() -> Any:
    # cuda-python >= 12.6 moved the runtime bindings to cuda.bindings; older releases only have cuda.cudart.
    try:
        from cuda.bindings import runtime

        return runtime
    except ImportError:
        from cuda import cudart

        return cudart


class _CudaError(RuntimeError):
    """A CUDA runtime call failed; converted to RunError / ModelLoadError at the boundary."""


def _cuda_error_name(cudart: Any, err: Any) -> str:
    result = cudart.cudaGetErrorName(err)
    name = result[1] if isinstance(result, tuple) and len(result) == 2 else getattr(err, "name", err)
    return name.decode() if isinstance(name, bytes) else str(name)


def _cuda(cudart: Any, result: Any, call: str) -> Any:
    """Unpack cuda-python's ``(err, *values)`` result, raising if ``err`` is not cudaSuccess."""
    err, values = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if err != cudart.cudaError_t.cudaSuccess:
        raise _CudaError(f"{call} failed: {_cuda_error_name(cudart, err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _gpu_name(cudart: Any, device_id: int) -> str:
    props = _cuda(cudart, cudart.cudaGetDeviceProperties(device_id), "cudaGetDeviceProperties")
    name = props.name
    if isinstance(name, bytes):
        name = name.split(b"\0", 1)[0].decode(errors="replace")
    return str(name).strip() or f"cuda device {device_id}"
