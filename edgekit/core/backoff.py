"""Exponential back-off between retries, the one rule every retrying loop of edgekit uses.

``Backoff(first_s, factor, cap_s)`` waits ``first_s``, then ``factor`` times longer each time,
never longer than ``cap_s``; ``reset()`` starts over at ``first_s`` (after a success).
``wait(stop)`` sleeps the next delay on a ``threading.Event``, so whoever sets the event
(a close, a stop) ends the wait at once: it returns False then, True after a full wait.
``jitter`` (0..1) shortens each wait by a random share of at most that much, so that many
clients retrying one server do not all come back at the same instant.

Each caller keeps its own constants where it retries; this module holds only the rule.
"""

from __future__ import annotations

import math
import random
import threading
import time


class Backoff:
    """Delays ``first_s``, ``first_s * factor``, ... capped at ``cap_s``; ``reset()`` starts over."""

    def __init__(
        self,
        first_s: float,
        *,
        factor: float = 2.0,
        cap_s: float = math.inf,
        jitter: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        if not first_s >= 0:
            raise ValueError(f"the first delay must be 0 s or more, got {first_s}")
        if not factor >= 1:
            raise ValueError(f"the factor must be at least 1, got {factor}")
        if not cap_s >= first_s:
            raise ValueError(f"the cap ({cap_s} s) must be at least the first delay ({first_s} s)")
        if not 0 <= jitter <= 1:
            raise ValueError(f"jitter must be within 0..1, got {jitter}")
        self.first_s = first_s
        self.factor = factor
        self.cap_s = cap_s
        self.jitter = jitter
        self._rng = rng or random.Random()
        self._next_s = first_s

    @property
    def delay_s(self) -> float:
        """The delay the next wait takes, before jitter (what a log line should say)."""
        return self._next_s

    def reset(self) -> None:
        """Start over: the next wait is ``first_s`` again."""
        self._next_s = self.first_s

    def next_delay(self) -> float:
        """The next delay, jitter applied, and move on to the one after it."""
        delay = self._next_s
        self._next_s = min(self._next_s * self.factor, self.cap_s)
        if self.jitter:
            delay *= 1 - self.jitter * self._rng.random()
        return delay

    def wait(self, stop: threading.Event | None = None) -> bool:
        """Sleep the next delay; False as soon as ``stop`` is set (at once if it already is).

        Without ``stop`` it sleeps the whole delay (a caller that nothing can interrupt).
        """
        delay = self.next_delay()
        if stop is None:
            time.sleep(delay)
            return True
        return not stop.wait(delay)

    def __repr__(self) -> str:
        return f"Backoff(first_s={self.first_s:g}, factor={self.factor:g}, cap_s={self.cap_s:g}, next={self._next_s:g})"
