"""``Pipeline``: frames from a source through a model, each within its budget, every miss and drop counted.

::

    with edgekit.load("bundles/enl0-x86") as model:
        for result in edgekit.Pipeline(model, source="0", budget_ms=33):
            print(result.top, result.record.latency_ms)

or with a callback: ``Pipeline(model, source, on_result=show).run()`` returns the summary.
Everything else that consumes frames (records, telemetry, the preview) is a ``Sink``
(``add_sink``, see ``edgekit.pipeline.sinks``), told each finished frame once.
A detector's results carry ``result.detections`` (boxes in frame pixels) instead of labels.

The capture thread reads the source into a one-frame slot (see ``capture``); this loop
takes a frame, prepares it straight into the session's input buffer, runs it, makes
labels (a detector: decodes its outputs and suppresses overlapping boxes, timed as the
postprocess stage), and hands the result to your loop body or callback (the *sink* stage),
then to each sink with the final record.  Each
frame's deadline is its capture time plus the budget; the record says which stages took
how long and whether the deadline was met.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.core.redact import redact_source
from edgekit.core.stats import median
from edgekit.core.tally import SourceHealth
from edgekit.errors import PipelineError
from edgekit.pipeline.batching import Batcher, batch_summary, parse_batch
from edgekit.pipeline.cameras import (
    Camera,
    CameraGroup,
    LiveCamera,
    Sources,
    name_cameras,
    open_cameras,
    parse_budget,
)
from edgekit.pipeline.capture import Frame
from edgekit.pipeline.choice_watch import watch_choice
from edgekit.pipeline.event_sink import EventOutlet, EventSink
from edgekit.pipeline.labelling import result_of
from edgekit.pipeline.levels import Level, degrade_chain, warm_up
from edgekit.pipeline.policy import DegradeController, Policy
from edgekit.pipeline.records import Counters, FrameRecord, FrameResult
from edgekit.pipeline.run_stats import CameraStats, RunStats, Summary
from edgekit.pipeline.shared import SharedFrame, SharedModel
from edgekit.pipeline.sinks import Sink, Sinks
from edgekit.pipeline.source_health import HealthWatch, total
from edgekit.pipeline.sources import Source, open_source
from edgekit.pipeline.warm import Warmer
from edgekit.selection.matching import artifact_for

if TYPE_CHECKING:
    from edgekit.events.event import Event
    from edgekit.events.proof import ProofConfig
    from edgekit.events.tracking import Tracker
    from edgekit.events.zones import CameraRegions
    from edgekit.model import Model

log = logging.getLogger(__name__)

DEFAULT_BUDGET_MS = 33.3

ResultCallback = Callable[[FrameResult], None]
Ticker = Callable[[Mapping[str, LiveCamera]], None]


def _ns_to_ms(ns: int) -> float:
    return ns / 1e6


class Pipeline:
    """Label every frame of ``source`` with ``model`` inside ``budget_ms``; iterate it or ``run()`` it.

    ``source`` is a source string (``"0"``, a file, a folder, a URL, ``"synthetic:640x480@30"``)
    or an open ``Source``; ``sources``, a list (cameras ``cam0``, ``cam1``, ...) or a mapping of
    names to them, makes one pipeline of many cameras: one capture thread each, one model,
    frames taken earliest deadline first, and each record, drop and summary line per camera
    (see ``cameras``).  ``policy`` defaults to ``drop-oldest`` for live sources and
    ``block`` for files (see ``Policy``).  ``realtime`` replays a file at its own frame rate
    (``fps`` overrides it; folders default to 30).  ``frames`` / ``duration_s`` stop the run;
    without them it runs until the source ends or ``stop()``.  ``opencv_threads`` sets
    OpenCV's (process-wide) thread count, 1 by default; ``None`` leaves it as it is.
    ``warm`` keeps the model warm between a camera's frames (``auto``, ``on``, ``off``; see
    ``edgekit.pipeline.warm``): untimed passes shortly before each frame is due.
    ``batch`` infers frames of many cameras that wait together as one batch where the artifact
    allows it (``auto``: as many as fit the budget, at most 8; ``off``; or the most frames a
    batch may hold; see ``edgekit.pipeline.batching``).
    ``shared`` runs the frames on a model worker shared with other work (``edgekit serve``'s:
    ``Running.frames()``) instead of on the pipeline's thread: its frames and the server's
    image requests are batched together (see ``edgekit.pipeline.shared``).
    """

    def __init__(
        self,
        model: Model,
        source: str | Source | None = None,
        *,
        sources: Sources | None = None,
        budget_ms: float | None = None,
        policy: Policy | str | None = None,
        realtime: bool = False,
        fps: float | None = None,
        frames: int | None = None,
        duration_s: float | None = None,
        top: int = 5,
        on_result: ResultCallback | None = None,
        degrade_after: int = 30,
        window: int = 300,
        opencv_threads: int | None = 1,
        warm: str = "auto",
        batch: str | int = "auto",
        shared: SharedModel | None = None,
    ) -> None:
        budget = parse_budget(budget_ms if budget_ms is not None else model.manifest.device.budget_ms)
        if frames is not None and frames < 1:
            raise PipelineError(
                f"frames must be at least 1, got {frames}", "leave it out to run until the end"
            )
        if duration_s is not None and not duration_s > 0:
            raise PipelineError(f"duration must be positive, got {duration_s}", "e.g. --duration 10")
        if shared is not None and shared.model is not model:
            raise PipelineError(
                "the shared model worker runs another model than this pipeline's",
                "give the pipeline the model the server was started with",
            )
        self.model = model
        self.budget_ms = budget
        self.max_frames = frames
        self.duration_s = duration_s
        self.top = top
        self.on_result = on_result
        #: Every consumer of finished frames (``add_sink``), with each one's drops and errors.
        self.sinks = Sinks()
        watch = watch_choice(model, budget)  # measured choice contradicted?
        if watch is not None:
            self.sinks.add(watch)
        if warm not in ("auto", "on", "off"):
            raise PipelineError(f"warm must be auto, on or off, got {warm!r}", "e.g. --warm auto")
        # A shared worker is warm from its other work, and runs the session: no warm pass here.
        self.warm = "off" if shared is not None else warm
        self._shared = shared
        #: Frames the shared worker refused (its room for frames was full), per camera.
        self._refused: dict[str, int] = {}
        self._batch_most = parse_batch(batch)
        self._batcher: Batcher | None = None
        if opencv_threads is not None:
            # OpenCV's thread pool splits frame-sized work across cores: 480x480 -> 224x224 was
            # no faster on two threads than on one, and a busy core stalls the split.  One
            # thread (process-wide: OpenCV has no per-call setting); None leaves it alone.
            import cv2

            cv2.setNumThreads(opencv_threads)
        chosen = Policy.parse(policy) if policy is not None else None
        if sources is not None and source is not None:
            raise PipelineError("give source or sources, not both", "sources=[...] for many cameras")
        # One camera is named "" so that its records look as they always did.
        cams = (
            {"": Camera(source if source is not None else "0")} if sources is None else name_cameras(sources)
        )
        #: Each camera's budget (ms): its own, else the pipeline's.
        self.budgets = {
            n: budget if c.budget_ms is None else parse_budget(c.budget_ms) for n, c in cams.items()
        }
        own = {n: Policy.parse(c.policy) for n, c in cams.items() if c.policy is not None}
        if Policy.DEGRADE in own.values():
            raise PipelineError(
                "degrade is one switch for every camera: it cannot be one camera's policy",
                "set it for the pipeline: policy='degrade' (--policy degrade)",
            )
        if sources is None:
            one = cams[""].source
            self.sources = {"": one if isinstance(one, Source) else open_source(one, fps=fps)}
        else:
            self.sources = open_cameras(cams, fps=fps)
        self.source = next(iter(self.sources.values()))
        self.policy = chosen or Policy.default_for(any(s.info.live for s in self.sources.values()))
        #: Each camera's overload policy: its own, else the pipeline's, else its kind's (files block).
        self.policies = {
            n: own.get(n) or chosen or Policy.default_for(s.info.live) for n, s in self.sources.items()
        }
        # Files and folders replayed in real time, each at its own rate, like cameras.
        self._pace = {
            name: (fps or s.info.fps or 30.0) if realtime and not s.info.live else None
            for name, s in self.sources.items()
        }
        self.pace_fps: float | None = self._pace[next(iter(self.sources))]
        self.counters = Counters()
        self._health = HealthWatch(self.sources)
        self.stats = RunStats(window)
        self.candidates_used: dict[str, int] = {}
        #: Per camera (many sources): frames, met, missed, and the latency sketch of each.
        self.per_camera: dict[str, CameraStats] = (
            {n: CameraStats(budget_ms=self.budgets[n], policy=self.policies[n].value) for n in self.sources}
            if sources
            else {}
        )
        self.last_record: FrameRecord | None = None
        self._stop = threading.Event()
        self._iterated = False
        self._group: CameraGroup | None = None
        self._tickers: list[Ticker] = []
        #: Zones, lines and their events (``add_events``); None until asked for.
        self.event_sink: EventSink | None = None
        self._event_outlets: list[EventOutlet] = []
        self._started_ns = 0
        self._ended_ns = 0
        self.ended_by = ""
        self._levels = [Level(model.candidate, model.session, model.preprocessor(fresh=True))]
        self._level = 0
        self._controller: DegradeController | None = None
        if self.policy is Policy.DEGRADE and shared is not None:
            self.close()
            raise PipelineError(
                "degrade switches the pipeline's own model; a shared model is not the pipeline's to switch",
                "use drop-oldest with a shared model",
            )
        if self.policy is Policy.DEGRADE:
            try:
                self._prepare_degrade(degrade_after)
            except BaseException:
                self.close()  # the source is open: a camera must not stay claimed
                raise

    # -- degrade -------------------------------------------------------------------------

    def _prepare_degrade(self, after: int) -> None:
        self._levels = degrade_chain(self._levels[0], self.model)
        self._controller = DegradeController(
            min(self.budgets.values()), [lv.speed_ms for lv in self._levels], after=after
        )

    @property
    def degrade_chain(self) -> tuple[tuple[str, float], ...]:
        """The levels the degrade policy may use, primary first, with their measured inference ms."""
        return tuple((lv.name, lv.speed_ms) for lv in self._levels)

    @property
    def candidate(self) -> str:
        """The artifact labelling frames now."""
        return self._levels[self._level].name

    # -- the loop ------------------------------------------------------------------------

    def add_sink(self, sink: Sink) -> None:
        """Tell ``sink`` each finished frame once, its record final (see ``edgekit.pipeline.sinks``).

        An inline sink (``depth`` 0) runs on the loop thread; a queued one on its own, behind a
        queue of ``depth`` frames that drops when full.  A sink that raises is counted, not fatal:
        ``pipeline.sinks.dropped`` and ``.errors`` say how often, by sink name.  Sinks close with the
        pipeline, before its source and sessions.
        """
        self.sinks.add(sink)

    def add_ticker(self, tick: Ticker) -> None:
        """Call ``tick(cameras)`` on the loop thread every time round the loop, at least every 0.25 s
        while it waits for frames (keep it cheap): a loop that is stuck calls nothing (``heartbeat``)."""
        self._tickers.append(tick)

    # -- events ----------------------------------------------------------------------------

    def add_events(
        self,
        regions: CameraRegions | Mapping[str, CameraRegions],
        *,
        proof_dir: str | Path | None = None,
        proof: ProofConfig | None = None,
        tracker: Callable[[], Tracker] | None = None,
    ) -> EventSink:
        """Track each camera's objects and turn its zones and lines into events (``events()``).

        ``regions``: one camera's (a pipeline of one source) or a mapping of camera name to
        regions (``edgekit.events.zones.regions_from_dict`` reads a run file's table).  With
        ``proof_dir``, each event of a moment (not ``count``) gets a JPEG snapshot with the boxes
        drawn and a clip around it, written there off the frame thread (``proof`` sets the roll,
        caps and retention).  ``tracker`` makes each camera's tracker (defaults: ``Tracker()``).
        """
        from edgekit.events.tracking import Tracker
        from edgekit.events.zones import CameraRegions

        if self.event_sink is not None:
            raise PipelineError("this pipeline already has its events", "call add_events once")
        if isinstance(regions, CameraRegions):
            if len(self.sources) > 1:
                raise PipelineError(
                    "one camera's zones given to a pipeline of many cameras",
                    "give a mapping of camera name to its zones and lines",
                )
            regions = {next(iter(self.sources)): regions}
        unknown = sorted(set(regions) - set(self.sources))
        if unknown:
            raise PipelineError(
                f"zones for camera(s) {', '.join(map(repr, unknown))}, which this pipeline does not have",
                f"its cameras: {', '.join(map(repr, self.sources))}",
            )
        if self.model.task != "detection":
            raise PipelineError(
                f"zones and lines need a detector's boxes; {self.model.name} is a classifier",
                "run a detection bundle",
            )
        writer = None
        if proof_dir is not None:
            from edgekit.events.proof import ProofWriter

            writer = ProofWriter(Path(proof_dir), proof).start()
        # A live camera's clock is its capture time; a file's, its own frame rate.
        media_fps = {
            n: None if s.info.live else (self._pace[n] or s.info.fps or 30.0) for n, s in self.sources.items()
        }
        sink = EventSink(
            regions,
            media_fps=media_fps,
            proof=writer,
            tracker=tracker or Tracker,
        )
        sink.outlets = self._event_outlets  # the same list: on_event works before or after add_events
        self.event_sink = sink
        self.add_sink(sink)
        return sink

    def on_event(self, outlet: EventOutlet) -> None:
        """Call ``outlet(event)`` with every zone and line event, on the loop thread, in frame order.

        Telemetry's ``report`` sends them this way (``publish_event``: queued, spooled, at least once).
        """
        self._event_outlets.append(outlet)

    def events(self) -> Iterator[Event]:
        """Run the pipeline and yield its events as the frames that decide them finish::

            pipeline.add_events(regions)
            for event in pipeline.events():
                print(event.kind, event.zone, event.track_id)

        At the end of the source, the open stays' ``leave`` and the last interval's ``count``.
        """
        sink = self.event_sink
        if sink is None:
            raise PipelineError("this pipeline has no zones or lines", "pipeline.add_events(regions) first")
        for _ in self:
            yield from sink.take()
        sink.flush()
        yield from sink.take()

    def __iter__(self) -> Iterator[FrameResult]:
        if self._iterated:
            raise PipelineError("a pipeline runs once: its source has been consumed", "make a new Pipeline")
        self._iterated = True
        return self._frames()

    def _frames(self) -> Iterator[FrameResult]:
        budgets_ns = {n: round(ms * 1e6) for n, ms in self.budgets.items()}
        group = self._group = CameraGroup(self.sources, self.policies, self._pace, budgets_ns)
        pending: list[FrameResult] = []  # labelled, not yet handed over and finished
        if self._shared is None:  # a shared worker's session is run by its own thread only
            warm_up(self._levels, self.model, self.top)
        if len(self.sources) > 1 and self._batch_most != 1 and self._batcher is None and not self._shared:
            self._batcher = Batcher(self._levels[0], self.budgets, self._batch_most)
        # Only frames that come at a rate leave the model idle between them: a file read as
        # fast as it goes keeps it busy anyway.  With many cameras the gaps are not one
        # camera's period: no warm pass (their frames keep the model busy in turn).
        paced = (self.source.info.live or self.pace_fps is not None) and len(self.sources) == 1
        warmer = Warmer(self.warm if paced else "off")
        work: deque[int] = deque(maxlen=16)  # the loop's own recent time per frame, ns
        last_image: Any = None  # the last frame, for the warm pass
        self._started_ns = time.perf_counter_ns()
        self._health.start(self._started_ns)
        end_ns = self._started_ns + int(self.duration_s * 1e9) if self.duration_s else None
        group.start()
        try:
            while not self._stop.is_set():
                for tick in self._tickers:
                    tick(group.cameras)
                if self.max_frames is not None and self.counters.frames >= self.max_frames:
                    self.ended_by = "frames"
                    break
                now = time.perf_counter_ns()
                if end_ns is not None and now >= end_ns:
                    self.ended_by = "duration"
                    break
                wait = 0.25 if end_ns is None else min(0.25, (end_ns - now) / 1e9)
                frame = None
                warm_at = None
                if warmer.mode != "off" and last_image is not None:  # no median per frame for nothing
                    warm_at = warmer.next_pass_at(int(median(work)) if work else 0)
                if warm_at is not None:
                    if warm_at > now:
                        frame = group.take(timeout=min(wait, (warm_at - now) / 1e9))
                    if frame is None and not group.finished and time.perf_counter_ns() >= warm_at:
                        self._warm_pass(warmer, last_image)
                if frame is None:
                    frame = group.take(timeout=wait)
                if frame is None:
                    if group.finished:
                        self.ended_by = "source ended" if len(self.sources) == 1 else "sources ended"
                        break
                    continue  # no frame yet: check the stop conditions again
                batch = [frame]
                if self._shared is not None:  # every frame waiting now goes to the worker together
                    batch += iter(lambda: group.take(timeout=0), None)
                elif self._batcher is not None and self._level == 0:  # a degraded level goes one at a time
                    batch = self._batcher.gather(group, frame)
                for f in batch:
                    changed = group.cameras[f.camera].follow_size(f)
                    self._health.frame(f.camera, f.captured_ns, changed)
                    if changed:
                        self.counters.add("size_changes")
                warmer.arrived(frame.captured_ns)
                if self._shared is not None:
                    pending = self._label_shared(batch, self._shared, budgets_ns)
                elif len(batch) == 1:
                    pending = [self._label(frame, budgets_ns[frame.camera])]
                else:
                    assert self._batcher is not None
                    pending = self._label_batch(batch, self._batcher, budgets_ns)
                if warmer.mode != "off":
                    r = pending[0].record
                    work.append(round((r.preprocess_ms + r.inference_ms + r.postprocess_ms) * 1e6))
                    last_image = frame.image
                while pending:
                    yield pending[0]
                    self._finish(pending.pop(0), time.perf_counter_ns())
        finally:
            # The consumer broke out of its loop: the frame it had, and the rest of its batch, still count.
            for result in pending:
                self._finish(result, time.perf_counter_ns())
            self._ended_ns = time.perf_counter_ns()
            if self._stop.is_set() and not self.ended_by:
                self.ended_by = "stop"
            group.stop()
            self._sync_counters()
            if self.event_sink is not None:
                # The run is over: open stays leave, the last interval is counted, while every
                # outlet (telemetry's publisher) still takes events: sinks close after this.
                self.event_sink.flush()

    def _warm_pass(self, warmer: Warmer, image: Any) -> None:
        # The last frame again, through preprocessing and the session, then the session again on
        # the same input (``warmer.burst`` passes in all); the outputs are dropped.
        level = self._levels[self._level]
        bounds = [time.perf_counter_ns()]
        x = level.prep(image)
        for _ in range(warmer.burst):
            level.session.run(x)
            bounds.append(time.perf_counter_ns())
        warmer.ran(*bounds)
        self.counters.raise_to("warm_passes", warmer.passes)
        self.counters.raise_to("warm_late", warmer.late)

    def _label(self, frame: Frame, budget_ns: int) -> FrameResult:
        level = self._levels[self._level]
        t0 = time.perf_counter_ns()
        x = level.prep(frame.image)
        t1 = time.perf_counter_ns()
        ys = level.session.run(x)
        t2 = time.perf_counter_ns()
        return result_of(self.model, level, self.top, frame, ys, (t0, t1, t2), budget_ns)

    def _label_batch(
        self, frames: list[Frame], batcher: Batcher, budgets_ns: Mapping[str, int]
    ) -> list[FrameResult]:
        # One inference for every frame; each frame's stages are its batch's (the preprocessing
        # of all of them, the one inference) up to its own postprocessing, so they add up to
        # its latency.
        ys, t0, t1, t2 = batcher.run(frames)
        level = self._levels[0]
        return [
            result_of(
                self.model,
                level,
                self.top,
                f,
                [y[i : i + 1] for y in ys],
                (t0, t1, t2),
                budgets_ns[f.camera],
                len(frames),
            )
            for i, f in enumerate(frames)
        ]

    def _label_shared(
        self, frames: list[Frame], shared: SharedModel, budgets_ns: Mapping[str, int]
    ) -> list[FrameResult]:
        # Prepared here, inferred by the worker with whatever else waits (its inference stage
        # runs from the frame's submission to its outputs: the wait for the model included).
        import numpy as np

        level = self._levels[0]
        ready, times = [], []
        for f in frames:
            t0 = time.perf_counter_ns()
            x = np.array(level.prep(f.image))  # copied: the preprocessor reuses its buffer
            t1 = time.perf_counter_ns()
            left_s = (f.captured_ns + budgets_ns[f.camera] - t1) / 1e9
            budget_s = budgets_ns[f.camera] / 1e9
            ready.append(SharedFrame(f.camera, x, time.monotonic() + left_s, budget_s))
            times.append((t0, t1))
        out = []
        for f, future, (t0, t1) in zip(frames, shared.submit_frames(ready), times, strict=True):
            if future is None:
                self._refused[f.camera] = self._refused.get(f.camera, 0) + 1
                continue
            got = future.result()
            t2 = time.perf_counter_ns()
            out.append(
                result_of(
                    self.model, level, self.top, f, got.outputs, (t0, t1, t2), budgets_ns[f.camera], got.batch
                )
            )
        return out

    def _finish(self, result: FrameResult, done_ns: int) -> None:
        # The sink stage runs from the frame's postprocessing to ``done_ns``: the loop body, the
        # sinks, and for a batch's later frames the earlier frames' sinks, which they waited for.
        from dataclasses import replace

        provisional = result.record
        labelled_ns = provisional.captured_ns + round(provisional.latency_ms * 1e6)
        record = replace(
            provisional,
            sink_ms=_ns_to_ms(done_ns - labelled_ns),
            latency_ms=_ns_to_ms(done_ns - provisional.captured_ns),
            met=done_ns <= provisional.deadline_ns,
        )
        c = self.counters
        c.add("frames")
        c.add("met" if record.met else "missed")
        self.candidates_used[record.candidate] = self.candidates_used.get(record.candidate, 0) + 1
        self.stats.add(record)
        if self.per_camera:
            self.per_camera[record.camera].count(record.latency_ms, record.met)
        self.last_record = record
        self._sync_counters()
        if self._controller is not None:
            new = self._controller.observe(record.latency_ms)
            if new is not None:
                old = self._levels[self._level]
                self._level = new
                c.add("degrade_switches")
                log.warning(
                    "degrade: switched %s -> %s after frame %d (window p90 vs budget %.1f ms)",
                    old.name,
                    self._levels[new].name,
                    record.index,
                    self.budget_ms,
                )
        # Inline sinks' time falls between this frame's end and the next frame's start: it shows in
        # the loop's pace, not in this frame's record (built once, before any sink sees it).
        self.sinks.tell(replace(result, record=record))

    def _sync_counters(self) -> None:
        c, group = self.counters, self._group
        if group is not None:
            c.raise_to("dropped", group.dropped + sum(self._refused.values()))
            for name, cam in group.cameras.items():
                if name in self.per_camera:
                    self.per_camera[name].dropped = cam.slot.dropped + self._refused.get(name, 0)
                    self.per_camera[name].ended = cam.ended
        for key, attr in (
            ("source_outages", "outages"),
            ("source_reopens", "reopens"),
            ("source_stalls", "stalls"),
            ("source_corrupt", "corrupt"),
            ("source_skipped", "skipped"),
            ("converted", "converted"),
            ("unreadable", "unreadable"),
        ):
            c.raise_to(key, sum(getattr(s.counters, attr) for s in self.sources.values()))

    def health(self) -> dict[str, SourceHealth]:
        """How each camera keeps delivering, now (a single source's is named ``""``); from any thread.

        Outages, reopens, stalls, corrupt frames and size changes since the start, the seconds
        without frames (the current outage included) and the seconds since its last frame.
        """
        return self._health.health()

    # -- driving it ----------------------------------------------------------------------

    def run(self) -> Summary:
        """Run to the end, calling ``on_result`` for each frame (its time is the sink stage)."""
        for result in self:
            if self.on_result is not None:
                self.on_result(result)
        return self.summary()

    def stop(self) -> None:
        """Ask the loop to end after the current frame (safe from any thread or a signal handler)."""
        self._stop.set()

    def summary(self) -> Summary:
        """The run so far (or the finished run), LoadGen style."""
        end = self._ended_ns or time.perf_counter_ns()
        duration = (end - self._started_ns) / 1e9 if self._started_ns else 0.0
        info = self.source.info
        kind = (
            info.kind + (f", {info.fps:g} fps" if info.fps else "") + (", realtime" if self.pace_fps else "")
        )
        if len(self.sources) > 1:
            kind = f"{len(self.sources)} cameras"
        health = self._health.health(self._ended_ns or None)  # a finished run's, as it ended
        for name, h in health.items():
            if name in self.per_camera:
                self.per_camera[name].health = h
        return Summary.of(
            self.stats,
            self.counters,
            duration,
            model=self.model.name,
            candidate=self._levels[0].name,
            source=", ".join(redact_source(s.info.uri) for s in self.sources.values()),
            source_kind=kind,
            policy=self.policy.value,
            budget_ms=self.budget_ms,
            candidates_used=dict(self.candidates_used),
            ended_by=self.ended_by,
            cameras={n: cs.to_dict() for n, cs in self.per_camera.items()},
            batch=batch_summary(self._batcher, self.counters.frames),
            health=total(health).to_dict(),
            sink_dropped=dict(self.sinks.dropped),
            sink_errors=dict(self.sinks.errors),
        )

    def birth(self) -> dict[str, Any]:
        """What this pipeline runs: model, artifact, backend, precision, budget, profile, source, policy."""
        m = self.model.manifest
        level = self._levels[0]
        cand = next((c for c in self.model.candidates if c.key == level.name), None)
        art = artifact_for(cand, m.artifacts) if cand is not None else None
        return {
            "model": {
                "name": m.model.name,
                "version": m.model.version,
                "sha256": m.model.source_sha256,
                "artifact": art.name if art else None,
                "artifact_sha256": art.files[0].sha256 if art else None,
            },
            "candidate": level.name,
            "backend": level.session.backend,
            "precision": art.precision if art else None,
            "budget_ms": self.budget_ms,
            "profile": m.device.profile,
            "source": redact_source(self.source.info.uri),  # a source's password is not telemetry
            "policy": self.policy.value,
        }

    def close(self) -> None:
        """Stop, close the source, telemetry, and any session the pipeline opened (not the model: it is yours)."""
        self.stop()
        self.sinks.close()  # each drained and closed; one that raises does not keep the camera open
        for source in self.sources.values():
            source.close()
        for level in self._levels:
            if level.owned:
                level.session.close()
        if self._batcher is not None:
            self._batcher.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
