"""What this process holds right now: resident memory, the Python heap, open files, threads.

``sample()`` reads them from ``/proc/self`` (Linux; elsewhere the fields it cannot read are
None) and the Python heap from ``tracemalloc`` when it is tracing (numpy registers its
arrays' memory there too, so a leaked frame shows).  Tracing costs every allocation its
time (the frame loop ran at a quarter of its rate under it); ``blocks``, the objects
Python's allocator holds (``sys.getallocatedblocks()``), costs nothing and still shows a
leak of one small object a frame.  A soak samples them once a window and
looks at how they move (``edgekit.bench.soak``); no psutil needed on a device.

Pure standard library, importing nothing else from edgekit.
"""

from __future__ import annotations

import sys
import threading
import time
import tracemalloc
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc/self")


@dataclass(frozen=True)
class Resources:
    """One sample.  ``threads`` are Python's (``threading.active_count()``); ``tasks`` every OS
    thread of the process, native ones (ONNX Runtime's pool, Mosquitto's client) included."""

    at: float  # time.monotonic() when sampled
    rss_bytes: int | None  # VmRSS
    heap_bytes: int | None  # tracemalloc's traced memory now (None: not tracing)
    blocks: int  # memory blocks Python's allocator holds (its objects, one or more each)
    fds: int | None  # entries of /proc/self/fd
    threads: int
    tasks: int | None  # entries of /proc/self/task

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rss_bytes() -> int | None:
    """Resident set size from ``/proc/self/status`` (kB there), or None where there is none."""
    try:
        for line in (PROC / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _entries(folder: Path) -> int | None:
    try:
        # Listing /proc/self/fd opens the folder itself, which it then lists too: not counted.
        return sum(1 for _ in folder.iterdir()) - (1 if folder.name == "fd" else 0)
    except OSError:
        return None


def sample() -> Resources:
    """The process's resources now."""
    heap = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else None
    return Resources(
        at=time.monotonic(),
        rss_bytes=rss_bytes(),
        heap_bytes=heap,
        blocks=sys.getallocatedblocks(),
        fds=_entries(PROC / "fd"),
        threads=threading.active_count(),
        tasks=_entries(PROC / "task"),
    )
