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
from edgekit.serve.limits import Limits
from edgekit.serve.metrics import ServeMetrics
from edgekit.serve.outcomes import Outcome, ProtocolError
from edgekit.serve.queue import InferenceQueue
from edgekit.serve.runner import Batching, ModelRunner

if TYPE_CHECKING:
    from edgekit.model import Model

SERVER_NAME = "edgekit"
#: The ``model`` label of requests for a model this server does not have.
UNKNOWN_MODEL = "(unknown)"
#: The protocol extensions answered: the HTTP binary tensor data extension (Triton's name for it).
EXTENSIONS = ("binary_tensor_data",)


class Service:
    def __init__(self, model: Model, limits: Limits | None = None, batching: Batching | None = None) -> None:
        self.model = model
        self.limits = limits or Limits()
        self.batching = batching or Batching()
        self.endpoints = endpoints_of(model, self.limits)
        self.metrics = ServeMetrics(queue_capacity=self.limits.queue_size)
        self.runner = ModelRunner(model, self.batching.max_batch)
        self.queue = InferenceQueue(
            self.runner, self.limits.queue_size, self.metrics, self.batching.max_queue_delay_ms / 1e3
        )
        self.metrics.queue_depth = lambda: self.queue.depth
        self.metrics.inferences = lambda: (self.runner.inferences, self.runner.requests)
        self.ready = True

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

    def infer(self, request: InferRequest, protocol: str) -> InferResult:
        """Check, queue and wait for ``request``; counted in the metrics whatever its outcome."""
        name = request.endpoint.name
        try:
            request.endpoint.check(request)
            future = self.queue.submit(request)
            try:
                # The worker answers an expired request itself; the margin covers the running one.
                result = future.result(timeout=max(request.deadline - time.monotonic(), 0.0) + 30.0)
            except FutureTimeout:
                future.cancel()
                raise ProtocolError("no answer within the request's deadline", Outcome.DEADLINE) from None
        except ProtocolError as err:
            self.metrics.request(name, protocol, err.outcome.label)
            raise
        self.metrics.request(name, protocol, Outcome.OK.label)
        return result

    def answered(self, name: str, started: float) -> None:
        """An answered request's whole time in the server (``request`` stage), from ``perf_counter`` ``started``."""
        self.metrics.stages(name, {"request": time.perf_counter() - started})

    def refused(self, name: str, protocol: str, err: ProtocolError) -> None:
        """Count a request refused before it reached ``infer`` (undecodable, over a cap, no such model)."""
        # A name the client made up is not a label: one series per guess would grow without bound.
        self.metrics.request(name if name in self.endpoints else UNKNOWN_MODEL, protocol, err.outcome.label)

    def close(self) -> None:
        self.ready = False
        self.queue.close()
        self.runner.close()
