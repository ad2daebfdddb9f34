"""Tensors on the wire: the Open Inference Protocol's datatypes, and raw bytes <-> numpy arrays.

A tensor's raw form is the same over HTTP's binary extension and gRPC's ``raw_*_contents``:
its elements in row-major order, little-endian; a ``BYTES`` tensor is each element as a
4-byte little-endian length and then its bytes.  ``BF16`` has no numpy dtype and is refused.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgekit.serve.limits import Limits
from edgekit.serve.outcomes import Outcome, ProtocolError

if TYPE_CHECKING:
    import numpy as np

#: OIP datatype -> numpy dtype name (``object`` for BYTES: an array of ``bytes``).
NUMPY = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "object",
}
_OIP = {v: k for k, v in NUMPY.items()}


def oip_datatype(dtype: object) -> str:
    """The OIP datatype of a numpy dtype (or its name)."""
    import numpy as np

    name = np.dtype(dtype).name  # type: ignore[call-overload]
    if name.startswith(("bytes", "str")):
        return "BYTES"
    return _OIP[name]


def numpy_dtype(datatype: str) -> np.dtype:
    import numpy as np

    name = NUMPY.get(datatype)
    if name is None:
        raise ProtocolError(
            f"datatype {datatype!r} is not supported here: one of {', '.join(NUMPY)}", Outcome.INVALID
        )
    return np.dtype(name)


def checked_shape(name: str, shape: Sequence[object], limits: Limits) -> tuple[int, ...]:
    """``shape`` as ints, each >= 0, with at most ``limits.max_elements`` elements in all."""
    if not isinstance(shape, Sequence) or isinstance(shape, (str, bytes)):
        raise ProtocolError(f"input '{name}': shape must be a list of integers, got {shape!r}")
    dims: list[int] = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise ProtocolError(f"input '{name}': shape {list(shape)} must hold integers >= 0")
        dims.append(d)
    if math.prod(dims) > limits.max_elements:
        raise ProtocolError(
            f"input '{name}': shape {dims} has {math.prod(dims):,} elements, over this server's "
            f"{limits.max_elements:,}",
            Outcome.TOO_LARGE,
        )
    return tuple(dims)


def from_raw(name: str, raw: bytes | memoryview, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    """A tensor's raw bytes as an array of ``shape`` (a copy-free view where numpy allows)."""
    import numpy as np

    count = math.prod(shape)
    if datatype == "BYTES":
        return bytes_tensor(name, raw, count).reshape(shape)
    dtype = numpy_dtype(datatype)
    if len(raw) != count * dtype.itemsize:
        raise ProtocolError(
            f"input '{name}': {len(raw)} bytes of data for a {datatype} tensor of shape {list(shape)} "
            f"({count * dtype.itemsize} bytes expected)"
        )
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(shape)


def bytes_tensor(name: str, raw: bytes | memoryview, count: int) -> np.ndarray:
    """A BYTES tensor's raw form (length-prefixed elements) -> a flat object array of ``count`` bytes."""
    import numpy as np

    view = memoryview(raw)
    out = np.empty(count, dtype=object)
    at = 0
    for i in range(count):
        if at + 4 > len(view):
            raise ProtocolError(f"input '{name}': BYTES data ends inside element {i} of {count}")
        (n,) = struct.unpack_from("<I", view, at)
        at += 4
        if at + n > len(view):
            raise ProtocolError(f"input '{name}': BYTES element {i} says {n} bytes, fewer are left")
        out[i] = bytes(view[at : at + n])
        at += n
    if at != len(view):
        raise ProtocolError(f"input '{name}': {len(view) - at} bytes left over after {count} BYTES elements")
    return out


def to_raw(array: np.ndarray) -> bytes:
    """An output's raw form (row-major, little-endian; BYTES length-prefixed)."""
    import numpy as np

    if array.dtype == object:
        parts: list[bytes] = []
        for item in array.reshape(-1):
            data = item if isinstance(item, bytes) else str(item).encode()
            parts.append(struct.pack("<I", len(data)))
            parts.append(data)
        return b"".join(parts)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
