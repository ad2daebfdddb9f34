"""An OTLP trace receiver on loopback, for the tests: OTLP/HTTP (``POST /v1/traces``) and OTLP/gRPC.

No OpenTelemetry Collector or Jaeger installs from the registries this project reaches (Debian
packages only the Go SDK's sources; PyPI's wrappers download the binary at run time, or relay to
another OTLP endpoint), so this receiver decodes what arrives with the official protobuf
definitions (``opentelemetry-proto``'s generated classes), as a collector's OTLP receiver does,
and answers as the specification says (200 with an ``ExportTraceServiceResponse``; gRPC ``Export``).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass(frozen=True)
class Span:
    """One received span, decoded, with its resource's attributes."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status: int = 0  # STATUS_CODE_UNSET; 2: ERROR

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


class Receiver:
    """Collects the spans of every ``ExportTraceServiceRequest`` it is sent, by either protocol."""

    def __init__(self) -> None:
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        self.requests = 0

    def take(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        got = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        Span(
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            name=s.name,
                            kind=s.kind,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            resource=resource,
                            status=s.status.code,
                        )
                    )
        with self._lock:
            self._spans.extend(got)
            self.requests += 1

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def traces(self) -> dict[str, list[Span]]:
        out: dict[str, list[Span]] = {}
        for s in self.spans():
            out.setdefault(s.trace_id, []).append(s)
        return out

    def wait_for(self, done: Callable[[], bool], timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():
                return True
            time.sleep(0.05)
        return done()


class HttpReceiver(Receiver):
    """OTLP/HTTP with protobuf bodies; ``endpoint`` is what ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes."""

    protocol = "http/protobuf"

    def __init__(self) -> None:
        super().__init__()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_error(404 if self.path != "/v1/traces" else 415)
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.take(request)
                out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class GrpcReceiver(Receiver):
    """OTLP/gRPC: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``, plaintext on loopback."""

    protocol = "grpc"

    def __init__(self) -> None:
        super().__init__()
        receiver = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                receiver.take(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.endpoint = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        self._server.stop(grace=None)
