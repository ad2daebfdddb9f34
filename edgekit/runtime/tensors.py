"""Adapt a float image batch to what a session takes, and its outputs back to float.

Artifacts of one model differ in layout (ONNX is NCHW, LiteRT NHWC) and in dtype (a
full-integer model takes int8/uint8 with a scale and zero point).  These two functions are
the only place that knows; the build's evaluation and the device pipeline both use them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgekit.backends.base import TensorSpec

if TYPE_CHECKING:
    import numpy as np


def to_input(x_nchw: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """A float32 NCHW batch -> the session's layout and dtype (quantized when the input is)."""
    import numpy as np

    x = x_nchw
    if spec.layout == "NHWC" and x.ndim == 4 and x.shape[1] == 3:
        x = x.transpose(0, 2, 3, 1)
    if spec.quantization is not None:
        q = spec.quantization
        info = np.iinfo(np.dtype(spec.dtype))
        x = np.clip(np.rint(x / q.scale + q.zero_point), info.min, info.max)
    return np.ascontiguousarray(x, dtype=np.dtype(spec.dtype))


def from_output(y: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """A session output -> float32, dequantized when the output is quantized."""
    import numpy as np

    if spec.quantization is not None:
        q = spec.quantization
        return ((y.astype(np.float32) - q.zero_point) * q.scale).astype(np.float32)
    return y.astype(np.float32, copy=False)
