"""``EventQueue``: zone and line events on their way from the frame path to the publisher's spool.

The frame path only appends (a deque append: no disk, no lock of the spool's); the
publisher's thread takes them, numbers them, checks them against the wire model and
writes them to the spool, from where they go out like telemetry windows: QoS 1, kept
until the broker acknowledged them, replayed in order after an outage.  The queue is
bounded: past ``max_events`` waiting the oldest go, counted in ``dropped`` (which the
telemetry window reports as ``events_dropped``), never silently.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from edgekit.protocol.messages import EventMessage, checked
from edgekit.protocol.topics import SCHEMA_EVENT

if TYPE_CHECKING:
    from edgekit.events.event import Event

# A burst this long waits for the publisher's thread (a few seconds of a busy scene at most).
MAX_EVENTS = 10_000


class EventQueue:
    """A bounded FIFO of events (as their plain dicts); ``put`` from any thread, ``take`` from one."""

    def __init__(self, max_events: int = MAX_EVENTS) -> None:
        self.max_events = max_events
        self.dropped = 0  # only goes up: events the queue had no room for
        self._items: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()

    def put(self, event: Event | Mapping[str, Any]) -> None:
        """Queue an ``Event`` (or its ``to_dict()``); the oldest waiting one goes when the queue is full."""
        item = dict(event) if isinstance(event, Mapping) else event.to_dict()
        with self._lock:
            self._items.append(item)
            if len(self._items) > self.max_events:
                self._items.popleft()
                self.dropped += 1

    def take(self) -> list[dict[str, Any]]:
        """Everything waiting, oldest first."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items

    def __len__(self) -> int:
        return len(self._items)


def event_body(
    event: Mapping[str, Any], *, device: str, fleet: str, session: str, epoch: str, seq: int
) -> dict[str, Any]:
    """The ``edgekit/v1/event`` message of ``event`` (checked: ``ValidationError`` if a receiver would refuse it)."""
    head = {
        "schema": SCHEMA_EVENT,
        "device": device,
        "fleet": fleet,
        "session": session,
        "epoch": epoch,
        "seq": seq,
        "sent_at": round(time.time(), 3),
    }
    # Who sends it and its number are the publisher's to say, whatever keys the event's dict has.
    return checked(EventMessage, head | {k: v for k, v in event.items() if k not in head})
