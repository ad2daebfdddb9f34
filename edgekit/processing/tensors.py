"""Adapt a float image batch to what a session takes, and its outputs back to float.

Artifacts of one model differ in layout (ONNX is NCHW, LiteRT NHWC) and in dtype (a
full-integer model takes int8/uint8 with a scale and zero point).  These functions are
the only place that knows; the build's evaluation and the device pipeline both use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgekit.backends.base import TensorSpec
from edgekit.processing.postprocess import TopK

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


def output_top_k(spec: TensorSpec, labels: Sequence[str], k: int = 5, *, logits: bool = True) -> TopK:
    """A classifier output's top-k, built once per session output and called per frame on the raw output.

    ``top(y)`` gives exactly ``top_k(from_output(y, spec).reshape(-1), labels, k, logits=logits)``.
    An 8-bit quantized output is ranked on its codes (dequantizing keeps their order when the
    scale is positive): only the k best codes and the softmax denominator are looked up in a
    table of every code's dequantized score, made here by ``from_output`` itself.
    """
    import numpy as np

    def dequantize(y: np.ndarray) -> np.ndarray:
        # A float32 output that is not quantized is what from_output returns it as: no call.
        return y if y.dtype == np.float32 and spec.quantization is None else from_output(y, spec)

    dtype = np.dtype(spec.dtype)
    codes = None
    if spec.quantization is not None and dtype.kind in "iu" and dtype.itemsize == 1:
        codes = from_output(np.arange(256, dtype=np.uint8).view(dtype), spec)  # indexed by the byte
    return TopK(labels, k, logits=logits, dequantize=dequantize, codes=codes, codes_dtype=spec.dtype)
