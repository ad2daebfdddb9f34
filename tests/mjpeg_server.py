"""A network camera on loopback: Motion JPEG over HTTP (multipart/x-mixed-replace), as IP cameras serve it.

``stop()`` takes the camera away (closes the listening socket and every open stream);
``start()`` brings it back on the same port.
"""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import cv2
import numpy as np

BOUNDARY = "edgekitframe"


class MjpegCamera:
    """Serves ``frames`` (BGR images, cycled) at ``fps`` on ``http://127.0.0.1:PORT/stream.mjpg``."""

    def __init__(self, frames: list[np.ndarray], fps: float = 30.0) -> None:
        self.jpegs = [cv2.imencode(".jpg", f, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes() for f in frames]
        self.fps = fps
        self.port = _free_port()
        self.served = 0
        self._server: ThreadingHTTPServer | None = None
        self._alive = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/stream.mjpg"

    def start(self) -> None:
        camera = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/stream.mjpg":  # a camera ignores ?token=...
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY}")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                i = 0
                try:
                    while camera._alive.is_set():
                        jpg = camera.jpegs[i % len(camera.jpegs)]
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

    def stop(self) -> None:
        """The camera goes away: streams end, new connections are refused."""
        self._alive.clear()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
