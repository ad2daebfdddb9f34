"""Requests to the model through one bounded batch queue and one inference worker: ``submit(request) -> future``.

Both protocols hand their decoded requests here.  The queue is the pipeline's ``BatchQueue``:
bounded (a request that finds it full is refused at once, ``Outcome.BUSY``: HTTP 429, gRPC
``RESOURCE_EXHAUSTED``, rather than waiting behind work the server cannot finish in time),
earliest deadline first, and a request that waited past its deadline is answered
``Outcome.DEADLINE`` and never computed.  The worker runs what ``take`` gives it on the model's
one session: requests the runner says can share an inference (``Runner.key``) go as one batch,
up to the runner's largest batch; the others one at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from typing import Protocol

from edgekit.errors import EdgekitError
from edgekit.pipeline.batch_queue import BatchQueue, Job, QueueClosed, QueueFull
from edgekit.serve.endpoints import FRAMES, InferRequest, InferResult
from edgekit.serve.metrics import ServeMetrics
from edgekit.serve.outcomes import Outcome, ProtocolError

log = logging.getLogger(__name__)

_Item = tuple[InferRequest, "Future[InferResult]"]


#: How long camera frames keep capping the batches after the last one came (seconds).
FRAMES_HOLD_S = 2.0


class Runner(Protocol):
    #: The most rows one inference takes (1: no batching).
    max_batch: int

    def rows_within(self, budget_s: float) -> int:
        """The most rows one inference may hold while frames with ``budget_s`` share the model."""

    def key(self, request: InferRequest) -> Hashable | None:
        """Requests with equal keys may share one inference; None: this one runs alone."""

    def run(self, requests: Sequence[InferRequest]) -> list[InferResult | Exception]:
        """Each request's result, or the error that is its alone; raises for the whole batch."""


class InferenceQueue:
    def __init__(
        self,
        runner: Runner,
        size: int,
        metrics: ServeMetrics | None = None,
        max_delay_s: float = 0.0,
        frame_room: int | None = None,
    ) -> None:
        self._runner = runner
        lanes: dict[Hashable, int] = {FRAMES: frame_room or size}
        self._queue: BatchQueue[_Item] = BatchQueue(size, runner.max_batch, max_delay_s, lanes)
        self._metrics = metrics
        #: The tightest frame budget of the cameras sharing the model, and until when it holds.
        self._frame_budget_s = float("inf")
        self._frames_until = 0.0
        self._worker = threading.Thread(target=self._work, name="edgekit-serve-infer", daemon=True)
        self._worker.start()

    @property
    def depth(self) -> int:
        return self._queue.depth

    def submit(self, request: InferRequest) -> Future[InferResult]:
        """Queue ``request``; its future ends in an ``InferResult`` or a ``ProtocolError``.

        Raises ``ProtocolError`` (``BUSY``) at once when the queue is full, (``UNAVAILABLE``)
        when the server is stopping.
        """
        future: Future[InferResult] = Future()
        try:
            self._queue.put(self._job(request, future))
        except QueueFull:
            raise ProtocolError(
                f"the server is busy: {self._queue.size} requests are waiting; try again shortly",
                Outcome.BUSY,
            ) from None
        except QueueClosed:
            raise ProtocolError("the server is stopping", Outcome.UNAVAILABLE) from None
        return future

    def submit_all(self, requests: Sequence[InferRequest]) -> list[Future[InferResult] | None]:
        """Queue ``requests`` at once (the worker sees them together); None for each that did not fit.

        Raises ``ProtocolError`` (``UNAVAILABLE``) when the server is stopping.
        """
        jobs = [self._job(r, Future()) for r in requests]
        try:
            refused = {id(j) for j in self._queue.put_all(jobs)}
        except QueueClosed:
            raise ProtocolError("the server is stopping", Outcome.UNAVAILABLE) from None
        return [None if id(j) in refused else j.payload[1] for j in jobs]

    def frames_come(self, budget_s: float) -> None:
        """Camera frames with ``budget_s`` share the model: batches stay small enough for them."""
        now = time.monotonic()
        if now >= self._frames_until or budget_s < self._frame_budget_s:
            self._frame_budget_s = budget_s
        self._frames_until = now + FRAMES_HOLD_S

    def _rows(self) -> int:
        if time.monotonic() < self._frames_until:
            return self._runner.rows_within(self._frame_budget_s)
        return self._runner.max_batch

    def _job(self, request: InferRequest, future: Future[InferResult]) -> Job[_Item]:
        endpoint = request.endpoint
        return Job(
            (request, future),
            request.deadline,
            self._runner.key(request),
            expires=endpoint.expires,
            lane=endpoint.lane,
        )

    def _work(self) -> None:
        while True:
            # A batch of requests that a frame arriving now must wait for is its batch too:
            # while cameras share the model, no batch outgrows what their budget allows.
            self._queue.max_rows = self._rows()
            taken = self._queue.take()
            if taken is None:
                return
            now = time.monotonic()
            for job in taken.expired:
                request, future = job.payload
                if future.set_running_or_notify_cancel():
                    self._stage(request, now - job.queued, 0)
                    future.set_exception(
                        ProtocolError(
                            f"request waited {now - job.queued:.3f} s, past its deadline: not computed",
                            Outcome.DEADLINE,
                        )
                    )
            # A caller that gave up waiting cancelled its future: its request is not computed.
            jobs = [j for j in taken.batch if j.payload[1].set_running_or_notify_cancel()]
            if jobs:
                for job in jobs:
                    self._stage(job.payload[0], now - job.queued, len(jobs))
                self._run(jobs)

    def _stage(self, request: InferRequest, queued_s: float, batch: int) -> None:
        if request.timing is not None:  # read by the request's thread once its future is done
            request.timing.queued_s, request.timing.batch = queued_s, batch
        if self._metrics is not None and request.endpoint.served:
            self._metrics.stages(request.endpoint.name, {"queue": queued_s})

    def _run(self, jobs: list[Job[_Item]]) -> None:
        requests = [j.payload[0] for j in jobs]
        try:
            results = self._runner.run(requests)
        except Exception as err:  # noqa: BLE001 (the batch's failure is its requests', not the server's)
            results = [err] * len(jobs)
        for (request, future), result in zip((j.payload for j in jobs), results, strict=True):
            if isinstance(result, InferResult):
                if self._metrics is not None and request.endpoint.served:
                    self._metrics.stages(request.endpoint.name, result.stages)
                future.set_result(result)
            else:
                future.set_exception(_as_protocol_error(request, result))

    def close(self, timeout_s: float = 5.0) -> None:
        """Refuse new requests, answer the waiting ones ``UNAVAILABLE``, let the running one finish."""
        for job in self._queue.close():
            future = job.payload[1]
            if future.set_running_or_notify_cancel():
                future.set_exception(ProtocolError("the server is stopping", Outcome.UNAVAILABLE))
        self._worker.join(timeout_s)


def _as_protocol_error(request: InferRequest, err: Exception) -> ProtocolError:
    if isinstance(err, ProtocolError):
        return err
    if isinstance(err, EdgekitError):  # the runtime refused an input every check let through
        return ProtocolError(err.message, Outcome.INVALID)
    log.error("serve: %s failed", request.endpoint.name, exc_info=err)
    return ProtocolError(f"inference failed: {err}", Outcome.FAILED)
