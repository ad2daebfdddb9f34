"""The Open Inference Protocol over HTTP/REST: a Starlette app (served by uvicorn, as ``fleet serve`` is).

Routes (``{v}``: optional ``/versions/<version>``): ``GET /v2`` (server metadata),
``GET /v2/health/live`` and ``/v2/health/ready``, ``GET /v2/models/<name>{v}`` (model
metadata), ``GET /v2/models/<name>{v}/ready``, ``POST /v2/models/<name>{v}/infer``, and
``GET /metrics``.  Errors are the protocol's ``{"error": "..."}`` with the outcome's status.

Guarded as every edgekit listener (``edgekit.core.listeners``): only the ``Host`` names the
server answers to, and with a token every request but the two health probes must carry
``Authorization: Bearer <token>``.  A body is read up to ``Limits.max_request_bytes`` and no
further; decoding, the wait for the worker and encoding run in Starlette's thread pool, so the
event loop only moves bytes.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from edgekit.serve.endpoints import InferRequest
from edgekit.serve.metrics import CONTENT_TYPE
from edgekit.serve.outcomes import Outcome, ProtocolError
from edgekit.serve.rest_wire import HEADER_LENGTH, decode_request, encode_response
from edgekit.serve.service import Service

#: Answered without the token: a load balancer's or an orchestrator's probes.
OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
PROTOCOL = "http"


def _error(err: ProtocolError) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": err.message}, status_code=err.outcome.http_status)


class BearerToken:
    """ASGI middleware: every request but ``OPEN_PATHS`` carries ``Authorization: Bearer <token>``."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self._bearer = f"Bearer {token}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        offered = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(offered, self._bearer):
            await self.app(scope, receive, send)
            return
        refusal = _error(
            ProtocolError(
                "this server needs its token: send 'Authorization: Bearer <token>'", Outcome.UNAUTHENTICATED
            )
        )
        refusal.headers["www-authenticate"] = 'Bearer realm="edgekit serve"'
        await refusal(scope, receive, send)


async def _body(request: Any, cap: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise ProtocolError(
            f"the request is {int(declared):,} bytes, over this server's {cap:,}", Outcome.TOO_LARGE
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise ProtocolError(f"the request is over this server's {cap:,} bytes", Outcome.TOO_LARGE)
        chunks.append(chunk)
    return b"".join(chunks)


def make_app(service: Service, token: str | None, hosts: list[str]) -> Any:
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def model_of(request: Any) -> Any:
        params = request.path_params
        return service.endpoint(params["model"], params.get("version", ""))

    async def server_metadata(request: Any) -> Any:
        return JSONResponse(service.server_metadata())

    async def live(request: Any) -> Any:
        return Response(status_code=200)

    async def ready(request: Any) -> Any:
        return Response(status_code=200 if service.ready else 503)

    async def model_metadata(request: Any) -> Any:
        try:
            return JSONResponse(model_of(request).metadata())
        except ProtocolError as err:
            return _error(err)

    async def model_ready(request: Any) -> Any:
        try:
            model_of(request)
        except ProtocolError as err:
            return _error(err)
        return Response(status_code=200 if service.ready else 503)

    async def metrics(request: Any) -> Any:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

    async def infer(request: Any) -> Any:
        started = time.perf_counter()
        name = request.path_params["model"]
        timing = service.timing(request.headers.get("traceparent")) if service.tracer else None
        try:
            endpoint = model_of(request)
            if request.headers.get("content-encoding", "identity") != "identity":
                raise ProtocolError("compressed requests are not accepted here: send them uncompressed")
            body = await _body(request, service.limits.max_request_bytes)
        except ProtocolError as err:
            service.refused(name, PROTOCOL, err, timing)
            return _error(err)

        def answer() -> tuple[bytes, int | None]:
            try:
                asked = decode_request(body, request.headers.get(HEADER_LENGTH), service.limits)
            except ProtocolError as err:
                service.refused(name, PROTOCOL, err, timing)
                raise
            timeout = asked.parameters.get("timeout")  # tritonclient's, in microseconds
            client_s = timeout / 1e6 if isinstance(timeout, int) and not isinstance(timeout, bool) else None
            result = service.infer(
                InferRequest(
                    endpoint,
                    asked.inputs,
                    asked.outputs,
                    asked.parameters,
                    asked.id,
                    service.deadline(client_s),
                    timing,
                ),
                PROTOCOL,
            )
            return encode_response(endpoint.name, endpoint.version, asked, result.outputs)

        try:
            body_out, header_length = await run_in_threadpool(answer)
        except ProtocolError as err:
            return _error(err)
        headers = {} if header_length is None else {HEADER_LENGTH: str(header_length)}
        media = "application/json" if header_length is None else "application/octet-stream"
        service.answered(endpoint.name, started, timing)
        return Response(body_out, headers=headers, media_type=media)

    routes = [
        Route("/v2", server_metadata),
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/metrics", metrics),
    ]
    for v in ("", "/versions/{version}"):
        routes += [
            Route(f"/v2/models/{{model}}{v}", model_metadata),
            Route(f"/v2/models/{{model}}{v}/ready", model_ready),
            Route(f"/v2/models/{{model}}{v}/infer", infer, methods=["POST"]),
        ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=hosts)]
    if token is not None:
        middleware.append(Middleware(BearerToken, token=token))
    return Starlette(routes=routes, middleware=middleware)
