"""One bounded queue whose consumer takes batches: earliest deadline first, expired work never run.

Work of any kind (a served request today; the seam for camera frames that share a model with
the server) is put as a ``Job``: its payload, its deadline, the rows it adds to a batch, and a
``key``.  Jobs with equal keys can be inferred together (same endpoint, same input shape);
``None`` runs alone.  The consumer's ``take`` answers:

- the job with the earliest deadline, then every waiting job with its key, earliest deadline
  first, while their rows fit ``max_rows``;
- when the batch is not full and ``max_delay_s`` > 0, it waits up to that long after the first
  job was taken (never past the batch's earliest deadline) for more jobs of its key;
- the jobs whose deadline passed while they waited, separately: the consumer answers them with
  an error and does not compute them.

Bounded: ``put`` refuses a job at once (``QueueFull``) when ``size`` jobs wait, so memory is at
most ``size`` waiting jobs plus the batch being gathered plus the one running.  A job may belong
to a ``lane`` with a bound of its own (``lanes``): camera frames that share the server's model
have their own room, so a burst of requests cannot push the cameras out, nor the cameras the
requests.  A job that must be computed even late (``expires=False``: a camera frame, which is
labelled and counted as a miss rather than lost) is ordered by its deadline like any other.
One consumer thread: runtimes are not all safe to call from several threads, and one session already uses
the device's cores.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


class QueueFull(Exception):
    """``size`` jobs are waiting: try again later."""


class QueueClosed(Exception):
    """The queue was closed: it takes no more jobs."""


@dataclass(eq=False)
class Job(Generic[T]):
    payload: T
    #: ``time.monotonic()`` after which the job is not computed.
    deadline: float = float("inf")
    #: Jobs with equal keys may share one inference; None: this one runs alone.
    key: Hashable | None = None
    #: What the job adds to a batch's first dimension.
    rows: int = 1
    #: ``time.monotonic()`` when it was put.
    queued: float = field(default_factory=time.monotonic)
    #: False: computed even after its deadline (late, not lost); True: returned apart, not computed.
    expires: bool = True
    #: The bound it counts against: ``lanes[lane]`` when named there, else the queue's ``size``.
    lane: Hashable | None = None


@dataclass
class Taken(Generic[T]):
    """What ``take`` hands the consumer: a batch to run (maybe empty) and the expired jobs to refuse."""

    batch: list[Job[T]]
    expired: list[Job[T]]


class BatchQueue(Generic[T]):
    def __init__(
        self,
        size: int,
        max_rows: int = 1,
        max_delay_s: float = 0.0,
        lanes: Mapping[Hashable, int] | None = None,
    ) -> None:
        if size < 1 or any(n < 1 for n in (lanes or {}).values()):
            raise ValueError("the queue holds at least one job")
        if max_rows < 1:
            raise ValueError("a batch holds at least one row")
        self.size = size
        self.max_rows = max_rows
        self.max_delay_s = max(max_delay_s, 0.0)
        self.lanes = dict(lanes or {})
        self._heap: list[tuple[float, int, Job[T]]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._closed = False

    @property
    def depth(self) -> int:
        """Jobs waiting (not the batch being gathered or run)."""
        return len(self._heap)

    def put(self, job: Job[T]) -> None:
        """Queue ``job``; ``QueueFull`` at once when its bound's jobs wait, ``QueueClosed`` after ``close``."""
        if self.put_all([job]):
            raise QueueFull

    def put_all(self, jobs: list[Job[T]]) -> list[Job[T]]:
        """Queue ``jobs`` at once (the consumer sees all or none of them yet): those that did not fit.

        Frames that wait together go in together, so a consumer taking the first cannot start
        its batch before the others are there.  ``QueueClosed`` after ``close``.
        """
        refused = []
        with self._cond:
            if self._closed:
                raise QueueClosed
            for job in jobs:
                lane = self._lane(job)
                bound = self.size if lane is None else self.lanes[lane]
                # A scan, not a count per lane: the heap holds at most the bounds' sum (a few dozen).
                if sum(1 for item in self._heap if self._lane(item[2]) == lane) >= bound:
                    refused.append(job)
                else:
                    heapq.heappush(self._heap, (job.deadline, next(self._order), job))
            self._cond.notify()
        return refused

    def _lane(self, job: Job[T]) -> Hashable | None:
        return job.lane if job.lane in self.lanes else None

    def take(self) -> Taken[T] | None:
        """Block until there is work: the next batch and the expired jobs; None once closed."""
        with self._cond:
            while not self._heap and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            expired = self._expired(time.monotonic())
            if not self._heap:
                return Taken([], expired)
            first = heapq.heappop(self._heap)[2]
            batch = [first]
            if first.key is None or self.max_rows <= 1 or first.rows >= self.max_rows:
                return Taken(batch, expired)
            rows = first.rows
            rows = self._join(batch, rows)
            until = min(first.queued + self.max_delay_s, first.deadline)
            while rows < self.max_rows and not self._closed:
                left = until - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
                expired += self._expired(time.monotonic())
                rows = self._join(batch, rows)
            return Taken(batch, expired)

    def _expired(self, now: float) -> list[Job[T]]:
        # Earliest deadline first: any expired job is at the head, unless a job that never
        # expires is there first; then the passed ones are picked out (the heap is short).
        if not self._heap or self._heap[0][0] >= now:
            return []
        out = [item for item in sorted(self._heap) if item[0] < now and item[2].expires]
        if out:
            gone = {id(item[2]) for item in out}
            self._heap = [item for item in self._heap if id(item[2]) not in gone]
            heapq.heapify(self._heap)
        return [item[2] for item in out]

    def _join(self, batch: list[Job[T]], rows: int) -> int:
        """Move the waiting jobs of ``batch``'s key into it (earliest deadline first) while they fit."""
        key = batch[0].key
        keep = []
        for item in sorted(self._heap):
            job = item[2]
            if job.key == key and rows + job.rows <= self.max_rows:
                batch.append(job)
                rows += job.rows
            else:
                keep.append(item)
        if len(keep) != len(self._heap):
            self._heap = keep  # sorted: still a heap
        return rows

    def close(self) -> list[Job[T]]:
        """Take no more jobs; wake the consumer (its ``take`` answers None); the waiting jobs, removed."""
        with self._cond:
            self._closed = True
            left = [item[2] for item in sorted(self._heap)]
            self._heap.clear()
            self._cond.notify_all()
            return left
