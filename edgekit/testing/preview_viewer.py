"""Someone watching the preview: a thread that reads its MJPEG stream part by part, as a browser would.

``PreviewViewer("http://127.0.0.1:PORT/").start()`` opens ``/stream.mjpg`` and reads every
part (its headers, then ``Content-Length`` bytes of JPEG) until ``stop()``; ``frames`` and
``bytes`` count what came.  A stream that ends (the preview restarted) is opened again
after ``retry_s``.  It keeps nothing of a frame, so it holds the same memory all along.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import threading
from urllib.parse import urlsplit

log = logging.getLogger(__name__)


class PreviewViewer:
    """Reads the preview's ``/stream.mjpg`` on a thread of its own; ``frames``, ``bytes``, ``reconnects``."""

    def __init__(self, url: str, timeout_s: float = 10.0, retry_s: float = 0.5) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.frames = 0
        self.bytes = 0
        self.reconnects = 0
        self._halt = threading.Event()
        self._conn: http.client.HTTPConnection | None = None
        self._thread = threading.Thread(target=self._run, name="edgekit-preview-viewer", daemon=True)

    def start(self) -> PreviewViewer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):  # already closed by the server
                conn.sock.shutdown(2)
        self._thread.join(self.timeout_s)

    def _run(self) -> None:
        while not self._halt.is_set():
            try:
                self._watch()
            except (OSError, http.client.HTTPException) as err:
                log.debug("preview viewer: %s", err)
            if self._halt.wait(self.retry_s):
                break
            self.reconnects += 1

    def _watch(self) -> None:
        conn = self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request("GET", "/stream.mjpg", headers={"Host": "127.0.0.1"})
            resp = conn.getresponse()
            if resp.status != 200:
                resp.read()
                return
            while not self._halt.is_set():
                length = None
                while True:  # a part's boundary line and headers, up to the blank line
                    line = resp.fp.readline(1024)
                    if not line:
                        return  # the stream ended
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                    elif line in (b"\r\n", b"\n") and length is not None:
                        break
                remaining = length
                while remaining > 0:
                    chunk = resp.fp.read(min(remaining, 65536))
                    if not chunk:
                        return
                    remaining -= len(chunk)
                self.frames += 1
                self.bytes += length
        finally:
            self._conn = None
            conn.close()
