"""The Open Inference Protocol's wire forms, without a server: raw tensors, BYTES, JSON and binary bodies, image headers."""

from __future__ import annotations

import struct
import subprocess
import sys

import cv2
import numpy as np
import pytest

from edgekit.serve.datatypes import bytes_tensor, checked_shape, from_raw, to_raw
from edgekit.serve.endpoints import Tensor
from edgekit.serve.images import decode, image_size
from edgekit.serve.limits import Limits
from edgekit.serve.outcomes import Outcome, ProtocolError
from edgekit.serve.rest_wire import decode_request, encode_response

from conftest import ROOT


def test_the_committed_descriptor_is_the_protocols_proto_compiled() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is not installed (pip install -e '.[dev]')")
    r = subprocess.run(
        [sys.executable, "tools/oip_descriptor.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


def test_the_messages_live_beside_tritonclients_own_in_one_process() -> None:
    pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed")
    from tritonclient.grpc import service_pb2

    from edgekit.serve.messages import messages

    ours = messages()["ModelInferRequest"](model_name="m", raw_input_contents=[b"\x01\x02"])
    theirs = service_pb2.ModelInferRequest.FromString(ours.SerializeToString())  # same wire form
    assert theirs.model_name == "m" and list(theirs.raw_input_contents) == [b"\x01\x02"]


def test_bytes_tensors_round_trip_and_a_short_one_is_an_error() -> None:
    items = np.array([b"", b"abc", "caf\u00e9".encode()], dtype=object)
    raw = to_raw(items)
    assert raw[:4] == struct.pack("<I", 0) and bytes_tensor("x", raw, 3).tolist() == items.tolist()
    with pytest.raises(ProtocolError, match="ends inside element 3"):
        bytes_tensor("x", raw, 4)
    with pytest.raises(ProtocolError, match="left over"):
        bytes_tensor("x", raw + b"\x00", 3)


def test_raw_tensors_must_have_the_bytes_their_shape_says() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(from_raw("x", to_raw(x), "FP32", (2, 3)), x)
    with pytest.raises(ProtocolError, match="24 bytes of data for a FP32 tensor of shape \\[2, 4\\]"):
        from_raw("x", to_raw(x), "FP32", (2, 4))
    with pytest.raises(ProtocolError, match="datatype 'BF16' is not supported"):
        from_raw("x", b"", "BF16", (0,))
    with pytest.raises(ProtocolError) as big:
        checked_shape("x", [4096, 4096, 3], Limits(max_elements=1_000_000))
    assert big.value.outcome is Outcome.TOO_LARGE
    with pytest.raises(ProtocolError, match="integers >= 0"):
        checked_shape("x", [1, -1], Limits())


def test_a_binary_body_and_a_json_one_decode_to_the_same_tensor() -> None:
    x = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    head = (
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3,4],"parameters":{"binary_data_size":48}}],'
        b'"outputs":[{"name":"y","parameters":{"binary_data":true}}],"parameters":{"top_k":3}}'
    )
    binary = decode_request(head + x.tobytes(), str(len(head)), Limits())
    as_json = decode_request(
        b'{"id":"7","inputs":[{"name":"x","datatype":"FP32","shape":[1,3,4],"data":'
        + str(x.tolist()).encode()
        + b"}]}",
        None,
        Limits(),
    )
    np.testing.assert_array_equal(binary.inputs["x"], x)
    np.testing.assert_array_equal(as_json.inputs["x"], x)
    assert binary.outputs == ("y",) and binary.binary == {"y"} and binary.parameters == {"top_k": 3}
    assert as_json.id == "7" and as_json.outputs is None and not as_json.binary_all
    with pytest.raises(ProtocolError, match="11 data elements for shape \\[1, 3, 4\\]"):
        decode_request(
            b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3,4],"data":[' + b"1," * 10 + b"1]}]}",
            None,
            Limits(),
        )
    with pytest.raises(ProtocolError, match="its data is not INT32"):
        decode_request(
            b'{"inputs":[{"name":"x","datatype":"INT32","shape":[1],"data":["a"]}]}', None, Limits()
        )


def test_a_response_puts_binary_outputs_after_its_json_header() -> None:
    import json

    asked = decode_request(b'{"inputs":[],"parameters":{"binary_data_output":true}}', None, Limits())
    y = Tensor("y", "FP32", np.array([[0.5, 1.5]], np.float32))
    names = Tensor("n", "BYTES", np.array([b"cat"], dtype=object))
    body, header = encode_response("m", "1", asked, [y, names])
    assert header is not None
    doc = json.loads(body[:header])
    assert doc["outputs"][0] == {
        "name": "y",
        "datatype": "FP32",
        "shape": [1, 2],
        "parameters": {"binary_data_size": 8},
    }
    assert (
        body[header : header + 8] == y.data.tobytes() and body[header + 8 :] == struct.pack("<I", 3) + b"cat"
    )
    plain, none = encode_response("m", "1", decode_request(b'{"inputs":[]}', None, Limits()), [y, names])
    assert none is None and json.loads(plain)["outputs"][1]["data"] == ["cat"]


def test_image_sizes_come_from_the_header_and_big_ones_are_not_decoded() -> None:
    image = np.zeros((48, 80, 3), np.uint8)
    for ext in (".png", ".jpg"):
        ok, data = cv2.imencode(ext, image)
        assert ok and image_size(data.tobytes()) == (80, 48)
        assert decode(data.tobytes(), 10_000).shape == (48, 80, 3)
        with pytest.raises(ProtocolError, match="3,840 pixels, over this server's 1,000") as err:
            decode(data.tobytes(), 1000)
        assert err.value.outcome is Outcome.TOO_LARGE
    with pytest.raises(ProtocolError, match="not a JPEG or PNG"):
        image_size(b"GIF89a")
    ok, data = cv2.imencode(".png", image)
    with pytest.raises(ProtocolError, match="does not decode"):
        decode(data.tobytes()[:60], 10_000)
