"""The Open Inference Protocol over gRPC: ``inference.GRPCInferenceService`` on grpcio.

Inputs come as ``raw_input_contents`` (one raw tensor per input, in order: what tritonclient
sends) or as each input's typed ``contents``; outputs always go back as ``raw_output_contents``.
A refused request is aborted with the outcome's status code and the message the HTTP server
would put in its ``{"error": ...}``.  With a token, every method but ``ServerLive`` and
``ServerReady`` needs the metadata ``authorization: Bearer <token>``.

The service is registered as a generic handler over the message classes of
``edgekit.serve.messages`` (no generated ``_pb2_grpc`` module: see there why).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from edgekit.serve.datatypes import checked_shape, from_raw, numpy_dtype, to_raw
from edgekit.serve.endpoints import InferRequest
from edgekit.serve.messages import METHODS, SERVICE, messages
from edgekit.serve.outcomes import ProtocolError
from edgekit.serve.service import Service

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

PROTOCOL = "grpc"
OPEN_METHODS = frozenset({"ServerLive", "ServerReady"})
#: Each datatype's field of ``InferTensorContents``.
CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def _parameters(params: Any) -> dict[str, Any]:
    return {
        k: getattr(v, v.WhichOneof("parameter_choice"))
        for k, v in params.items()
        if v.WhichOneof("parameter_choice")
    }


class InferenceServicer:
    def __init__(self, service: Service, token: str | None) -> None:
        self.service = service
        self._bearer = None if token is None else f"Bearer {token}".encode()
        self.m = messages()

    def _authorized(self, context: Any) -> bool:
        if self._bearer is None:
            return True
        offered = dict(context.invocation_metadata()).get("authorization", "")
        return hmac.compare_digest(str(offered).encode(), self._bearer)

    def handler(self) -> Any:
        import grpc

        def guard(method: str, fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
            def call(request: Any, context: Any) -> Any:
                if method not in OPEN_METHODS and not self._authorized(context):
                    context.abort(
                        grpc.StatusCode.UNAUTHENTICATED,
                        "this server needs its token: send the metadata 'authorization: Bearer <token>'",
                    )
                try:
                    return fn(request, context)
                except ProtocolError as err:
                    context.abort(getattr(grpc.StatusCode, err.outcome.grpc_code), err.message)
                except Exception as err:  # a defect here: the client gets INTERNAL, the log the traceback
                    log.exception("serve: gRPC %s failed", method)
                    context.abort(grpc.StatusCode.INTERNAL, f"{method} failed: {err}")

            return call

        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                guard(name, getattr(self, name)),
                request_deserializer=self.m[req].FromString,
                response_serializer=self.m[resp].SerializeToString,
            )
            for name, (req, resp) in METHODS.items()
        }
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    def ServerLive(self, request: Any, context: Any) -> Any:
        return self.m["ServerLiveResponse"](live=True)

    def ServerReady(self, request: Any, context: Any) -> Any:
        return self.m["ServerReadyResponse"](ready=self.service.ready)

    def ModelReady(self, request: Any, context: Any) -> Any:
        try:
            self.service.endpoint(request.name, request.version)
        except ProtocolError:  # not an error to ask: a model this server lacks is not ready (as Triton says)
            return self.m["ModelReadyResponse"](ready=False)
        return self.m["ModelReadyResponse"](ready=self.service.ready)

    def ServerMetadata(self, request: Any, context: Any) -> Any:
        return self.m["ServerMetadataResponse"](**self.service.server_metadata())

    def ModelMetadata(self, request: Any, context: Any) -> Any:
        meta = self.service.endpoint(request.name, request.version).metadata()
        tensor = self.m["ModelMetadataResponse"].TensorMetadata
        return self.m["ModelMetadataResponse"](
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[tensor(**t) for t in meta["inputs"]],
            outputs=[tensor(**t) for t in meta["outputs"]],
        )

    def ModelInfer(self, request: Any, context: Any) -> Any:
        started = time.perf_counter()
        service = self.service
        timing = None
        if service.tracer is not None:  # the caller's trace, in the metadata as W3C says for HTTP
            timing = service.timing(dict(context.invocation_metadata()).get("traceparent"))
        try:
            endpoint = service.endpoint(request.model_name, request.model_version)
            inputs = self._inputs(request)
        except ProtocolError as err:
            service.refused(request.model_name, PROTOCOL, err, timing)
            raise
        remaining = context.time_remaining()  # the client's deadline, if it set one
        result = service.infer(
            InferRequest(
                endpoint,
                inputs,
                tuple(o.name for o in request.outputs) or None,
                _parameters(request.parameters),
                request.id,
                service.deadline(remaining),
                timing,
            ),
            PROTOCOL,
        )
        response = self.m["ModelInferResponse"](
            model_name=endpoint.name, model_version=endpoint.version, id=request.id
        )
        for t in result.outputs:
            response.outputs.add(name=t.name, datatype=t.datatype, shape=list(t.data.shape))
            response.raw_output_contents.append(to_raw(t.data))
        service.answered(endpoint.name, started, timing)
        return response

    def _inputs(self, request: Any) -> dict[str, np.ndarray]:
        import numpy as np

        limits = self.service.limits
        raw = request.raw_input_contents
        if raw and len(raw) != len(request.inputs):
            raise ProtocolError(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
        out: dict[str, np.ndarray] = {}
        for i, t in enumerate(request.inputs):
            if t.name in out:
                raise ProtocolError(f"input '{t.name}' given twice")
            shape = checked_shape(t.name, list(t.shape), limits)
            if raw:
                out[t.name] = from_raw(t.name, raw[i], t.datatype, shape)
                continue
            field = CONTENTS.get(t.datatype)
            dtype = numpy_dtype(t.datatype)
            if field is None:
                raise ProtocolError(
                    f"input '{t.name}': {t.datatype} has no typed contents; send raw_input_contents"
                )
            values = getattr(t.contents, field)
            if len(values) != int(np.prod(shape)):
                raise ProtocolError(
                    f"input '{t.name}': {len(values)} contents for shape {list(shape)} ({int(np.prod(shape))} expected)"
                )
            if t.datatype == "BYTES":
                array = np.empty(len(values), dtype=object)
                array[:] = list(values)
            else:
                array = np.asarray(values, dtype=dtype)
            out[t.name] = array.reshape(shape)
        return out


def make_server(
    service: Service,
    address: str,
    token: str | None,
    tls: tuple[bytes, bytes] | None = None,
    workers: int | None = None,
) -> tuple[Any, int]:
    """A started-to-be gRPC server on ``address`` (``host:port``, port 0: any free), and its port."""
    import grpc

    if workers is None:
        # A handler thread waits for its request's answer: one for each request that may be
        # waiting, gathered into a batch or running, and two to answer the next ones 429 at
        # once.  With fewer, requests wait in gRPC's own queue and never meet in a batch.
        workers = service.limits.queue_size + 2 * service.batching.max_batch + 2
    cap = service.limits.max_request_bytes
    server = grpc.server(
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="edgekit-serve-grpc"),
        options=[
            ("grpc.max_receive_message_length", cap),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=workers + service.limits.queue_size,
    )
    server.add_generic_rpc_handlers((InferenceServicer(service, token).handler(),))
    if tls is None:
        port = server.add_insecure_port(address)
    else:
        key, cert = tls
        port = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
    return server, port
