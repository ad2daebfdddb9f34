"""From model outputs to labels: plain functions over arrays, no backend knowledge (pycoral's adapters)."""

from __future__ import annotations

import math
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
    # Few numpy calls on purpose: right after a model run the caches are cold and each call
    # costs tens of microseconds.  Only the k best are sorted (ties: lower id first).
    if k < row.size:
        best = np.argpartition(row, row.size - k)[-k:].tolist()
        kth = min(float(row[i]) for i in best)
        if int(np.count_nonzero(row == kth)) > sum(float(row[i]) == kth for i in best):
            # More classes share the k-th score than made the cut: the lowest ids among them win.
            best = [i for i in best if row[i] > kth] + np.flatnonzero(row == kth).tolist()
    else:
        best = list(range(row.size))
    ranked = sorted(best, key=lambda i: (-float(row[i]), i))[:k]
    if logits:
        top = float(row[ranked[0]])
        denom = float(np.exp(row.astype(np.float64) - top).sum())
        probs = [math.exp(float(row[i]) - top) / denom for i in ranked]
    else:
        probs = [float(row[i]) for i in ranked]
    return tuple(
        Label(int(i), labels[i] if i < len(labels) else f"class {i}", p)
        for i, p in zip(ranked, probs, strict=True)
    )
