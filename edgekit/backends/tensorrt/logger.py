"""TensorRT's logger: one per process, forwarding to Python logging and keeping recent errors.

TensorRT reports most failures only through its logger, so the errors it logs are kept
(:data:`_CAPTURE`) for :func:`_why` to put into the exceptions raised.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)


class _Capture:
    """Forwards TensorRT's log to Python logging and keeps recent errors to put in our messages.

    TensorRT reports most failures (a plan from another version, an unsupported layer) only
    through its logger, returning None; the errors are kept so the exception can say why.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: list[tuple[int, str]] = []
        self._seq = 0

    def add(self, message: str) -> None:
        with self._lock:
            self._seq += 1
            self._errors = [*self._errors[-19:], (self._seq, message)]

    def mark(self) -> int:
        with self._lock:
            return self._seq

    def since(self, mark: int) -> list[str]:
        with self._lock:
            return [m for seq, m in self._errors if seq > mark]


_CAPTURE = _Capture()
_TRT_LOGGER: Any = None
_TRT_LOGGER_LOCK = threading.Lock()


def _trt_logger(trt: Any) -> Any:
    # TensorRT treats the logger as a process-wide singleton: every Builder and Runtime must get the same one.
    global _TRT_LOGGER
    with _TRT_LOGGER_LOCK:
        if _TRT_LOGGER is None:
            # trt.ILogger is the documented base for Python loggers from 8.x on; TensorRT 7/8.0
            # only expose trt.Logger, whose log() subclasses override.
            base = getattr(trt, "ILogger", None) or trt.Logger
            severity = base.Severity

            class _Logger(base):  # type: ignore[misc,valid-type]
                def __init__(self) -> None:
                    base.__init__(self)

                def log(self, level: Any, msg: str) -> None:
                    if level in (severity.INTERNAL_ERROR, severity.ERROR):
                        _CAPTURE.add(msg)
                        log.error("TensorRT: %s", msg)
                    elif level == severity.WARNING:
                        log.warning("TensorRT: %s", msg)
                    else:
                        log.debug("TensorRT: %s", msg)

            _TRT_LOGGER = _Logger()
        return _TRT_LOGGER


def _why(mark: int, fallback: str) -> str:
    errors = _CAPTURE.since(mark)
    return "; ".join(errors[-3:]) if errors else fallback
