"""A stand-in for a slower device: the real session of a real model, plus a set latency on every run.

A test that needs "the model is slower than the source" or "a slow primary" must not get it
from this machine's speed (a fast CPU runs EfficientNet-Lite0 in ~3 ms, a busy one in 40).
``SlowSession`` runs the real runtime on the real input, then sleeps ``latency_ms``: inference
takes at least that long on any machine, and still gives the real answer.

``EDGEKIT_TEST_STAND_IN_MS`` sets the latency (40 ms by default); the tests that use it derive
their source rates and budgets from it or from times they measure, so they pass at 1 ms too.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from edgekit.backends.base import Session
from edgekit.core.stats import median

if TYPE_CHECKING:
    from edgekit.model import Model

STAND_IN_MS = float(os.environ.get("EDGEKIT_TEST_STAND_IN_MS", "40"))


class SlowSession(Session):
    """``inner`` (a real, open session) with ``latency_ms`` added after each run.

    It answers to the same candidate name and backend as ``inner``, so selection, the
    degrade chain and the records see the real artifact.  Closing it leaves ``inner`` open:
    ``inner`` belongs to whoever opened it (the model).
    """

    def __init__(self, inner: Session, latency_ms: float = STAND_IN_MS) -> None:
        self.backend = inner.backend  # type: ignore[misc]  # the real backend's name, per instance
        super().__init__(inner.artifact, inner.inputs, inner.outputs, inner.device)
        self.inner = inner
        self.latency_s = latency_ms / 1e3
        self.candidate = inner.candidate
        self.fallbacks = inner.fallbacks

    def _run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = self.inner.run(*arrays)
        time.sleep(self.latency_s)  # at least this long, on any machine
        return out


@contextlib.contextmanager
def slower(model: Model, latency_ms: float = STAND_IN_MS) -> Iterator[SlowSession]:
    """Run ``model`` on a ``SlowSession`` inside the block; its own session is back afterwards."""
    real = model.session
    slow = SlowSession(real, latency_ms)
    model.session = slow
    try:
        yield slow
    finally:
        model.session = real
        slow.close()


def model_ms(model: Model, frame: np.ndarray, runs: int = 7) -> float:
    """The median time of one frame through ``model`` here and now (preprocessing + inference), in ms."""
    prep = model.preprocessor()
    times = []
    for i in range(runs + 2):
        t0 = time.perf_counter()
        model.session.run(prep(frame))
        if i >= 2:  # the first runs warm caches and thread pools
            times.append((time.perf_counter() - t0) * 1e3)
    return median(times)
