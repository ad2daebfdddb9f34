"""The Open Inference Protocol's HTTP/REST bodies: JSON tensors and the binary tensor data extension.

A request body is JSON, or (binary extension) JSON of ``Inference-Header-Content-Length``
bytes followed by the inputs whose ``parameters.binary_data_size`` is set, in input order,
each that many bytes of raw tensor (``edgekit.serve.datatypes``).  An output comes back in
binary when the request's ``parameters.binary_data_output`` or the output's own
``parameters.binary_data`` says so (tritonclient asks for every output in binary when it
names none); the response then carries ``Inference-Header-Content-Length`` too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgekit.serve.datatypes import checked_shape, from_raw, numpy_dtype, to_raw
from edgekit.serve.limits import Limits
from edgekit.serve.outcomes import ProtocolError

if TYPE_CHECKING:
    import numpy as np

    from edgekit.serve.endpoints import Tensor

HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass
class RestRequest:
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...] | None
    parameters: dict[str, Any]
    id: str = ""
    #: Outputs asked for in binary, by name; ``binary_all``: every output.
    binary: set[str] = field(default_factory=set)
    binary_all: bool = False


def _loads(data: bytes) -> Any:
    import orjson

    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise ProtocolError(f"the request is not valid JSON: {err}") from None


def _params(obj: Mapping[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters", {})
    if not isinstance(params, dict):
        raise ProtocolError(f"{where}: parameters must be an object")
    return params


def decode_request(body: bytes, header_length: str | None, limits: Limits) -> RestRequest:
    """An infer request's body (and its ``Inference-Header-Content-Length``) -> its tensors and asks."""
    if header_length is None:
        head, rest = body, b""
    else:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise ProtocolError(
                f"{HEADER_LENGTH}: {header_length!r} is not a length within the body's {len(body)} bytes"
            )
        n = int(header_length)
        head, rest = body[:n], body[n:]
    doc = _loads(head)
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise ProtocolError("the request must be a JSON object with an 'inputs' list")
    params = _params(doc, "request")
    raw = memoryview(rest)
    at = 0
    inputs: dict[str, np.ndarray] = {}
    for item in doc["inputs"]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ProtocolError("each input must be an object with a 'name'")
        name = item["name"]
        if name in inputs:
            raise ProtocolError(f"input '{name}' given twice")
        datatype = item.get("datatype")
        if not isinstance(datatype, str):
            raise ProtocolError(f"input '{name}': datatype missing")
        shape = checked_shape(name, item.get("shape"), limits)  # type: ignore[arg-type]
        size = _params(item, f"input '{name}'").get("binary_data_size")
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0 or at + size > len(raw):
                raise ProtocolError(
                    f"input '{name}': binary_data_size {size!r} does not fit the {len(raw) - at} bytes left"
                )
            inputs[name] = from_raw(name, raw[at : at + size], datatype, shape)
            at += size
        elif "data" in item:
            inputs[name] = _from_json(name, item["data"], datatype, shape)
        else:
            raise ProtocolError(f"input '{name}': neither 'data' nor parameters.binary_data_size")
    if at != len(raw):
        raise ProtocolError(f"{len(raw) - at} bytes of binary data after the last input's")
    outputs, binary = None, set()
    if "outputs" in doc:
        if not isinstance(doc["outputs"], list) or not all(
            isinstance(o, dict) and isinstance(o.get("name"), str) for o in doc["outputs"]
        ):
            raise ProtocolError("'outputs' must be a list of objects with a 'name'")
        outputs = tuple(o["name"] for o in doc["outputs"])
        binary = {o["name"] for o in doc["outputs"] if _params(o, f"output '{o['name']}'").get("binary_data")}
    request_id = doc.get("id", "")
    return RestRequest(
        inputs=inputs,
        outputs=outputs,
        parameters=params,
        id=request_id if isinstance(request_id, str) else str(request_id),
        binary=binary,
        binary_all=params.get("binary_data_output") is True,
    )


def _from_json(name: str, data: Any, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    import numpy as np

    dtype = numpy_dtype(datatype)
    try:
        if datatype == "BYTES":
            flat = np.asarray(data, dtype=object).reshape(-1)
            if not all(isinstance(v, str) for v in flat):
                raise ValueError("BYTES elements in JSON are strings")
            array = np.empty(flat.size, dtype=object)
            array[:] = [v.encode() for v in flat]
        else:
            array = np.asarray(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as err:
        raise ProtocolError(f"input '{name}': its data is not {datatype}: {err}") from None
    if array.size != math.prod(shape):
        raise ProtocolError(
            f"input '{name}': {array.size} data elements for shape {list(shape)} ({math.prod(shape)} expected)"
        )
    return array.reshape(shape)


def encode_response(
    model: str, version: str, request: RestRequest, outputs: list[Tensor]
) -> tuple[bytes, int | None]:
    """The response body, and its JSON header's length when any output is in binary."""
    import orjson

    described: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for t in outputs:
        entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.data.shape)}
        if request.binary_all or t.name in request.binary:
            blob = to_raw(t.data)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif t.datatype == "BYTES":
            entry["data"] = [b.decode("utf-8", "replace") for b in t.data.reshape(-1)]
        else:
            entry["data"] = t.data.reshape(-1)
        described.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": described}
    if request.id:
        doc["id"] = request.id
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)
