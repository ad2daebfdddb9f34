"""Camera frames on the server's model: a ``Pipeline`` and the server share one batcher and one session.

``Running.frames()`` (or ``Service.frames()``) is the pipeline's ``SharedModel``
(``edgekit.pipeline.shared``)::

    running = edgekit.serve.start(model, ServeOptions(...))
    pipeline = edgekit.Pipeline(model, sources=["rtsp://door/s1", "0"], shared=running.frames())

The pipeline prepares each frame (the bundle's own preprocessing, as the ``-image`` endpoint
does) and hands it here; it is queued as a request of a model name no client can call, under
the ``-image`` endpoint's batch key, so frames and pictures that wait together are one
inference.  A frame is ordered by its deadline (capture time plus its camera's budget) and
never expires: one past its deadline is still labelled, and the pipeline counts it missed.
Frames have their own room in the queue (``frame_room``, the request queue's size unless
given): requests cannot crowd the cameras out, nor the cameras the requests; a frame that
finds the room full is refused and counted as dropped by the pipeline.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING

from edgekit.errors import PipelineError
from edgekit.pipeline.shared import Inferred, SharedFrame
from edgekit.serve.endpoints import (
    FRAMES,
    IMAGE_SUFFIX,
    Endpoint,
    InferRequest,
    InferResult,
    Prepared,
    Tensor,
)
from edgekit.serve.outcomes import ProtocolError

if TYPE_CHECKING:
    import numpy as np

    from edgekit.model import Model
    from edgekit.serve.limits import Limits
    from edgekit.serve.queue import InferenceQueue

_INPUT = "frame"


class FrameEndpoint(Endpoint):
    """A camera frame, already prepared, in; the model's raw outputs for its row out.  Not served."""

    served = False
    lane = FRAMES
    expires = False

    def __init__(self, model: Model, limits: Limits) -> None:
        super().__init__(model, limits, model.name + "-frames", (), ())

    def _check(self, request: InferRequest) -> None:
        pass

    def batch_key(self, request: InferRequest) -> Hashable | None:
        # The image endpoint's key: both are the bundle's preprocessing of one picture.
        return self.model.name + IMAGE_SUFFIX

    def prepare(self, request: InferRequest) -> Prepared:
        return Prepared([request.inputs[_INPUT]])

    def finish(self, request: InferRequest, prepared: Prepared, raw: list[np.ndarray]) -> InferResult:
        return InferResult([Tensor("", "", y) for y in raw], prepared.stages)


class FrameLane:
    """The server's worker as a pipeline's ``SharedModel``."""

    def __init__(self, model: Model, queue: InferenceQueue, endpoint: FrameEndpoint) -> None:
        self.model = model
        self._queue = queue
        self._endpoint = endpoint

    def submit_frames(self, frames: Sequence[SharedFrame]) -> list[Future[Inferred] | None]:
        requests = [
            # Prepared already: the frame's row is its own copy (``SharedFrame.x``), kept as it is.
            InferRequest(
                self._endpoint, {_INPUT: f.x}, id=f.camera, deadline=f.deadline, prepared=Prepared([f.x])
            )
            for f in frames
        ]
        budgets = [f.budget for f in frames if f.budget > 0]
        if budgets:
            self._queue.frames_come(min(budgets))
        try:
            futures = self._queue.submit_all(requests)
        except ProtocolError as err:  # stopping: the pipeline cannot go on without its model
            raise PipelineError(f"the shared model refused frames: {err}", "stop the pipeline first") from err
        return [None if f is None else _outputs(f) for f in futures]


def _outputs(future: Future[InferResult]) -> Future[Inferred]:
    out: Future[Inferred] = Future()

    def done(f: Future[InferResult]) -> None:
        if f.cancelled():
            return
        err = f.exception()
        with contextlib.suppress(InvalidStateError):  # the pipeline gave up on it meanwhile
            if err is None:
                result = f.result()
                out.set_result(Inferred([t.data for t in result.outputs], result.batch))
            else:
                out.set_exception(
                    PipelineError(f"the shared model failed a frame: {err}", "see the log above")
                )

    def given_up(o: Future[Inferred]) -> None:
        if o.cancelled():  # not computed, if it still waits
            future.cancel()

    future.add_done_callback(done)
    out.add_done_callback(given_up)
    return out
