"""From model outputs to labels: plain functions over arrays, no backend knowledge (pycoral's adapters)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Label:
    """One class: its index, its name, and its score (a probability after softmax)."""

    id: int
    name: str
    score: float


def softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable softmax over the last axis, in float64 for the sum."""
    import numpy as np

    z = logits.astype(np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


def top_k(scores: np.ndarray, labels: Sequence[str], k: int = 5, *, logits: bool = True) -> tuple[Label, ...]:
    """The ``k`` best classes of one output row, best first (ties: lower id first).

    ``logits`` says whether ``scores`` still need a softmax; class names come from
    ``labels`` (``class N`` when there are fewer names than classes).
    """
    import numpy as np

    row = np.asarray(scores).reshape(-1)
    k = max(0, min(k, row.size))
    if k == 0:
        return ()
    # Only the k best need sorting: argpartition, then order those k by score (ties: lower id).
    part = np.argpartition(-row, k - 1)[:k] if k < row.size else np.arange(row.size)
    # Ties at the k-th place: take every class with that score, so the lowest ids win.
    kth = row[part].min()
    tied = np.flatnonzero(row >= kth)
    best = tied[np.lexsort((tied, -row[tied]))][:k]
    if logits:
        z = row.astype(np.float64)
        m = z.max()
        probs = np.exp(z[best] - m) / np.exp(z - m).sum()
    else:
        probs = row[best].astype(np.float64)
    return tuple(
        Label(int(i), labels[i] if i < len(labels) else f"class {i}", float(p))
        for i, p in zip(best, probs, strict=True)
    )
