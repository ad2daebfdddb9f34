"""Many cameras, one frame loop: a capture thread and a one-frame slot per camera, taken earliest deadline first.

Every camera has its own capture thread and slot (``capture``), so a slow or dead camera
never holds up another's reads, and each camera's overload policy applies to its own slot
(under ``drop-oldest`` a camera's stale frame is replaced and counted against that camera).
The slots share one condition, so the loop sleeps until any camera has a frame and then
takes the one whose deadline comes first: its capture time plus its camera's budget.  With
one budget for all that is the oldest frame waiting, so a camera that sends more often
cannot starve a slower one, whose frame is older by the time it is looked at (``Fairness``
in the tests).  A camera may have its own budget and overload policy (``Camera``): a 15 fps
camera given 66 ms waits behind a 30 fps one given 33 ms exactly as long as its deadline allows.  A camera whose source fails for good (a file that ends, a stream that
will not reopen) ends alone: it is logged and counted, and the others go on; the run ends
when every camera has ended.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from edgekit.core.redact import redact_source
from edgekit.errors import PipelineError
from edgekit.pipeline.capture import CaptureThread, Frame, FrameSlot
from edgekit.pipeline.policy import Policy
from edgekit.pipeline.sources import Source, open_source

log = logging.getLogger(__name__)


def parse_budget(ms: object) -> float:
    """A frame budget in ms: a positive, finite number (else ``PipelineError``)."""
    try:
        budget = float(ms)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        budget = math.nan
    if not budget > 0 or math.isinf(budget):
        raise PipelineError(f"the budget must be a positive number of ms, got {ms}", "e.g. --budget 33")
    return budget


@dataclass(frozen=True)
class Camera:
    """A camera of a many-camera pipeline with settings of its own, e.g.
    ``sources={"door": Camera("rtsp://door/s1", budget_ms=66), "yard": "0"}``.

    ``budget_ms`` and ``policy`` (``drop-oldest``, ``block``) default to the pipeline's; the
    ``degrade`` policy is one switch for every camera, so it is set for the pipeline only.
    """

    source: str | Source
    budget_ms: float | None = None
    policy: Policy | str | None = None


Sources = Sequence["str | Source | Camera"] | Mapping[str, "str | Source | Camera"]


def name_cameras(sources: Sources) -> dict[str, Camera]:
    """Each camera by name: a mapping keeps its names, a list is named ``cam0``, ``cam1``, ..."""
    named = dict(sources) if isinstance(sources, Mapping) else {f"cam{i}": s for i, s in enumerate(sources)}
    if not named:
        raise PipelineError("sources is empty", "give at least one source, e.g. sources=['0']")
    bad = [n for n in named if not isinstance(n, str) or not n or len(n) > 64]
    if bad:
        raise PipelineError(f"camera names must be 1-64 characters, got {bad!r}", "e.g. {'door': '0'}")
    return {n: s if isinstance(s, Camera) else Camera(s) for n, s in named.items()}


def open_cameras(cameras: Mapping[str, Camera], fps: float | None = None) -> dict[str, Source]:
    """Open each camera's source.  If one fails to open, those opened before it are closed
    (a camera must not stay claimed)."""
    opened: dict[str, Source] = {}
    try:
        for name, cam in cameras.items():
            src = cam.source
            opened[name] = src if isinstance(src, Source) else open_source(src, fps=fps)
    except BaseException:
        for s in opened.values():
            s.close()
        raise
    return opened


@dataclass
class LiveCamera:
    """One camera of a running pipeline: its source, slot and capture thread, and how it ended."""

    name: str
    source: Source
    slot: FrameSlot
    thread: CaptureThread
    ended: str = ""  # why it stopped sending frames, once it has
    last_shape: tuple[int, ...] | None = field(default=None, repr=False)

    def follow_size(self, frame: Frame) -> bool:
        """Note the frame's size; True (and a warning) when it changed from this camera's last frame."""
        shape, last = frame.image.shape, self.last_shape
        self.last_shape = shape
        if last is None or shape == last:
            return False
        log.warning(
            "%sframe %d: size changed from %s to %s; preprocessing follows it",
            f"camera {self.name}, " if self.name else "",
            frame.index,
            "x".join(map(str, last[1::-1])),
            "x".join(map(str, shape[1::-1])),
        )
        return True


class CameraGroup:
    """The slots of every camera, taken earliest deadline (oldest capture) first."""

    def __init__(
        self,
        sources: Mapping[str, Source],
        policy: Policy | Mapping[str, Policy],
        pace_fps: Mapping[str, float | None],
        budgets_ns: Mapping[str, int] | None = None,
    ) -> None:
        self._cond = threading.Condition()
        self.cameras: dict[str, LiveCamera] = {}
        # A frame's deadline is its capture time plus its camera's budget (one budget: the oldest first).
        self._budget_ns = {n: (budgets_ns or {}).get(n, 0) for n in sources}
        for name, source in sources.items():
            slot = FrameSlot(
                policy if isinstance(policy, Policy) else policy[name], cond=self._cond, camera=name
            )
            thread = CaptureThread(source, slot, pace_fps.get(name), camera=name)
            self.cameras[name] = LiveCamera(name, source, slot, thread)

    def start(self) -> None:
        for cam in self.cameras.values():
            cam.thread.start()

    def stop(self) -> None:
        # Every slot closes first: a frame a camera delivers while another's thread is being
        # joined comes after the run, and must not count as a drop of the run.
        for cam in self.cameras.values():
            cam.slot.finish()
        for cam in self.cameras.values():
            cam.thread.stop()

    @property
    def dropped(self) -> int:
        return sum(c.slot.dropped for c in self.cameras.values())

    @property
    def finished(self) -> bool:
        """Every camera has ended and none has a frame waiting."""
        with self._cond:
            return all(c.slot.finished for c in self.cameras.values())

    def take(self, timeout: float | None = None) -> Frame | None:
        """The waiting frame with the earliest deadline, waiting up to ``timeout`` s for one (None: none came).

        A camera whose source failed is ended here (logged once), not raised: the others go on.
        With one camera its error is raised, as a single-source pipeline always did.
        """
        with self._cond:
            if not self._cond.wait_for(self._any_ready_or_all_done, timeout):
                return None
            ready = [c for c in self.cameras.values() if c.slot.has_frame]
            if ready:
                first = min(ready, key=lambda c: c.slot.peek_captured_ns() + self._budget_ns[c.name])
                return first.slot.take(timeout=0)
            for cam in self.cameras.values():
                self._end(cam)
            return None

    def _any_ready_or_all_done(self) -> bool:
        done = 0
        for cam in self.cameras.values():
            if cam.slot.has_frame:
                return True
            if cam.slot.finished:
                if len(self.cameras) > 1:
                    self._end(cam)
                done += 1
        return done == len(self.cameras)

    def _end(self, cam: LiveCamera) -> None:
        if cam.ended:
            return
        error = cam.slot.error
        if error is None:
            cam.ended = "source ended"
            return
        if len(self.cameras) == 1:
            raise error
        cam.ended = f"failed: {getattr(error, 'message', str(error))}"
        log.warning(
            "camera %s (%s) %s; the other cameras go on",
            cam.name,
            redact_source(cam.source.info.uri),
            cam.ended,
        )
