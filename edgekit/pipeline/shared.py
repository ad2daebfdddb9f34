"""A model worker the pipeline's frames share with other work: ``edgekit serve``'s, with its requests.

A ``Pipeline`` given ``shared=`` does not run the model itself.  It prepares each frame on its
own thread (as always: capture, preprocessing), hands the frames that wait together to the
shared worker at once (``submit_frames``), and makes each frame's labels from the outputs of its
row, as it does from its own inference.  The worker batches them with whatever else waits for
the model (the server's image requests: the same preprocessed input, so one batch holds both),
earliest deadline first.  A frame keeps its deadline rule: its deadline is its capture time
plus its camera's budget; a frame past it is still labelled and counted as a miss.  A worker
whose room for frames is full refuses the frame (None): it is counted as dropped, like a frame
its camera's slot replaced, and the room is bounded, so a stalled model never holds more than
that many frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from edgekit.model import Model


@dataclass
class SharedFrame:
    """One prepared frame for the shared worker."""

    camera: str
    #: The model's input for it, one row (the frame's own copy).
    x: Any
    #: ``time.monotonic()`` by which it should be labelled: its capture time plus its budget.
    deadline: float
    #: Its camera's frame budget (seconds; 0: not said): the worker keeps its batches within it.
    budget: float = 0.0


@dataclass
class Inferred:
    """The model's outputs for one frame's row, and how many rows its inference held."""

    outputs: list[Any]
    batch: int = 1


class SharedModel(Protocol):
    #: The loaded model it runs: the pipeline's must be this one (its frames are prepared for it).
    model: Model

    def submit_frames(self, frames: Sequence[SharedFrame]) -> list[Future[Inferred] | None]:
        """Queue ``frames`` together; each one's future (its outputs), or None where it was refused."""
