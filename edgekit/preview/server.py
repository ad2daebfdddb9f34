"""The preview's HTTP server: the page, the MJPEG stream and the newest frame's detections as JSON.

``/`` is a small page (``page.html``), ``/stream.mjpg`` the frames with their boxes drawn
(``multipart/x-mixed-replace``, each part headed ``X-Frame-Index``), ``/detections`` the
newest frame's index, size, detections and labels.  It is bounded: at most
``max_connections`` open connections (more are closed at once) and ``PreviewFeed.max_viewers``
streams (more are answered 503).  On loopback it answers only loopback host names, so a web
page elsewhere cannot read the camera through a DNS name rebound to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

from edgekit.preview.address import PreviewError, is_loopback
from edgekit.preview.feed import Jpeg, PreviewFeed

log = logging.getLogger(__name__)

PAGE = Path(__file__).with_name("page.html")
BOUNDARY = "edgekitpreview"
# A viewer whose socket takes no bytes for this long is dropped (its slot freed).
WRITE_TIMEOUT_S = 10.0
# A small send buffer: a slow viewer is sent fresh frames, not a backlog the kernel queued.
STREAM_SNDBUF = 256 * 1024
# With no new frame for this long, the last one is sent again (see ``_stream``).
REPEAT_S = 0.5
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def frame_json(feed: PreviewFeed, model: str, task: str) -> dict[str, Any]:
    """What ``/detections`` answers: the newest frame's index, size, detections and labels."""
    latest = feed.latest
    base: dict[str, Any] = {"model": model, "task": task}
    if latest is None:
        return {**base, "index": None, "width": None, "height": None, "detections": [], "labels": []}
    h, w = latest.frame.shape[:2]
    return {
        **base,
        "index": latest.record.index,
        "width": w,
        "height": h,
        "detections": [d.to_dict() for d in latest.detections],
        "labels": [{"id": lb.id, "name": lb.name, "score": round(lb.score, 5)} for lb in latest.labels],
    }


class _Server(HTTPServer):
    """One thread per connection, at most ``max_connections`` of them; all of them ended by ``stop``."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], preview: PreviewServer, max_connections: int) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.preview = preview
        self._slots = threading.BoundedSemaphore(max_connections)
        self._open: dict[socket.socket, threading.Thread] = {}
        self._lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # full: refused at once rather than queued
            return
        thread = threading.Thread(
            target=self._serve_one, args=(request, client_address), name="edgekit-preview-http", daemon=True
        )
        with self._lock:
            self._open[request] = thread
        thread.start()

    def _serve_one(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # a viewer that went away mid-frame
            log.debug("preview: connection from %s ended", client_address, exc_info=True)
        finally:
            with self._lock:
                self._open.pop(request, None)
            self.shutdown_request(request)
            self._slots.release()

    def end_connections(self, timeout_s: float = 5.0) -> None:
        """Cut every open connection (a stalled viewer's write returns) and wait for its thread."""
        with self._lock:
            open_now = dict(self._open)
        for sock in open_now:
            with contextlib.suppress(OSError):  # already gone
                sock.shutdown(socket.SHUT_RDWR)
        for thread in open_now.values():
            thread.join(timeout_s)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = WRITE_TIMEOUT_S
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("preview %s: " + format, self.address_string(), *args)

    def _host_allowed(self) -> bool:
        preview = self.server.preview
        if not preview.loopback_only:
            return True
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]").lower()
        return host in LOOPBACK_NAMES

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        preview = self.server.preview
        path = self.path.split("?", 1)[0]
        if not self._host_allowed():
            self._send(HTTPStatus.FORBIDDEN, b"this preview answers only on localhost\n", "text/plain")
        elif path in ("/", "/index.html"):
            self._send(HTTPStatus.OK, preview.page, "text/html; charset=utf-8")
        elif path == "/detections":
            body = json.dumps(frame_json(preview.feed, preview.model, preview.task)).encode()
            self._send(HTTPStatus.OK, body, "application/json")
        elif path == "/stream.mjpg":
            self._stream()
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found: try / or /stream.mjpg\n", "text/plain")

    def _stream(self) -> None:
        feed = self.server.preview.feed
        viewer = feed.subscribe()
        if viewer is None:
            self._send(
                HTTPStatus.SERVICE_UNAVAILABLE, b"too many viewers: close another preview\n", "text/plain"
            )
            return
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SNDBUF)
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY}")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            # Each part is followed by its closing boundary, not preceded by it, so a client
            # that parses strictly has the whole part as soon as it is sent.
            self.wfile.write(f"--{BOUNDARY}\r\n".encode())
            sent: Jpeg | None = None
            while not viewer.closed:
                jpeg = viewer.get(timeout=REPEAT_S)
                if jpeg is None:
                    if self._peer_left():  # no frame to write would tell: free the slot now
                        break
                    if sent is None:
                        continue
                    # A paused source (a file at its end, a stalled camera): browsers show a part
                    # only once the next one starts, so the last frame goes again.
                    jpeg = sent
                head = (
                    f"Content-Type: image/jpeg\r\nContent-Length: {len(jpeg.data)}\r\n"
                    f"X-Frame-Index: {jpeg.index}\r\n\r\n"
                ).encode()
                self.wfile.write(head + jpeg.data + f"\r\n--{BOUNDARY}\r\n".encode())
                sent = jpeg
        except OSError:
            pass  # the viewer left (or was too slow for WRITE_TIMEOUT_S)
        finally:
            feed.unsubscribe(viewer)

    def _peer_left(self) -> bool:
        """Whether the viewer closed its end (readable with nothing to read: EOF)."""
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return bool(self.connection.recv(1, socket.MSG_PEEK) == b"")
        except OSError:
            return True


class PreviewServer:
    """A running preview: ``url`` to open, ``offer(result)`` per frame, ``close()`` to stop it."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        model: str = "",
        task: str = "classification",
        feed: PreviewFeed | None = None,
        max_connections: int = 16,
    ) -> None:
        self.feed = feed or PreviewFeed()
        self.model = model
        self.task = task
        self.loopback_only = is_loopback(host)
        self.page = PAGE.read_bytes()
        try:
            self._http = _Server((host, port), self, max_connections)
        except OSError as err:
            raise PreviewError(
                f"the preview cannot listen on {host}:{port}: {err.strerror or err}",
                "pick another port (--preview :0 takes a free one) or stop what holds it",
            ) from None
        self.host = host
        self.port = int(self._http.server_address[1])
        self._thread = threading.Thread(
            target=self._http.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="edgekit-preview",
            daemon=True,
        )
        self._closed = False

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        if host in ("0.0.0.0", "[::]"):
            host = socket.gethostname()  # every interface: this name reaches one of them
        return f"http://{host}:{self.port}/"

    def start(self) -> PreviewServer:
        self.feed.start()
        self._thread.start()
        if not self.loopback_only:
            log.warning("the preview at %s has no login: anyone who can reach it sees the camera", self.url)
        return self

    def offer(self, result: Any) -> None:
        """Hand the newest frame result to the preview (the frame loop's sink: constant time)."""
        self.feed.offer(result)

    def close(self) -> None:
        """Stop listening, end every stream and connection, and wait for the server's threads."""
        if self._closed:
            return
        self._closed = True
        self.feed.close()
        if self._thread.is_alive():
            self._http.shutdown()
        self._http.server_close()
        self._http.end_connections()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def __enter__(self) -> PreviewServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
