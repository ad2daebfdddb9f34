"""Why an RTSP (or plain HTTP) camera would not open: one request, asked without credentials.

OpenCV's FFmpeg says only that it could not open a stream.  A user needs to know which of
five things went wrong: nothing listens at the address, nothing answers, the camera wants a
user and password (or refused the ones given), the path names no stream, or the camera
answered and still sent no video.  ``diagnose`` asks the camera's RTSP server once, over a
plain TCP connection with a deadline, and turns the answer into a ``SourceError``.  An
``http://`` camera (Motion JPEG) is asked the same way with a GET.

The request carries no credentials (they stay with FFmpeg): a 401 to it, when the URL has a
user and password that FFmpeg could not open the stream with, means the camera refused them.
At most 4 KiB of the answer are read, and only its status line is used.
"""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit, urlunsplit

from edgekit.core.redact import redact_source
from edgekit.errors import SourceError

RTSP_PORT = 554
HTTP_PORT = 80
_ANSWER_MAX = 4096


def _status(host: str, port: int, url: str, timeout_s: float) -> int:
    """The status code of a DESCRIBE (RTSP) or GET (HTTP) for ``url`` (without credentials); raises OSError."""
    http = url.lower().startswith("http://")
    if http:
        parts = urlsplit(url)
        path = parts.path or "/"
        path += f"?{parts.query}" if parts.query else ""
        request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: edgekit\r\nConnection: close\r\n\r\n".encode()
    else:
        request = (
            f"DESCRIBE {url} RTSP/1.0\r\nCSeq: 1\r\nAccept: application/sdp\r\nUser-Agent: edgekit\r\n\r\n"
        ).encode()
    deadline = time.monotonic() + timeout_s
    with socket.create_connection((host, port), timeout=timeout_s) as conn:
        conn.sendall(request)
        answer = b""
        while b"\r\n" not in answer and len(answer) < _ANSWER_MAX:
            conn.settimeout(max(0.05, deadline - time.monotonic()))
            chunk = conn.recv(_ANSWER_MAX - len(answer))
            if not chunk:
                break
            answer += chunk
    words = answer.split(b"\r\n", 1)[0].split()
    protocol = b"HTTP/" if http else b"RTSP/"
    if len(words) < 2 or not words[0].startswith(protocol) or not words[1].isdigit():
        raise ValueError(f"not an {protocol[:-1].decode()} answer")
    return int(words[1])


def diagnose(url: str, timeout_s: float = 5.0) -> SourceError:
    """The error to show for an RTSP or HTTP ``url`` that OpenCV's FFmpeg could not open (asks the camera)."""
    shown = redact_source(url)
    parts = urlsplit(url)
    http = parts.scheme.lower() == "http"
    default_port = HTTP_PORT if http else RTSP_PORT
    host, port = parts.hostname or "", parts.port or default_port
    where = f"{host}:{port}"
    bare = urlunsplit((parts.scheme, where if parts.port else host, parts.path, parts.query, ""))
    try:
        status = _status(host, port, bare, timeout_s)
    except ConnectionRefusedError:
        return SourceError(
            f"cannot open stream {shown!r}: nothing listens at {where} (connection refused)",
            f"check that the camera is on and its {parts.scheme.upper()} port (the default is {default_port})",
        )
    except TimeoutError:
        return SourceError(
            f"cannot open stream {shown!r}: no answer from {where} within {timeout_s:g} s",
            "check the address and that this host can reach the camera (a firewall, another network)",
        )
    except (OSError, ValueError) as err:
        return SourceError(
            f"cannot open stream {shown!r}: {where} did not answer as an {'HTTP' if http else 'RTSP'} server ({err})",
            "check the URL in a player (ffplay URL)",
        )
    if status == 401 and parts.password is not None:
        return SourceError(
            f"the camera at {where} refused the user and password of {shown!r}",
            "check them in the camera's settings; in a URL, write @ : / # in a password as %40 %3A %2F %23",
        )
    if status == 401:
        return SourceError(
            f"the camera at {where} wants a user and password for {shown!r}",
            f"write {parts.scheme}://USER:PASSWORD@host/path, in a run file only you can read (edgekit run --config)",
        )
    if status == 404:
        return SourceError(
            f"the camera at {where} has no stream at {parts.path or '/'!r}",
            "check the stream's path in the camera's manual or settings (e.g. /stream1, /h264)",
        )
    if status >= 400:
        return SourceError(
            f"the camera at {where} answered {status} for {shown!r}",
            "check the URL in a player (ffplay URL)",
        )
    return SourceError(
        f"the camera at {where} answered, but no video came from {shown!r} in time",
        "check the stream in a player (ffplay URL)"
        + ("" if http else "; try the other transport (#transport=udp or tcp)"),
    )
