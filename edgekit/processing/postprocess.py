"""From model outputs to labels: plain functions over arrays, no backend knowledge (pycoral's adapters).

``top_k`` ranks one row; ``TopK`` does the same per frame with its buffers kept between
calls, and can rank a quantized output on its raw integer codes (``edgekit.processing.tensors.
output_top_k`` builds one for a session output).  Both give exactly what the first
``top_k`` gave (``_top_k_plain``, kept for the rows it still handles): the same ids in the
same order, the same names, bit-identical probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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
    ``labels`` (``class N`` when there are fewer names than classes).  Per frame, build a
    ``TopK`` once and call it instead: it keeps its buffers.
    """
    return TopK(labels, k, logits=logits)(scores)


class TopK:
    """``top_k`` for one output, built once and called per frame with the session's output.

    ``dequantize`` turns an output into float scores first (``from_output``); ``codes``, when
    an output is 8-bit quantized, is the float32 score of every code (indexed by the code's
    byte, ``code % 256``; the dtype of the codes is ``codes_dtype``), which must be what
    ``dequantize`` gives for that code.  When the scores strictly increase with the code
    (scale > 0, nothing collapses), outputs of that dtype are ranked on their codes without
    dequantizing the row: only the k best and the softmax denominator are looked up.

    Why so few numpy calls (one argmax per class asked, one float64 ``row - top``, its exp
    and its sum, into kept buffers): in a frame loop this runs right after the model, with
    cold caches, where each numpy call or Python step costs microseconds however small its
    array (``benchmarks/postprocess_speed.py``).  The buffers make one object one thread's:
    call it from one thread at a time (a pipeline's loop); it keeps nothing of an output.
    """

    def __init__(
        self,
        labels: Sequence[str],
        k: int = 5,
        *,
        logits: bool = True,
        dequantize: Callable[[np.ndarray], np.ndarray] | None = None,
        codes: np.ndarray | None = None,
        codes_dtype: str | None = None,
    ) -> None:
        import numpy as np

        self.labels = labels
        self.k = k
        self.logits = logits
        self._dequantize = dequantize
        # Kept between calls: row - top, its exp, and a copy of the codes to rank them on.
        self._shifted = np.empty(0, np.float64)
        self._spare = np.empty(0, np.float64)
        self._codes = np.empty(0, np.int8)
        self._codes_dtype: np.dtype | None = None
        self._code_scores: list[float] = []
        self._code_scores64 = np.empty(0, np.float64)
        self._code_exp: dict[int, tuple[np.ndarray, bool]] = {}
        self._byte_order = np.arange(256)  # the bytes in the codes' order
        self._floor = 0  # the lowest code
        dtype = None if codes_dtype is None else np.dtype(codes_dtype)
        if codes is not None and dtype is not None and dtype.kind in "iu" and dtype.itemsize == 1:
            table = np.asarray(codes, np.float32).reshape(-1)
            if table.size != 256:
                raise ValueError(f"codes: one score per 8-bit code (256), got {table.size}")
            byte_order = np.argsort(np.arange(256, dtype=np.uint8).view(dtype), kind="stable")
            if bool(np.isfinite(table).all()) and bool((np.diff(table[byte_order]) > 0).all()):
                self._codes_dtype = dtype
                self._byte_order = byte_order
                self._floor = int(np.iinfo(dtype).min)
                self._code_scores = table.tolist()
                self._code_scores64 = table.astype(np.float64)

    def __call__(self, output: np.ndarray) -> tuple[Label, ...]:
        """The ``k`` best classes of ``output`` (one row of scores, any shape), best first."""
        import numpy as np

        y = output if isinstance(output, np.ndarray) else np.asarray(output)
        if self._codes_dtype is not None and y.dtype == self._codes_dtype:
            return self._from_codes(y.reshape(-1))
        if self._dequantize is not None:
            y = self._dequantize(y)
        return self._from_scores(y.reshape(-1))

    def _from_scores(self, row: np.ndarray) -> tuple[Label, ...]:
        import numpy as np

        n = row.size
        k = self.k
        if k <= 0 or n == 0:
            return ()
        if k >= n:
            return _top_k_plain(row, self.labels, k, logits=self.logits)
        i = int(row.argmax())  # the first of the best: the lower id wins a tie
        top = float(row.item(i))
        if not math.isfinite(top):  # NaN (argmax stops at the first) or +inf: as the first top_k did
            return _top_k_plain(row, self.labels, k, logits=self.logits)
        shifted, spare = self._buffers(n)
        # row - top in float64, as softmax() and the first top_k compute it, into a kept buffer.
        np.subtract(row, top, out=shifted, dtype=np.float64)
        denom = 1.0
        if self.logits:
            np.exp(shifted, out=spare)
            denom = float(np.add.reduce(spare))
        ranked = _next_best(row, shifted, i, top, k)
        if ranked is None:
            ranked = _rank(row, k)
            if ranked is None:
                return _top_k_plain(row, self.labels, k, logits=self.logits)
        # Comprehensions, not generators, and scores by .item(i): with cold caches each
        # Python-level step counts too.
        names = self.labels
        named = len(names)
        if not self.logits:
            return tuple([Label(i, names[i] if i < named else f"class {i}", float(v)) for i, v in ranked])
        return tuple(
            [
                Label(i, names[i] if i < named else f"class {i}", math.exp(float(v) - top) / denom)
                for i, v in ranked
            ]
        )

    def _from_codes(self, row: np.ndarray) -> tuple[Label, ...]:
        import numpy as np

        n = row.size
        k = self.k
        if k <= 0 or n == 0:
            return ()
        if k >= n:
            table = np.asarray(self._code_scores, np.float32)
            return _top_k_plain(table.take(row, mode="wrap"), self.labels, k, logits=self.logits)
        # Dequantizing keeps the order (strictly increasing), so ranking the codes ranks the scores.
        i = int(row.argmax())
        top_code = int(row.item(i))
        ranked_codes = [(i, top_code)]
        scores = self._code_scores
        names = self.labels
        named = len(names)
        if self.logits:
            exp_of, ordered = self._exp_table(top_code % 256)
            _, spare = self._buffers(n)
            np.take(exp_of, row, out=spare, mode="wrap")  # "wrap": an int8 code -1 is byte 255
            denom = float(np.add.reduce(spare))
            if ordered:
                # exp(score - top) strictly increases with the code too: rank on it, no copy.
                for _ in range(k - 1):
                    spare[i] = -1.0  # taken: below every exp
                    i = int(spare.argmax())
                    ranked_codes.append((i, int(row.item(i))))
        if len(ranked_codes) < k:  # ranked on a copy of the codes instead
            codes = self._codes_buffer(n)
            np.copyto(codes, row)
            floor = self._floor
            for _ in range(k - 1):
                codes[i] = floor  # taken: below every code but the lowest
                i = int(codes.argmax())
                code = int(codes.item(i))
                if code == floor:  # it may be one already taken: rank the row the plain way
                    ranked_codes = [(j, int(c)) for j, c in (_rank(row, k) or ())]
                    break
                ranked_codes.append((i, code))
        if not self.logits:
            return tuple(
                [Label(j, names[j] if j < named else f"class {j}", scores[c % 256]) for j, c in ranked_codes]
            )
        top = scores[top_code % 256]
        return tuple(
            [
                Label(j, names[j] if j < named else f"class {j}", math.exp(scores[c % 256] - top) / denom)
                for j, c in ranked_codes
            ]
        )

    def _exp_table(self, top_byte: int) -> tuple[np.ndarray, bool]:
        """exp(score - top) of every code (by byte) for the best code ``top_byte``, and whether it
        strictly increases with the code (not when far codes underflow to 0); made once per best code."""
        import numpy as np

        made = self._code_exp.get(top_byte)
        if made is None:
            # As the dequantized row's softmax computes each element: a float64 subtract, then
            # numpy's exp, which gives an element the same value wherever it sits in an array.
            exp_of = np.exp(self._code_scores64 - self._code_scores64[top_byte])
            made = (exp_of, bool((np.diff(exp_of[self._byte_order]) > 0).all()))
            self._code_exp[top_byte] = made
        return made

    def _buffers(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        import numpy as np

        if self._shifted.size != n:
            self._shifted = np.empty(n, np.float64)
            self._spare = np.empty(n, np.float64)
        return self._shifted, self._spare

    def _codes_buffer(self, n: int) -> np.ndarray:
        import numpy as np

        assert self._codes_dtype is not None  # only the codes path asks
        if self._codes.size != n:
            self._codes = np.empty(n, self._codes_dtype)
        return self._codes


def _next_best(
    row: np.ndarray, shifted: np.ndarray, i: int, top: float, k: int
) -> list[tuple[int, float]] | None:
    """The ``k`` best (id, score), best first, ties: lower id first, from the best ``i`` and ``shifted``.

    ``shifted`` is ``row - top`` in float64 and is overwritten.  One argmax per class (each
    finds the first of the best left) is cheaper with cold caches than a partition, but it
    ranks ``row - top``: that keeps the order of ``row`` (rounding is monotonic) but could
    round two nearby scores to one value when they are tiny next to ``top`` (float32 next to
    float64: below 2**-26 of it) or the row is float64.  None then, and when a score left is
    NaN or -inf: the caller ranks the row itself.
    """
    if k > 1 and row.dtype.itemsize > 4:
        return None
    tiny = abs(top) * 2.0**-26
    best = [(i, top)]
    taken = [i]
    for _ in range(k - 1):
        shifted[i] = -math.inf
        i = int(shifted.argmax())
        v = float(row.item(i))
        if i in taken or not math.isfinite(v) or abs(v) < tiny:
            return None
        best.append((i, v))
        taken.append(i)
    return best


def _rank(row: np.ndarray, k: int) -> list[tuple[int, float]] | None:
    """(id, score) of the ``k`` best of ``row`` (0 < k < size), best first, ties: lower id first.

    None when one of them is NaN or infinite: the caller leaves those rows to ``_top_k_plain``.
    """
    import numpy as np

    n = row.size
    if k == 1:
        i = int(row.argmax())  # the first of the best: the lower id wins a tie
        v = row[i].item()
        return [(i, v)] if math.isfinite(v) else None
    # The (k+1)-th best is put in place too: the one call says whether a class left out ties the k-th.
    part = np.argpartition(row, (n - k - 1, n - k))[n - k - 1 :]
    values = row[part].tolist()
    if not all(math.isfinite(v) for v in values[1:]):  # NaN sorts last: it would be among them
        return None
    ids = part[1:].tolist()
    best = list(zip(ids, values[1:], strict=True))
    kth = min(values[1:])
    if values[0] == kth:
        # More classes share the k-th score than made the cut: the lowest ids among them win.
        best = [(i, v) for i, v in best if v > kth] + [(i, kth) for i in np.flatnonzero(row == kth).tolist()]
    best.sort(key=lambda iv: (-iv[1], iv[0]))
    return best[:k]


def _top_k_plain(scores: np.ndarray, labels: Sequence[str], k: int, *, logits: bool) -> tuple[Label, ...]:
    """The first ``top_k``, as it was: kept for rows with NaN or infinities and for k >= classes.

    What it makes of a NaN (an unspecified order, NaN probabilities) is kept as it was.
    """
    import numpy as np

    row = np.asarray(scores).reshape(-1)
    k = max(0, min(k, row.size))
    if k == 0:
        return ()
    if k < row.size:
        best = np.argpartition(row, row.size - k)[-k:].tolist()
        kth = min(float(row[i]) for i in best)
        if int(np.count_nonzero(row == kth)) > sum(float(row[i]) == kth for i in best):
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
