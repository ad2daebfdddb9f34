"""``edgekit serve``'s limits, in process: a full queue, an expired deadline, oversized requests.

The model's runtime is made slow by a stand-in gate around its real session (``Gate``), so
that the queue fills because the test holds the worker, not because this machine is slow.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tiny_detector as td

import edgekit
from edgekit.bundle import generate_keypair
from edgekit.serve import Limits, Running, ServeOptions, start

httpclient = pytest.importorskip(
    "tritonclient.http", reason="tritonclient is not installed (pip install -e '.[dev]')"
)
grpcclient = pytest.importorskip(
    "tritonclient.grpc", reason="tritonclient is not installed (pip install -e '.[dev]')"
)
from tritonclient.utils import InferenceServerException  # noqa: E402


class Gate:
    """Wraps a session's ``run``: each call waits until the test opens the gate; counts the calls."""

    def __init__(self, run: Any) -> None:
        self._run = run
        self.entered = threading.Event()
        self.open = threading.Event()
        self.calls = 0

    def __call__(self, *arrays: Any) -> Any:
        self.calls += 1
        self.entered.set()
        assert self.open.wait(30), "the test never opened the gate"
        return self._run(*arrays)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    keys = generate_keypair(tmp_path_factory.mktemp("keys") / "signer")
    return td.classifier_bundle(tmp_path_factory.mktemp("cls") / "tiny", keys[0]), keys[1]


@pytest.fixture
def model(bundle: tuple[Path, Path]) -> Iterator[edgekit.Model]:
    with edgekit.load(bundle[0], device="x86_64-cpu", trusted_keys=[bundle[1]], measure=False) as m:
        yield m


def serve(model: edgekit.Model, **limits: Any) -> Running:
    return start(model, ServeOptions(http_port=0, grpc_port=0, limits=Limits(**limits)))


def tensor(model: edgekit.Model, module: Any) -> Any:
    spec = model.session.inputs[0]
    shape = [1 if d is None else d for d in spec.shape]
    inp = module.InferInput(spec.name, shape, "FP32")
    inp.set_data_from_numpy(np.zeros(shape, np.float32))
    return inp


def test_a_full_queue_is_answered_at_once_429_and_resource_exhausted(model: edgekit.Model) -> None:
    gate = Gate(model.session.run)
    model.session.run = gate  # type: ignore[method-assign]
    running = serve(model, queue_size=2)
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}", concurrency=4)
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
        with ThreadPoolExecutor(3) as pool:
            busy = pool.submit(http.infer, "tiny-classifier", [tensor(model, httpclient)])
            assert gate.entered.wait(30)  # the worker holds this one
            waiting = [
                pool.submit(http.infer, "tiny-classifier", [tensor(model, httpclient)]) for _ in range(2)
            ]
            for _ in range(3000):
                if running.service.queue.depth == 2:
                    break
                threading.Event().wait(0.01)
            assert running.service.queue.depth == 2
            with pytest.raises(InferenceServerException, match="busy") as full:
                http.infer("tiny-classifier", [tensor(model, httpclient)])
            assert full.value.status() == "429"
            with pytest.raises(InferenceServerException, match="busy") as full_grpc:
                grpc.infer("tiny-classifier", [tensor(model, grpcclient)])
            assert full_grpc.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            gate.open.set()
            for f in (busy, *waiting):
                assert f.result(30).as_numpy(model.session.outputs[0].name).shape[-1] == 10
        assert gate.calls == 3  # the refused ones never reached the model
        counts = running.service.metrics.requests()
        assert (
            counts[("tiny-classifier", "http", "busy")] == 1
            and counts[("tiny-classifier", "grpc", "busy")] == 1
        )
    finally:
        gate.open.set()
        running.stop()


def test_a_request_past_its_deadline_is_answered_not_computed(model: edgekit.Model) -> None:
    gate = Gate(model.session.run)
    model.session.run = gate  # type: ignore[method-assign]
    running = serve(model, queue_size=4, deadline_s=0.2)
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}", concurrency=4)
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(http.infer, "tiny-classifier", [tensor(model, httpclient)])
            assert gate.entered.wait(30)
            late = pool.submit(http.infer, "tiny-classifier", [tensor(model, httpclient)])
            for _ in range(3000):
                if running.service.queue.depth == 1:
                    break
                threading.Event().wait(0.01)
            threading.Event().wait(0.3)  # past the second one's deadline while the first holds the worker
            gate.open.set()
            first.result(30)
            with pytest.raises(InferenceServerException, match="past its deadline: not computed") as err:
                late.result(30)
        assert err.value.status() == "504"
        assert gate.calls == 1
    finally:
        gate.open.set()
        running.stop()


def test_oversized_requests_are_refused_before_they_are_read_or_decoded(model: edgekit.Model) -> None:
    running = serve(model, max_request_bytes=64 * 1024, max_elements=1000, max_image_pixels=10_000)
    try:
        url = f"http://127.0.0.1:{running.http_port}/v2/models/tiny-classifier-image/infer"
        body = b"{" + b" " * (100 * 1024) + b"}"
        req = urllib.request.Request(url, data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as big:
            urllib.request.urlopen(req, timeout=10)
        assert big.value.code == 413 and "over this server's 65,536" in big.value.read().decode()
        http = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}")
        with pytest.raises(
            InferenceServerException, match="3,072 elements, over this server's 1,000"
        ) as many:
            http.infer("tiny-classifier", [tensor(model, httpclient)])
        assert many.value.status() == "413"
        # A PNG header that claims a 20000x20000 picture: refused from the header, never decoded.
        claims = td_png_header(20000, 20000)
        inp = httpclient.InferInput("IMAGE", [1], "BYTES")
        inp.set_data_from_numpy(np.array([claims], dtype=object))
        with pytest.raises(InferenceServerException, match="400,000,000 pixels, over this server's 10,000"):
            http.infer("tiny-classifier-image", [inp])
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
        big_tensor = grpcclient.InferInput("IMAGE", [200, 200, 3], "UINT8")
        big_tensor.set_data_from_numpy(np.zeros((200, 200, 3), np.uint8))
        with pytest.raises(InferenceServerException) as grpc_big:
            grpc.infer("tiny-classifier-image", [big_tensor])
        assert grpc_big.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert http.is_server_ready()
    finally:
        running.stop()


def td_png_header(width: int, height: int) -> bytes:
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))


def test_off_loopback_without_a_token_start_refuses(model: edgekit.Model) -> None:
    from edgekit.errors import EdgekitError

    with pytest.raises(EdgekitError, match="would let anyone"):
        start(model, ServeOptions(host="0.0.0.0", http_port=0, grpc_port=0))


def test_a_port_in_use_is_an_error_that_names_it(model: edgekit.Model) -> None:
    import socket

    from edgekit.errors import EdgekitError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(EdgekitError, match=f"cannot listen on 127.0.0.1:{port} for gRPC"):
            start(model, ServeOptions(http_port=0, grpc_port=port))
        with pytest.raises(EdgekitError, match=f"cannot listen on 127.0.0.1:{port} for HTTP"):
            start(model, ServeOptions(http_port=port, grpc_port=0))
    running = serve(model)  # nothing was left holding the model or a port
    running.stop()
