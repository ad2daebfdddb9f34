"""Real RTSP cameras for the tests: gst-rtsp-server on loopback, in its own process.

``RtspCamera`` starts ``tests/rtsp_serve.py`` under the system Python (which has Debian's
PyGObject and gst-rtsp-server; the venv has neither), on a free loopback port that it keeps
across ``stop()``/``start()``, so a source reopening the same URL finds the camera again:

    with RtspCamera(codec="h264") as cam:
        source = open_source(cam.url)
        cam.pause()    # connection open, no frames
        cam.stop()     # the server killed: connections cut, then refused
        cam.start()    # back on the same port
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import quote

SYSTEM_PYTHON = "/usr/bin/python3"
SERVE = Path(__file__).with_name("rtsp_serve.py")


def rtsp_server_missing() -> str | None:
    """Why no RTSP camera can be served here, or ``None`` when one can."""
    if not Path(SYSTEM_PYTHON).exists():
        return f"{SYSTEM_PYTHON} is missing"
    probe = (
        "import gi; gi.require_version('GstRtspServer', '1.0'); from gi.repository import GstRtspServer, Gst; "
        "Gst.init(None); "
        "missing = [e for e in ('x264enc', 'x265enc', 'videotestsrc') if Gst.ElementFactory.find(e) is None]; "
        "print(' '.join(missing))"
    )
    run = subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        return "gst-rtsp-server or PyGObject is missing (tools/setup.sh installs them as root)"
    if run.stdout.strip():
        return f"GStreamer elements missing: {run.stdout.strip()}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RtspCamera:
    """An RTSP camera serving a live test pattern at ``url`` (``rtsp://127.0.0.1:PORT/cam``)."""

    def __init__(
        self,
        codec: str = "h264",
        width: int = 640,
        height: int = 480,
        fps: int = 30,
        user: str | None = None,
        password: str | None = None,
        drop: float = 0.0,
        port: int | None = None,
    ) -> None:
        self.codec, self.fps, self.user, self.password, self.drop = codec, fps, user, password, drop
        self.size = (width, height)
        self.port = port or free_port()
        self._proc: subprocess.Popen[str] | None = None
        self._lines: list[str] = []
        self._cond = threading.Condition()

    @property
    def url(self) -> str:
        """The camera's URL, with its credentials when it has them."""
        if self.user is None:
            return f"rtsp://127.0.0.1:{self.port}/cam"
        return self.url_as(self.user, self.password or "")

    def url_as(self, user: str, password: str) -> str:
        return f"rtsp://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{self.port}/cam"

    def start(self, timeout: float = 30.0) -> RtspCamera:
        """Start serving (again, on the same port); returns once the server listens."""
        assert self._proc is None, "already serving"
        w, h = self.size
        argv = [SYSTEM_PYTHON, str(SERVE), "--port", str(self.port), "--codec", self.codec]
        argv += ["--size", f"{w}x{h}", "--fps", str(self.fps), "--drop", str(self.drop)]
        if self.user is not None:
            argv += ["--user", self.user, "--password", self.password or ""]
        # The system Python must not see the venv's packages (PYTHONPATH points at the tests' tree).
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        self._lines = []
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
        )
        threading.Thread(target=self._read_stdout, args=(self._proc,), daemon=True).start()
        self._wait_for(lambda line: line.startswith(("ready", "error")), timeout)
        if not any(line.startswith("ready") for line in self._lines):
            self.stop()
            raise RuntimeError(f"the RTSP server did not start: {self._lines}")
        return self

    def _read_stdout(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._cond:
                self._lines.append(line.strip())
                self._cond.notify_all()
        with self._cond:
            self._lines.append("exited")
            self._cond.notify_all()

    def _wait_for(self, match: object, timeout: float) -> str:
        check = match if callable(match) else (lambda line: line == match)
        with self._cond:
            seen = 0

            def found() -> str | None:
                nonlocal seen
                for line in self._lines[seen:]:
                    if check(line) or line == "exited":
                        return line
                seen = len(self._lines)
                return None

            self._cond.wait_for(lambda: found() is not None, timeout)
            line = found()
        if line is None:
            raise TimeoutError(f"the RTSP server did not answer in {timeout} s: {self._lines}")
        return line

    def _command(self, text: str, timeout: float = 10.0) -> None:
        assert self._proc is not None and self._proc.stdin is not None, "not serving"
        word = text.split()[0]
        with self._cond:
            self._lines.clear()
        self._proc.stdin.write(text + "\n")
        self._proc.stdin.flush()
        answer = self._wait_for(lambda line: line in (f"ok {word}",) or line.startswith("error"), timeout)
        if answer != f"ok {word}":
            raise RuntimeError(f"RTSP server: {text!r} -> {answer}")

    def pause(self) -> None:
        """Stop sending frames, keeping every connection and session open."""
        self._command("pause")

    def resume(self) -> None:
        self._command("resume")

    def resize(self, width: int, height: int) -> None:
        """Frames from now on are ``width``x``height``."""
        self.size = (width, height)
        self._command(f"size {width}x{height}")

    def set_rate(self, fps: int) -> None:
        """Frames from now on come at ``fps``."""
        self.fps = fps
        self._command(f"rate {fps}")

    def set_drop(self, fraction: float) -> None:
        """Drop this fraction of the encoded frames (a damaged stream)."""
        self.drop = fraction
        self._command(f"drop {fraction}")

    def stop(self) -> None:
        """Kill the server: every connection is cut and new ones are refused."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.kill()
        proc.wait(10)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    @property
    def serving(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> RtspCamera:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":  # a camera to point a player at: python tests/rtsp_server.py [h264|h265]
    with RtspCamera(codec=sys.argv[1] if len(sys.argv) > 1 else "h264") as cam:
        print(cam.url, flush=True)
        threading.Event().wait()
