"""One frame path: every consumer of the pipeline's frames is a ``Sink``, registered with ``add_sink``.

The records file, telemetry's window and labels, the preview, the soak recorder, the run's
"what the model saw", the kept-choice watch: each is told each finished frame once, as one
``FrameResult`` whose record is final (stages, sink time, met), built once by the loop.

Why one protocol instead of a list per kind of hook (records, labels, results, closers):
the rules a consumer needs are the same for all of them, so they live here once.

- *Inline* sinks (``depth == 0``) run on the loop thread: a counter, a sketch, a reference
  swap.  Their time shows in the next frame's latency, so they must stay cheap.
- *Queued* sinks (``depth > 0``) get their own thread behind a bounded queue of ``depth``
  frames: a file, a network write.  One that falls behind loses frames, counted per sink
  (``dropped[name]``); the loop never waits for it.
- A sink that raises is counted (``errors[name]``) and logged at most once a minute; the
  loop goes on.  This is the callback contract MQTT clients such as paho document (an
  exception in a callback is caught and logged, the network loop keeps running), and, like
  a pipeline watchdog's per-stage status, each sink's drops and errors are its own to read.
- ``close()`` drains each queued sink (bounded), then closes every sink once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from edgekit.pipeline.records import FrameResult

log = logging.getLogger(__name__)

#: Seconds between two log lines about the same failing sink.
LOG_EVERY_S = 60.0
#: Seconds ``close`` waits for a queued sink to empty its queue.
DRAIN_S = 10.0


@runtime_checkable
class Sink(Protocol):
    """A consumer of finished frames.  ``depth`` 0: inline on the loop thread; N: its own thread, N queued."""

    name: str
    depth: int

    def frame(self, result: FrameResult) -> None:
        """Told each finished frame once (on the loop thread when inline)."""

    def close(self) -> None:
        """The pipeline is done with it: flush, stop, release."""


class FunctionSink:
    """A sink made of a function (and, optionally, what closes it)."""

    def __init__(
        self,
        name: str,
        fn: Callable[[FrameResult], None],
        *,
        depth: int = 0,
        close: Callable[[], None] | None = None,
    ) -> None:
        if depth < 0:
            raise ValueError(f"a sink's depth is 0 (inline) or more, got {depth}")
        self.name = name
        self.depth = depth
        self._fn = fn
        self._close = close

    def frame(self, result: FrameResult) -> None:
        self._fn(result)

    def close(self) -> None:
        if self._close is not None:
            self._close()


def sink(
    name: str, fn: Callable[[FrameResult], None], *, depth: int = 0, close: Callable[[], None] | None = None
) -> FunctionSink:
    """``add_sink(sink("records", rows.append))``: a function as a sink (inline unless ``depth``)."""
    return FunctionSink(name, fn, depth=depth, close=close)


class _Queued:
    """A queued sink's queue and thread: the loop only ever puts without waiting."""

    def __init__(self, sink: Sink, sinks: Sinks) -> None:
        self.sink = sink
        self._sinks = sinks
        self._queue: queue.Queue[FrameResult] = queue.Queue(maxsize=sink.depth)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"edgekit-sink-{sink.name}", daemon=True)
        self._thread.start()

    def offer(self, result: FrameResult) -> None:
        try:
            self._queue.put_nowait(result)
        except queue.Full:
            self._sinks.count_drop(self.sink.name)

    def _run(self) -> None:
        while True:
            try:
                result = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._done.is_set():
                    return
                continue
            self._sinks.call(self.sink, result)

    def stop(self, timeout_s: float) -> None:
        self._done.set()  # the thread empties the queue, then ends
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("sink %s did not finish its queue within %.0f s", self.sink.name, timeout_s)


class Sinks:
    """The pipeline's sinks, in the order added, with each one's drops and errors."""

    def __init__(self) -> None:
        self._inline: list[Sink] = []
        self._queued: list[_Queued] = []
        self._lock = threading.Lock()
        self._logged: dict[str, float] = {}
        #: Frames a queued sink lost because its queue was full, by sink name.
        self.dropped: dict[str, int] = {}
        #: Frames a sink raised on, by sink name.
        self.errors: dict[str, int] = {}
        self._closed = False

    def add(self, sink: Sink) -> None:
        if self._closed:
            raise RuntimeError("the pipeline's sinks are closed")
        if sink.depth > 0:
            self._queued.append(_Queued(sink, self))
        else:
            self._inline.append(sink)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self._inline] + [q.sink.name for q in self._queued]

    def tell(self, result: FrameResult) -> None:
        """Each sink, the finished frame: inline ones now, queued ones a put (or a counted drop)."""
        for s in self._inline:
            self.call(s, result)
        for q in self._queued:
            q.offer(result)

    def call(self, sink: Sink, result: FrameResult) -> None:
        try:
            sink.frame(result)
        except Exception:  # noqa: BLE001 - a sink must never kill the loop (counted, logged)
            self._failed(sink.name, "frame")

    def count_drop(self, name: str) -> None:
        with self._lock:
            self.dropped[name] = self.dropped.get(name, 0) + 1

    def _failed(self, name: str, what: str) -> None:
        now = time.monotonic()
        with self._lock:
            self.errors[name] = self.errors.get(name, 0) + 1
            count = self.errors[name]
            last = self._logged.get(name)
            if last is not None and now - last < LOG_EVERY_S:
                return
            self._logged[name] = now
        log.exception(
            "sink %s raised on %s (%d errors so far; logged at most once a minute)", name, what, count
        )

    def close(self) -> None:
        """Drain the queued sinks, then close every sink once (one that raises does not stop the rest)."""
        if self._closed:
            return
        self._closed = True
        for q in self._queued:
            q.stop(DRAIN_S)
        for s in [*self._inline, *(q.sink for q in self._queued)]:
            try:
                s.close()
            except Exception:  # noqa: BLE001 - one sink must not keep the rest open
                self._failed(s.name, "close")
