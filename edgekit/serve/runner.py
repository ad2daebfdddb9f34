"""How the inference worker runs requests on the model: alone on its session, or as one batch.

A batch needs a session whose artifact has a free batch dimension (``Session.batchable``: the
build makes its ONNX and OpenVINO artifacts so); ``session.batched(k)`` makes the session for
``k`` rows, made for every ``k`` before the server is ready (``warm``) and kept.  Each request
comes prepared (decoded, preprocessed on the thread that received it: ``Service.infer``), the
rows go through the session at once, and each request's answer is made from its own rows: the same answer it gets alone.
A batch may hold camera frames that share the model (``edgekit.serve.frames``) beside pictures:
each is finished by its own endpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgekit.errors import EdgekitError
from edgekit.serve.endpoints import InferRequest, InferResult, Prepared

if TYPE_CHECKING:
    from edgekit.backends.base import Session
    from edgekit.model import Model

log = logging.getLogger(__name__)

#: The largest batch when ``--max-batch`` is not given (the pipeline's own largest, for cameras).
DEFAULT_MAX_BATCH = 8


@dataclass(frozen=True)
class Batching:
    """Which waiting requests are inferred together: at most ``max_batch`` (1: none), and how long
    the first may wait for more (``max_queue_delay_ms``; 0: only those already waiting)."""

    max_batch: int = DEFAULT_MAX_BATCH
    max_queue_delay_ms: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise EdgekitError(
                f"max batch must be a whole number >= 1, got {self.max_batch!r}", "e.g. --max-batch 8"
            )
        if not self.max_queue_delay_ms >= 0:
            raise EdgekitError(
                f"max queue delay must be >= 0 ms, got {self.max_queue_delay_ms!r}",
                "e.g. --max-queue-delay-ms 2",
            )


class ModelRunner:
    """Runs requests on ``model``; batches of up to ``max_batch`` rows when its session allows."""

    def __init__(self, model: Model, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        self.model = model
        wanted = max_batch
        if wanted > 1 and not model.session.batchable:
            log.info(
                "serve: %s has a fixed batch of one (%s): requests go one at a time, earliest deadline first",
                model.name,
                model.session.artifact.name,
            )
            wanted = 1
        self.max_batch = wanted
        self._sessions: dict[int, Session] = {}
        #: Inferences run, and the requests they answered (their ratio: the mean batch).
        self.inferences = 0
        self.requests = 0
        #: Camera frames those inferences labelled, and the inferences that held frames and requests.
        self.frames = 0
        self.shared = 0
        #: Seconds an inference of k rows took here when ``warm`` measured it, k -> seconds.
        #: Measured once, on a quiet worker, as the pipeline's batcher does: times taken under
        #: load would only ever shrink the batches (a size above the cap is never run again).
        self.infer_s: dict[int, float] = {}

    def warm(self) -> None:
        """Make and run once the session for every batch size now, before the server says ready.

        Made on first use instead, a batch size's first inference waited for its compilation
        (about 0.2 s for EfficientNet-Lite0 on OpenVINO): the requests and camera frames in it,
        and every one queued behind, missed their deadlines.  A size the runtime cannot make
        ends the batches below it, as the pipeline's batcher does.
        """
        import numpy as np

        for rows in range(2, self.max_batch + 1):
            try:
                session = self._session(rows)
                if all(None not in t.shape for t in session.inputs):  # a free dimension: made, not run
                    zeros = [np.zeros([d or 0 for d in t.shape], t.dtype) for t in session.inputs]
                    session.run(*zeros)  # the first run sets the runtime up: not its speed
                    t = time.perf_counter()
                    session.run(*zeros)
                    self.infer_s[rows] = time.perf_counter() - t
            except EdgekitError as err:
                log.warning("serve: %s batches stop at %d rows (%s)", self.model.name, rows - 1, err)
                self.max_batch = rows - 1
                return

    def rows_within(self, budget_s: float) -> int:
        """The most rows one inference may hold while camera frames with ``budget_s`` share it.

        A frame that arrives as a batch starts waits for that batch and then its own, so two
        inferences of k rows must fit its budget (the pipeline's batcher keeps the same rule).
        Nothing measured (a model with other free dimensions): no cap.  Never fewer than one row.
        """
        if not self.infer_s:
            return self.max_batch
        most = 1
        for k in range(2, self.max_batch + 1):
            took = self.infer_s.get(k)
            if took is None or 2 * took > budget_s:
                break
            most = k
        return most

    def key(self, request: InferRequest) -> Hashable | None:
        return request.endpoint.batch_key(request) if self.max_batch > 1 else None

    def run(self, requests: Sequence[InferRequest]) -> list[InferResult | Exception]:
        if len(requests) == 1:
            result = requests[0].endpoint.run(requests[0])
            self._count(requests)
            return [result]
        import numpy as np

        out: list[InferResult | Exception] = []
        ready: list[tuple[int, Prepared]] = []
        rows: list[list[np.ndarray]] = []  # per model input, each request's row (its own: ``ready``)
        for i, request in enumerate(requests):
            try:  # a picture that does not decode is its request's error, not the batch's
                prepared = request.endpoint.ready(request)
            except Exception as err:  # noqa: BLE001 (handed to that request's caller)
                out.append(err)
                continue
            rows = rows or [[] for _ in prepared.arrays]
            for held, x in zip(rows, prepared.arrays, strict=True):
                held.append(x)
            ready.append((i, prepared))
            out.append(ValueError("not run"))
        if not ready:
            return out
        arrays = [np.concatenate(xs) for xs in rows]
        try:
            session = self._session(len(ready))
        except EdgekitError:  # a runtime that cannot reshape this graph: one at a time it is
            self.max_batch = 1
            prepared_at = {i for i, _ in ready}
            return [self._alone(r) if i in prepared_at else out[i] for i, r in enumerate(requests)]
        t = time.perf_counter()
        raw = session.run(*arrays)
        infer = time.perf_counter() - t
        self._count([requests[i] for i, _ in ready])
        for row, (i, prepared) in enumerate(ready):
            prepared.stages["infer"] = infer
            try:
                done = requests[i].endpoint.finish(requests[i], prepared, [y[row : row + 1] for y in raw])
                done.batch = len(ready)
                out[i] = done
            except Exception as err:  # noqa: BLE001 (handed to that request's caller)
                out[i] = err
        return out

    def _alone(self, request: InferRequest) -> InferResult | Exception:
        try:
            result = request.endpoint.run(request)
        except Exception as err:  # noqa: BLE001 (handed to that request's caller)
            return err
        self._count([request])
        return result

    def _count(self, answered: Sequence[InferRequest]) -> None:
        frames = sum(1 for r in answered if not r.endpoint.served)
        self.inferences += 1
        self.requests += len(answered) - frames
        self.frames += frames
        self.shared += 0 < frames < len(answered)

    def _session(self, rows: int) -> Session:
        if rows == 1:
            return self.model.session
        found = self._sessions.get(rows)
        if found is None:
            try:
                found = self.model.session.batched(rows)
            except EdgekitError as err:
                log.warning("serve: %s cannot take %d rows at once (%s)", self.model.name, rows, err)
                raise
            self._sessions[rows] = found
        return found

    @property
    def mean_batch(self) -> float:
        return (self.requests + self.frames) / self.inferences if self.inferences else 0.0

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()
        self._sessions.clear()
