"""The server both protocols answer for: its model names, its queue, its metrics, one ``infer`` path.

The HTTP and gRPC front ends decode a request into an ``InferRequest`` and call ``infer``,
which checks it against its endpoint, queues it, waits for its result within its deadline and
counts it by outcome: the same rules for both, in one place.
"""

from __future__ import annotations

import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from edgekit._version import __version__
from edgekit.serve.endpoints import Endpoint, InferRequest, InferResult, endpoints_of
from edgekit.serve.frames import FrameEndpoint, FrameLane
from edgekit.serve.limits import Limits
from edgekit.serve.metrics import ServeMetrics
from edgekit.serve.outcomes import Outcome, ProtocolError
from edgekit.serve.queue import InferenceQueue
from edgekit.serve.runner import Batching, ModelRunner
from edgekit.serve.timing import Timing, Tracer

if TYPE_CHECKING:
    from edgekit.model import Model

SERVER_NAME = "edgekit"
#: The ``model`` label of requests for a model this server does not have.
UNKNOWN_MODEL = "(unknown)"
#: The protocol extensions answered: the HTTP binary tensor data extension (Triton's name for it).
EXTENSIONS = ("binary_tensor_data",)


class Service:
    def __init__(
        self,
        model: Model,
        limits: Limits | None = None,
        batching: Batching | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.model = model
        #: Where each request's times go when it is done (``--trace``); None: nowhere, at no cost.
        self.tracer = tracer
        self.limits = limits or Limits()
        self.batching = batching or Batching()
        self.endpoints = endpoints_of(model, self.limits)
        self.metrics = ServeMetrics(queue_capacity=self.limits.queue_size)
        self.runner = ModelRunner(model, self.batching.max_batch)
        self.runner.warm()
        self.queue = InferenceQueue(
            self.runner, self.limits.queue_size, self.metrics, self.batching.max_queue_delay_ms / 1e3
        )
        self.metrics.queue_depth = lambda: self.queue.depth
        self.metrics.inferences = lambda: (self.runner.inferences, self.runner.requests)
        self.metrics.sharing = lambda: (self.runner.frames, self.runner.shared)
        self._frames = FrameLane(model, self.queue, FrameEndpoint(model, self.limits))
        self.ready = True

    def frames(self) -> FrameLane:
        """This server's model worker for a ``Pipeline``'s frames (``Pipeline(..., shared=...)``)."""
        return self._frames

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}

    def endpoint(self, name: str, version: str = "") -> Endpoint:
        found = self.endpoints.get(name)
        if found is None:
            raise ProtocolError(
                f"no model {name!r} here: this server has {', '.join(sorted(self.endpoints))}",
                Outcome.NOT_FOUND,
            )
        if version and version != found.version:
            raise ProtocolError(
                f"model {name!r} has version {found.version}, not {version!r}", Outcome.NOT_FOUND
            )
        return found

    def deadline(self, client_s: float | None) -> float:
        """A request's deadline: the client's (its timeout) when sooner than the server's own."""
        wait = self.limits.deadline_s if client_s is None else min(client_s, self.limits.deadline_s)
        return time.monotonic() + max(wait, 0.0)

    def timing(self, traceparent: str | None) -> Timing | None:
        """A request's times from its receipt, when the server traces (its caller's ``traceparent``)."""
        return None if self.tracer is None else Timing(traceparent)

    def infer(self, request: InferRequest, protocol: str) -> InferResult:
        """Check, queue and wait for ``request``; counted in the metrics whatever its outcome."""
        name = request.endpoint.name
        timing = request.timing
        try:
            request.endpoint.check(request)
            # Decoded and preprocessed here, on the thread that received it: pictures are
            # prepared side by side on both cores while the worker infers, and a batch (camera
            # frames in it too) waits for its inference alone, not for each picture's decoding.
            prepared = request.endpoint.ready(request)
            if timing is not None:
                timing.protocol, timing.deadline = protocol, request.deadline
                timing.prepared = dict(prepared.stages)
                timing.submitted = time.perf_counter()
            future = self.queue.submit(request)
            try:
                # The worker answers an expired request itself; the margin covers the running one.
                result = future.result(timeout=max(request.deadline - time.monotonic(), 0.0) + 30.0)
            except FutureTimeout:
                future.cancel()
                raise ProtocolError("no answer within the request's deadline", Outcome.DEADLINE) from None
        except ProtocolError as err:
            self.metrics.request(name, protocol, err.outcome.label)
            self._trace(timing, name, protocol, err.outcome.label)
            raise
        self.metrics.request(name, protocol, Outcome.OK.label)
        if timing is not None:
            timing.worked = result.stages
        return result

    def answered(self, name: str, started: float, timing: Timing | None = None) -> None:
        """An answered request's whole time in the server (``request`` stage), from ``perf_counter`` ``started``."""
        self.metrics.stages(name, {"request": time.perf_counter() - started})
        if timing is not None:
            self._trace(timing, name, timing.protocol, Outcome.OK.label, time.monotonic() <= timing.deadline)

    def refused(self, name: str, protocol: str, err: ProtocolError, timing: Timing | None = None) -> None:
        """Count a request refused before it reached ``infer`` (undecodable, over a cap, no such model)."""
        # A name the client made up is not a label: one series per guess would grow without bound.
        label = name if name in self.endpoints else UNKNOWN_MODEL
        self.metrics.request(label, protocol, err.outcome.label)
        self._trace(timing, label, protocol, err.outcome.label)

    def _trace(
        self, timing: Timing | None, name: str, protocol: str, outcome: str, in_time: bool = True
    ) -> None:
        if timing is None or self.tracer is None:
            return
        self.tracer.request(
            traceparent=timing.traceparent,
            received_at=timing.received_at,
            stages=timing.stages(time.perf_counter()),
            outcome=outcome,
            in_time=in_time,
            model=name,
            protocol=protocol,
            batch=timing.batch,
        )

    def close(self) -> None:
        self.ready = False
        self.queue.close()
        self.runner.close()
        if self.tracer is not None:  # after the queue: the requests it answered on closing are traced
            self.tracer.close()
