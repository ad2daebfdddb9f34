"""One bounded queue to one inference worker: ``submit(request) -> future``.

Both protocols hand their decoded requests here.  The queue is bounded: a request that finds
it full is refused at once (``Outcome.BUSY``: HTTP 429, gRPC ``RESOURCE_EXHAUSTED``) rather
than waiting behind work the server cannot finish in time.  Each request carries a deadline;
one that waited past it is answered with ``Outcome.DEADLINE`` and never computed.  The worker
runs requests one at a time, oldest first, on the model's one session (runtimes are not all
safe to call from several threads, and one session already uses the device's cores).

This is the seam for batching: a worker that gathers waiting requests into one batch (as the
pipeline's ``Batcher`` does for cameras) replaces ``_work`` and keeps ``submit``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from edgekit.errors import EdgekitError
from edgekit.serve.endpoints import InferRequest, InferResult
from edgekit.serve.metrics import ServeMetrics
from edgekit.serve.outcomes import Outcome, ProtocolError

log = logging.getLogger(__name__)

Runner = Callable[[InferRequest], InferResult]


class InferenceQueue:
    def __init__(self, run: Runner, size: int, metrics: ServeMetrics | None = None) -> None:
        if size < 1:
            raise ValueError("the queue holds at least one request")
        self._run = run
        self._queue: queue.Queue[tuple[InferRequest, Future[InferResult], float] | None] = queue.Queue(size)
        self._metrics = metrics
        self._closed = threading.Event()
        self._worker = threading.Thread(target=self._work, name="edgekit-serve-infer", daemon=True)
        self._worker.start()

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def submit(self, request: InferRequest) -> Future[InferResult]:
        """Queue ``request``; its future ends in an ``InferResult`` or a ``ProtocolError``.

        Raises ``ProtocolError`` (``BUSY``) at once when the queue is full, (``UNAVAILABLE``)
        when the server is stopping.
        """
        if self._closed.is_set():
            raise ProtocolError("the server is stopping", Outcome.UNAVAILABLE)
        future: Future[InferResult] = Future()
        try:
            self._queue.put_nowait((request, future, time.monotonic()))
        except queue.Full:
            raise ProtocolError(
                f"the server is busy: {self._queue.maxsize} requests are waiting; try again shortly",
                Outcome.BUSY,
            ) from None
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            request, future, queued = item
            if not future.set_running_or_notify_cancel():  # the caller gave up waiting
                continue
            now = time.monotonic()
            if self._metrics is not None:
                self._metrics.stages(request.endpoint.name, {"queue": now - queued})
            if now > request.deadline:
                future.set_exception(
                    ProtocolError(
                        f"request waited {now - queued:.3f} s, past its deadline: not computed",
                        Outcome.DEADLINE,
                    )
                )
                continue
            try:
                result = self._run(request)
            except ProtocolError as err:
                future.set_exception(err)
            except EdgekitError as err:  # the runtime refused an input every check let through
                future.set_exception(ProtocolError(err.message, Outcome.INVALID))
            except Exception as err:  # a runtime's failure is this request's, not the server's
                log.exception("serve: %s failed", request.endpoint.name)
                future.set_exception(ProtocolError(f"inference failed: {err}", Outcome.FAILED))
            else:
                if self._metrics is not None:
                    self._metrics.stages(request.endpoint.name, result.stages)
                future.set_result(result)

    def close(self, timeout_s: float = 5.0) -> None:
        """Refuse new requests, answer the waiting ones ``UNAVAILABLE``, let the running one finish."""
        self._closed.set()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None and item[1].set_running_or_notify_cancel():
                item[1].set_exception(ProtocolError("the server is stopping", Outcome.UNAVAILABLE))
        with contextlib.suppress(queue.Full):  # a submit that raced the close: the worker is a daemon
            self._queue.put(None, timeout=timeout_s)
        self._worker.join(timeout_s)
