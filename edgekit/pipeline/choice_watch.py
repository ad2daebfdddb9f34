"""Whether the running frames contradict the choice the first load measured, and if so, say so once.

A choice measured on a quiet minute stays in the state folder for good (``edgekit.selection.
choice_cache``).  When the pipeline then sees the chosen artifact infer far slower than it was
measured (the measurement ran on a busy host, or the host changed under it), every later run
would start on the wrong artifact.  ``ChoiceWatch`` compares the p50 of the chosen artifact's
inference over each window of ``WINDOW`` frames with the p50 the choice measured; past
``FACTOR`` times it (and by more than ``SHARE_OF_BUDGET`` of the budget: a 0.1 ms model's
jitter is no contradiction) it marks the kept choice stale, with a log line, so that the next
load measures again.  The running pipeline keeps its artifact: switching is the degrade
policy's business.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from edgekit.core.stats import median

if TYPE_CHECKING:
    from edgekit.model import Model
    from edgekit.pipeline.records import FrameRecord, FrameResult

log = logging.getLogger(__name__)

#: Frames of the chosen artifact one verdict is taken over (about 4 s at 30 fps).
WINDOW = 120
#: Observed p50 over measured p50 above which the choice is contradicted ...
FACTOR = 2.0
#: ... when the difference is also more than this share of the frame budget.
SHARE_OF_BUDGET = 0.1


class ChoiceWatch:
    """An inline sink (``Pipeline.add_sink``): marks the kept choice stale once, when contradicted."""

    name = "choice-watch"
    depth = 0  # a list append per frame; the one file write happens once

    def __init__(self, candidate: str, measured_p50_ms: float, bundle_sha256: str, budget_ms: float) -> None:
        self.candidate = candidate
        self.measured_p50_ms = measured_p50_ms
        self.bundle_sha256 = bundle_sha256
        self.budget_ms = budget_ms
        self.stale = ""  # why, once marked
        self._window: list[float] = []

    def frame(self, result: FrameResult) -> None:
        self.observe(result.record)

    def close(self) -> None:
        pass

    def observe(self, record: FrameRecord) -> None:
        # A batch's time is several frames' (its own rule); another level is the degrade policy's.
        if self.stale or record.candidate != self.candidate or record.batch > 1:
            return
        self._window.append(record.inference_ms)
        if len(self._window) < WINDOW:
            return
        p50 = median(self._window)
        self._window.clear()
        measured = self.measured_p50_ms
        if p50 <= FACTOR * measured or p50 - measured <= SHARE_OF_BUDGET * self.budget_ms:
            return
        self.stale = (
            f"{self.candidate} inferred at p50 {p50:.2f} ms over {WINDOW} frames, "
            f"{p50 / measured:.1f}x the {measured:.2f} ms measured"
        )
        from edgekit.selection.choice_cache import mark_stale

        where = mark_stale(self.bundle_sha256, self.stale)
        log.warning(
            "%s: %s",
            self.stale,
            f"the kept choice ({where}) is marked stale, the next load measures the candidates again "
            "(edgekit select --measure BUNDLE measures now)"
            if where is not None
            else "no kept choice to mark stale",
        )


def watch_choice(model: Model, budget_ms: float) -> ChoiceWatch | None:
    """The sink a pipeline of ``model`` starts with: a ``ChoiceWatch`` when its choice was measured here."""
    sel = model.selection
    measured = sel.p50_ms.get(model.candidate)
    if sel.how not in ("measured", "cached") or not sel.bundle_sha256 or not measured:
        return None
    return ChoiceWatch(model.candidate, measured, sel.bundle_sha256, budget_ms)
