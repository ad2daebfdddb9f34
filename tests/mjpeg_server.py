"""A network camera on loopback: Motion JPEG over HTTP (multipart/x-mixed-replace), as IP cameras serve it.

``stop()`` takes the camera away (closes the listening socket and every open stream);
``start()`` brings it back on the same port.  ``pause()`` keeps every connection open but sends
no part until ``resume()``; ``resize()`` serves the next parts at another size; a camera made
with ``user``/``password`` asks for HTTP basic auth and answers 401 to anything else.
"""

from __future__ import annotations

import base64
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import cv2
import numpy as np

BOUNDARY = "edgekitframe"


class MjpegCamera:
    """Serves ``frames`` (BGR images, cycled) at ``fps`` on ``http://127.0.0.1:PORT/stream.mjpg``."""

    def __init__(
        self,
        frames: list[np.ndarray],
        fps: float = 30.0,
        *,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        self.frames = frames
        self.jpegs = _encode(frames)
        self.fps = fps
        self.user, self.password = user, password
        self.port = _free_port()
        self.served = 0
        self.refused = 0  # requests answered 401
        self._server: ThreadingHTTPServer | None = None
        self._alive = threading.Event()
        self._sending = threading.Event()  # cleared while paused
        self._sending.set()

    @property
    def url(self) -> str:
        """The camera's URL, with its credentials when it has them."""
        if self.user is None:
            return f"http://127.0.0.1:{self.port}/stream.mjpg"
        return self.url_as(self.user, self.password or "")

    def url_as(self, user: str, password: str) -> str:
        return f"http://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{self.port}/stream.mjpg"

    def _authorized(self, header: str | None) -> bool:
        if self.user is None:
            return True
        want = base64.b64encode(f"{self.user}:{self.password or ''}".encode()).decode()
        return header == f"Basic {want}"

    def start(self) -> MjpegCamera:
        camera = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/stream.mjpg":  # a camera ignores ?token=...
                    self.send_error(404)
                    return
                if not camera._authorized(self.headers.get("Authorization")):
                    camera.refused += 1
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="camera"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY}")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                i = 0
                try:
                    while camera._alive.is_set():
                        if not camera._sending.wait(0.05):
                            continue  # paused: the connection stays open, nothing is sent
                        jpegs = camera.jpegs
                        jpg = jpegs[i % len(jpegs)]
                        self.wfile.write(
                            f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpg)}\r\n\r\n".encode()
                            + jpg
                            + b"\r\n"
                        )
                        camera.served += 1
                        i += 1
                        time.sleep(1 / camera.fps)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        ThreadingHTTPServer.allow_reuse_address = True
        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self._alive.set()
        threading.Thread(target=server.serve_forever, daemon=True, name="mjpeg-camera").start()
        self._server = server
        return self

    def stop(self) -> None:
        """The camera goes away: streams end, new connections are refused."""
        self._alive.clear()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def pause(self) -> None:
        """Send no part, keeping every connection open."""
        self._sending.clear()

    def resume(self) -> None:
        self._sending.set()

    def resize(self, width: int, height: int) -> None:
        """Parts from now on are ``width``x``height``."""
        self.jpegs = _encode([cv2.resize(f, (width, height)) for f in self.frames])

    def __enter__(self) -> MjpegCamera:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _encode(frames: list[np.ndarray]) -> list[bytes]:
    return [cv2.imencode(".jpg", f, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes() for f in frames]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
