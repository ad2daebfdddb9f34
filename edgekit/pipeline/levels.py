"""The ways a pipeline can label a frame: its model's session, and for ``degrade`` the faster ones it may switch to."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from edgekit.core.stats import median

if TYPE_CHECKING:
    from edgekit.backends.base import Session, TensorSpec
    from edgekit.model import Model
    from edgekit.processing.postprocess import TopK
    from edgekit.processing.preprocessing import Preprocessor

log = logging.getLogger(__name__)

# A degrade target must be at least this much faster than the level above it to be worth a switch.
DEGRADE_MIN_GAIN = 0.9


@dataclass
class Level:
    """One way to label a frame: a session and the preprocessing made for its input."""

    name: str
    session: Session
    prep: Preprocessor
    speed_ms: float = math.nan
    owned: bool = False  # opened by the pipeline (degrade alternatives), closed with it
    _top: TopK | None = field(default=None, repr=False)

    @cached_property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return tuple(self.session.outputs)

    @cached_property
    def output_names(self) -> tuple[str, ...]:
        # Per level: another artifact of the same model (a LiteRT one) may name and order its outputs differently.
        return tuple(o.name for o in self.session.outputs)

    def top_k(self, model: Model, k: int) -> TopK:
        """A classifier's top-k for this level's first output, made on the first call and kept
        (its buffers and tables are the point: ``edgekit.processing.tensors.output_top_k``)."""
        if self._top is None:
            from edgekit.processing.tensors import output_top_k

            self._top = output_top_k(self.outputs[0], model.labels, k, logits=model.logits)
        return self._top


def warm_up(levels: list[Level], model: Model, top: int) -> None:
    """Run each level twice on a black frame: a session's first runs allocate and spin up thread
    pools, a detector's decoder and a classifier's top-k make their tables: not a frame's cost."""
    import numpy as np

    from edgekit.processing.tensors import from_output

    black = np.zeros((480, 640, 3), np.uint8)
    detector = model.detector
    for level in levels:
        for _ in range(2):
            ys = level.session.run(level.prep(black))
            if detector is not None:
                outs = [from_output(y, spec) for y, spec in zip(ys, level.outputs, strict=True)]
                detector(outs, (480, 640), level.output_names)
            else:
                level.top_k(model, top)(ys[0])


def measure(level: Level, runs: int = 15) -> float:
    """``level``'s median inference ms on a black 640x480 frame, back to back after three warm-up runs."""
    import numpy as np

    frame = np.zeros((480, 640, 3), np.uint8)
    times = []
    for i in range(runs + 3):
        x = level.prep(frame)
        t0 = time.perf_counter_ns()
        level.session.run(x)
        if i >= 3:  # the first runs warm caches and thread pools
            times.append((time.perf_counter_ns() - t0) / 1e6)
    return median(times)


def degrade_chain(primary: Level, model: Model) -> list[Level]:
    """``primary`` then each alternative artifact clearly faster than the level above it (the others closed)."""
    primary.speed_ms = measure(primary)
    found = []
    for session in model.load_alternatives():
        level = Level(session.candidate, session, model.preprocessor(session, fresh=True), owned=True)
        level.speed_ms = measure(level)
        found.append(level)
    measured = ", ".join(f"{lv.name} {lv.speed_ms:.1f} ms" for lv in [primary, *found])
    # Each step down must be clearly faster than the one above it; slower ones are closed.
    chain = [primary]
    for level in sorted(found, key=lambda lv: -lv.speed_ms):
        if level.speed_ms < DEGRADE_MIN_GAIN * chain[-1].speed_ms:
            chain.append(level)
        else:
            level.session.close()
    if len(chain) == 1:
        log.warning(
            "degrade: no artifact of this bundle is faster here than %s (measured: %s); "
            "frames are dropped as with drop-oldest",
            primary.name,
            measured,
        )
    else:
        log.info("degrade chain: %s (measured: %s)", " -> ".join(lv.name for lv in chain), measured)
    return chain
