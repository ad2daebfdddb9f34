"""The last few seconds of one camera's frames, JPEG-encoded, for an event clip's pre-roll.

Bounded twice: by age (frames older than ``seconds`` before the newest go, as a matter of
course) and by bytes (a busy scene in a big frame can make seconds of JPEGs large; past
``max_bytes`` the oldest go early and each is counted in ``dropped``, so a short pre-roll is
visible rather than silent).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EncodedFrame:
    """One frame as the ring keeps it: its capture time and its JPEG bytes."""

    t: float
    jpeg: bytes


class FrameRing:
    """The frames of the last ``seconds`` (by capture time), at most ``max_bytes`` of JPEG in all."""

    def __init__(self, seconds: float, max_bytes: int) -> None:
        self.seconds = seconds
        self.max_bytes = max_bytes
        self.bytes = 0
        self.dropped = 0  # frames evicted by the byte cap before they were ``seconds`` old
        self._frames: deque[EncodedFrame] = deque()

    def __len__(self) -> int:
        return len(self._frames)

    def push(self, frame: EncodedFrame) -> None:
        """Keep ``frame``; forget what is now too old, then the oldest while over the byte cap."""
        self._frames.append(frame)
        self.bytes += len(frame.jpeg)
        while self._frames and self._frames[0].t < frame.t - self.seconds:
            self.bytes -= len(self._frames.popleft().jpeg)
        while self.bytes > self.max_bytes and len(self._frames) > 1:
            self.bytes -= len(self._frames.popleft().jpeg)
            self.dropped += 1

    def since(self, t0: float, t1: float) -> list[EncodedFrame]:
        """The frames captured in ``[t0, t1]``, oldest first."""
        return [f for f in self._frames if t0 <= f.t <= t1]
