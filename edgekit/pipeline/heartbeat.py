"""``FrameHeartbeat``: systemd's watchdog petted from the frame loop, and only while frames flow.

``Pipeline.add_ticker(FrameHeartbeat(notifier).tick)``: the loop calls ``tick`` on its own
thread every time round (at least every 0.25 s while it waits for a frame), so a loop that is
stuck (a runtime that hangs in ``run()``, a sink that blocks) calls nothing and the petting
stops with it.  Then systemd (``WatchdogSec=``), or the agent watching its child, ends the
process and starts it again: the only cure for a thread that is stuck in native code.

A loop that goes round is not enough: it also goes round, waiting, when a capture thread is
stuck in a read that never returns.  So every camera must account for itself since the last
pet, each in one of three ways:

* it delivered a frame (its source's frame count went up): frames flow;
* it is in a counted outage (``outages`` above ``reopens``: the source saw it stop, or stall,
  and is reopening it with back-off) and its capture thread is alive: the source's own
  reconnect is the cure there, and a restart would not bring a camera that is down back any
  sooner; a camera down for an hour must not restart the service in a loop.  Only until the
  reopen succeeds: a camera reopened that then hangs in its first read is wedged again;
* it ended (a file, a folder, a camera whose source failed; the others go on).

A camera that is none of these (open, not in an outage, yet silent for the whole interval)
is wedged, and nothing inside the process can unstick it: the pet is held back until it
accounts for itself again.  A frame rate slower than the interval (``WatchdogSec=`` 30 s
against one frame a minute) is not one edgekit's cameras have; raise ``WatchdogSec=`` for it.

The first tick also says ``READY=1``: the model is loaded and warm and frames are being
taken, which is what a ``Type=notify`` unit waits for before it counts the service as up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from edgekit.core.sd_notify import Notifier
from edgekit.pipeline.sinks import sink

if TYPE_CHECKING:
    from edgekit.pipeline.cameras import LiveCamera
    from edgekit.pipeline.loop import Pipeline


class FrameHeartbeat:
    """Sends ``READY=1`` once and ``WATCHDOG=1`` at half the watchdog interval while every camera accounts for itself."""

    def __init__(
        self,
        notifier: Notifier,
        *,
        every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.notifier = notifier
        self.every_s = every_s if every_s is not None else notifier.pet_every_s
        self._clock = clock
        self._due = 0.0
        self._frames: dict[str, int] = {}  # each camera's source frame count at the last pet
        self.ready = False
        self.pets = 0  # WATCHDOG=1 messages sent
        self.held = ""  # why the last due pet was held back ("" when it was sent)

    @property
    def enabled(self) -> bool:
        return self.notifier.enabled

    def tick(self, cameras: Mapping[str, LiveCamera]) -> None:
        """On the loop thread, every time round: ``READY=1`` the first time, then a pet when one is due."""
        if not self.notifier.enabled:
            return
        now = self._clock()
        if not self.ready:
            self.ready = True
            self._frames = {n: c.source.counters.frames for n, c in cameras.items()}
            self.notifier.ready(self._status(cameras))
            if self.every_s is not None:  # and a first pet: the watchdog may be running already
                self.notifier.watchdog()
                self.pets += 1
                self._due = now + self.every_s
            return
        if self.every_s is None or now < self._due:
            return
        wedged = [n or "the source" for n, c in cameras.items() if not self._accounted(n, c)]
        if wedged:
            # Held back; asked again on every tick, so a late frame still pets in time.
            self.held = f"no frame and no outage: {', '.join(wedged)}"
            return
        self.held = ""
        self._frames = {n: c.source.counters.frames for n, c in cameras.items()}
        self.notifier.watchdog(self._status(cameras))
        self.pets += 1
        self._due = now + self.every_s

    def _accounted(self, name: str, cam: LiveCamera) -> bool:
        counters = cam.source.counters
        if counters.frames > self._frames.get(name, 0):
            return True  # frames flow
        if cam.ended or cam.slot.finished:
            return True  # it ended: nothing left to wait for
        # In an outage the source counted, reopening with back-off on a thread that is alive.
        return counters.outages > counters.reopens and cam.thread.is_alive()

    @staticmethod
    def _status(cameras: Mapping[str, LiveCamera]) -> str:
        parts = []
        for name, cam in cameras.items():
            c = cam.source.counters
            if cam.ended:
                what = "ended"
            elif c.outages > c.reopens:
                what = f"reconnecting (outage {c.outages}, down {cam.source.down_now_s():.0f} s)"
            else:
                what = ""
            parts.append(f"{name or 'source'}: {c.frames} frames" + (f", {what}" if what else ""))
        return "; ".join(parts)

    def stopping(self) -> None:
        """``STOPPING=1``: the pipeline is closing on purpose (its sink's close)."""
        if self.ready:
            self.notifier.stopping()


def attach_heartbeat(pipeline: Pipeline, notifier: Notifier | None = None) -> FrameHeartbeat | None:
    """Pet ``$NOTIFY_SOCKET``'s watchdog from ``pipeline``'s loop; None (nothing attached) without the socket."""
    beat = FrameHeartbeat(notifier or Notifier())
    if not beat.enabled:
        return None
    pipeline.add_ticker(beat.tick)
    pipeline.add_sink(sink("heartbeat", lambda _: None, close=beat.stopping))  # STOPPING=1 at close
    return beat
