"""``edgekit serve``'s listeners: the HTTP/REST and gRPC front ends of one ``Service``, started and stopped together.

Safe by default: loopback unless told, and anywhere else only with a token (the rule of every
edgekit listener, ``edgekit.core.listeners``); TLS for both when given a certificate and key.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.core.listeners import allowed_hosts, needs_token
from edgekit.core.tokens import MAKE_ONE
from edgekit.errors import EdgekitError
from edgekit.serve.frames import FrameLane
from edgekit.serve.grpc_service import make_server
from edgekit.serve.http_app import make_app
from edgekit.serve.limits import Limits
from edgekit.serve.runner import Batching
from edgekit.serve.service import Service
from edgekit.serve.timing import Tracer

if TYPE_CHECKING:
    from edgekit.model import Model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    #: None: that protocol is not served; 0: any free port.
    http_port: int | None = 8000
    grpc_port: int | None = 8001
    token: str | None = None
    allowed_hosts: tuple[str, ...] = ()
    tls_cert: Path | None = None
    tls_key: Path | None = None
    limits: Limits = field(default_factory=Limits)
    batching: Batching = field(default_factory=Batching)
    #: Each request's times go here (``edgekit.telemetry.trace_requests``); the server closes it.
    tracer: Tracer | None = None


class Running:
    """The started server: its ports (``http_port``, ``grpc_port``) and ``stop()``."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self._uvicorn: Any = None
        self._http_thread: threading.Thread | None = None
        self._grpc: Any = None

    def frames(self) -> FrameLane:
        """The server's model worker for a ``Pipeline``'s camera frames: ``Pipeline(model, sources=...,
        shared=running.frames())`` batches them with the image requests (``edgekit.serve.frames``)."""
        return self.service.frames()

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop taking requests, finish the running one, close both listeners."""
        self.service.ready = False
        if self._grpc is not None:
            self._grpc.stop(grace_s).wait(grace_s)
        if self._uvicorn is not None and self._http_thread is not None:
            self._uvicorn.should_exit = True
            self._http_thread.join(grace_s)
        self.service.close()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
    # and without it a response's body waits behind its headers for the client's delayed ACK
    # (40 ms on Linux; seen with tritonclient's HTTP client).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
        return sock
    except OSError as err:
        sock.close()
        raise EdgekitError(
            f"cannot listen on {host}:{port} for HTTP: {err.strerror or err}",
            "pick another port with --http-port, or stop what uses it",
        ) from err


def check_access(options: ServeOptions) -> None:
    """Refuse to serve off loopback without a token, or with half a TLS pair."""
    if needs_token(options.host, options.token):
        raise EdgekitError(
            f"--host {options.host} would let anyone who reaches this machine run the model",
            f"give it a token with --token-file PATH or EDGEKIT_SERVE_TOKEN ({MAKE_ONE.replace('fleet', 'serve')}), "
            "or keep the default --host 127.0.0.1",
        )
    if (options.tls_cert is None) != (options.tls_key is None):
        raise EdgekitError("TLS needs both --tls-cert and --tls-key", "give both files, or neither")


def start(model: Model, options: ServeOptions) -> Running:
    """Serve ``model`` as ``options`` say; returns once both listeners accept connections."""
    check_access(options)
    hosts = allowed_hosts(options.host, options.allowed_hosts)
    tls = None
    if options.tls_cert is not None and options.tls_key is not None:
        try:
            tls = (options.tls_key.read_bytes(), options.tls_cert.read_bytes())
        except OSError as err:
            raise EdgekitError(f"cannot read the TLS files: {err}", "check --tls-cert and --tls-key") from err
    service = Service(model, options.limits, options.batching, options.tracer)
    running = Running(service)
    try:
        if options.grpc_port is not None:
            address = f"[{options.host.strip('[]')}]" if ":" in options.host else options.host
            try:
                server, port = make_server(service, f"{address}:{options.grpc_port}", options.token, tls)
            except RuntimeError as err:
                raise EdgekitError(
                    f"cannot listen on {options.host}:{options.grpc_port} for gRPC: {err}",
                    "pick another port with --grpc-port, or stop what uses it",
                ) from err
            server.start()
            running._grpc, running.grpc_port = server, port
        if options.http_port is not None:
            _start_http(running, options, hosts)
    except BaseException:
        running.stop(0.5)
        raise
    return running


def _start_http(running: Running, options: ServeOptions, hosts: list[str]) -> None:
    import uvicorn

    sock = _listen(options.host, options.http_port or 0)
    running.http_port = sock.getsockname()[1]
    tls: dict[str, Any] = {}
    if options.tls_cert is not None and options.tls_key is not None:
        tls = {"ssl_certfile": str(options.tls_cert), "ssl_keyfile": str(options.tls_key)}
    config = uvicorn.Config(
        make_app(running.service, options.token, hosts),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        **tls,
    )
    server = uvicorn.Server(config)  # on a thread: it leaves signals to the main thread (the CLI's)

    def serve() -> None:
        try:
            server.run(sockets=[sock])
        finally:
            with contextlib.suppress(OSError):
                sock.close()

    running._uvicorn = server
    running._http_thread = threading.Thread(target=serve, name="edgekit-serve-http", daemon=True)
    running._http_thread.start()
    waited = time.monotonic() + 30
    while not server.started and running._http_thread.is_alive() and time.monotonic() < waited:
        time.sleep(0.01)
    if not server.started:
        raise EdgekitError(
            f"the HTTP server on {options.host}:{running.http_port} did not start", "see the log above"
        )
