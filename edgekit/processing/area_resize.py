"""OpenCV's INTER_AREA shrink of a 3-channel uint8 image, bit for bit, in a layout that vectorizes.

Why: in the frame loop, ``cv2.resize(..., INTER_AREA)`` of the 480x480 center crop of a
640x480 frame to 224x224 is ~0.78 ms of the Preprocessor's ~0.8 ms (one core).  The ratio
(15/7) is not an integer, so OpenCV takes its generic area path (``ResizeArea_Invoker``), which
is scalar: per source row, one multiply-add per (destination pixel, tap, channel) through a
gather table.  A model is calibrated and gated on the build's ``fit()`` (``cv2.resize``), so a
faster resize is only acceptable if it gives the same bytes.

Exactness.  OpenCV computes, for a uint8 image and a non-integer ratio:

* per source row ``sy`` and destination column ``dx``: ``buf = 0; buf = buf + float(S[sx]) * alpha``
  for its taps in ``computeResizeAreaTab``'s order (float32);
* per destination row: ``sum = 0; sum = sum + beta * buf`` over its source rows in order (float32);
* ``saturate_cast<uchar>(sum)``: round half to even, clamp to 0..255.

This module performs those very float32 operations, per pixel in the same order (the tables are
``computeResizeAreaTab`` transcribed, in double then cast as OpenCV casts), only grouped so that the
inner loops run over many independent pixels (which is what lets LLVM vectorize them without
changing any single pixel's arithmetic: no fastmath, no reassociation, no FMA contraction).  Adding
``0.0`` first, as OpenCV does, changes nothing for these non-negative sums, so it is skipped.

The grouping: with a ratio ``S/P`` in lowest terms, destination columns ``P`` apart have the same
taps shifted by ``S`` source columns.  Each source row is transposed into ``S`` rows of ``B`` blocks
(``T[o, b*3 + c] = src[S*b + o, c]``), so each (phase, tap) is one contiguous multiply-add over all
``B*3`` values of the row; weights are stored per block anyway, so nothing relies on the double
arithmetic of the table being exactly periodic, only its source offsets (checked; ``B = 1`` is the
general, always valid case).  The vertical pass is contiguous as it stands.

Proof per machine, not assumption: OpenCV's own compiler may fuse a multiply and an add (aarch64),
or OpenCV may route a size elsewhere, so every ``AreaResizer`` compares itself with ``cv2.resize`` on
a random image of its size when it is built and refuses to exist otherwise (the same per-pixel
operations on any input give the same result, so random pixels exercise every (pixel, tap) path).

Measured here (x86_64 Xeon, one core, ``benchmarks/preprocess_speed.py``), median per call:
640x480 (crop 480x480) -> 224x224: cv2 766 us, this 234 us (3.3x); 1280x720: 1451 vs 531 us
(2.7x); 1920x1080: 2999 vs 1412 us (2.1x); all bit-exact.  Where the time goes (480x480): moving
each row into the phase layout ~70 us (was ~135 us moving bytes one at a time), the vectorized
horizontal taps ~90 us, vertical ~25 us, rounding and writing out ~40 us.  Tried and slower:
transposing the whole crop with ``cv2.transpose`` so the horizontal taps run over every row at once
(0.48 ms: their float sums no longer fit in cache, and the vertical pass became short loops).
The kernel compiles once a process (~1.2 s, when the Preprocessor is built).
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

# At module level: the numba kernel resolves ``np`` as a global.  Only the Preprocessor imports
# this module, and only where numpy (the device extra) is installed.
import numpy as np

log = logging.getLogger(__name__)

_logged: set[str] = set()


class AreaResizeUnavailable(Exception):
    """This machine or this size cannot use the fast resize; the caller uses ``cv2.resize``."""


def log_once(reason: str) -> None:
    """Say once per process (INFO) why the fast resize is not used."""
    if reason not in _logged:
        _logged.add(reason)
        log.info("fast INTER_AREA resize not used: %s (falling back to cv2.resize)", reason)


def area_tab(ssize: int, dsize: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """OpenCV's ``computeResizeAreaTab`` (one channel): per destination index its taps' source indices, weights, count."""
    scale = 1.0 / (dsize / ssize)  # OpenCV: scale_x = 1. / inv_scale_x, inv_scale_x = dsize / ssize
    taps: list[list[tuple[int, np.float32]]] = []
    for dx in range(dsize):
        fsx1 = dx * scale
        fsx2 = fsx1 + scale
        cell = min(scale, ssize - fsx1)
        sx1, sx2 = math.ceil(fsx1), math.floor(fsx2)
        sx2 = min(sx2, ssize - 1)
        sx1 = min(sx1, sx2)
        t = []
        if sx1 - fsx1 > 1e-3:
            t.append((sx1 - 1, np.float32((sx1 - fsx1) / cell)))
        t.extend((sx, np.float32(1.0 / cell)) for sx in range(sx1, sx2))
        if fsx2 - sx2 > 1e-3:
            t.append((sx2, np.float32(min(min(fsx2 - sx2, 1.0), cell) / cell)))
        taps.append(t)
    n = max(len(t) for t in taps)
    idx = np.zeros((dsize, n), np.int32)
    weight = np.zeros((dsize, n), np.float32)
    count = np.zeros(dsize, np.int32)
    for d, t in enumerate(taps):
        count[d] = len(t)
        for j, (s, a) in enumerate(t):
            idx[d, j], weight[d, j] = s, a
    return idx, weight, count


def opencv_takes_generic_area(src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> bool:
    """Whether ``cv2.resize(INTER_AREA)`` of these sizes runs the generic area path this module reproduces.

    It does when both axes shrink (or keep) and the sizes differ, unless both ratios are integers
    (then OpenCV averages integer blocks in integer arithmetic: already fast, and a different sum).
    """
    (sh, sw), (dh, dw) = src_hw, dst_hw
    if min(sh, sw, dh, dw) <= 0 or sh < dh or sw < dw or (sh, sw) == (dh, dw):
        return False
    scale_x, scale_y = 1.0 / (dw / sw), 1.0 / (dh / sh)
    eps = 2.220446049250313e-16  # DBL_EPSILON, as OpenCV's is_area_fast test
    integer = abs(scale_x - round(scale_x)) < eps and abs(scale_y - round(scale_y)) < eps
    return not integer


def _blocks(ssize: int, dsize: int, idx: np.ndarray, count: np.ndarray) -> tuple[int, int, int]:
    """(P, S, B): the most blocks ``B`` such that column ``P*b + p`` has the taps of ``p`` shifted by ``S*b``."""
    g = math.gcd(ssize, dsize)
    for blocks in sorted((d for d in range(1, g + 1) if g % d == 0), reverse=True):
        p, s = dsize // blocks, ssize // blocks
        if all(
            count[x] == count[x % p]
            and all(idx[x, k] - s * (x // p) == idx[x % p, k] for k in range(count[x]))
            for x in range(dsize)
        ) and all(0 <= idx[x, k] < s for x in range(p) for k in range(count[x])):
            return p, s, blocks
    return dsize, ssize, 1  # not reached: one block is always periodic


def _resize_kernel(
    src: Any,
    offs: Any,
    cnt: Any,
    wv: Any,
    yi: Any,
    yw: Any,
    yc: Any,
    t: Any,
    ring: Any,
    acc: Any,
    stage: Any,
    perm: Any,
    out: Any,
) -> None:  # pragma: no cover - compiled by numba; exercised through AreaResizer
    n_s = t.shape[0]
    b3 = wv.shape[2]
    n_b = b3 // 3
    dw = perm.shape[0]
    n_p = offs.shape[0]
    n_ring = ring.shape[0]
    dh = out.shape[0]
    n = acc.shape[0]
    done = -1  # the last source row whose horizontal sums are in the ring
    for dy in range(dh):
        for j in range(yc[dy]):
            r = yi[dy, j]
            if r <= done:
                continue
            # Horizontal pass of source row r: transpose it so every (phase, tap) is contiguous.
            row = src[r]
            # A pixel is moved as one unaligned 4-byte load and store (the 4th byte lands where the
            # next block's pixel goes, which is written after it; t has one spare byte): half the
            # time of three byte moves.  The last block goes byte by byte, so no read passes the row.
            for b in range(n_b - 1):
                for o in range(n_s):
                    _store4(t[o], 3 * b, _load4(row, 3 * (n_s * b + o)))
            b = n_b - 1
            for o in range(n_s):
                x = 3 * (n_s * b + o)
                t[o, 3 * b] = row[x]
                t[o, 3 * b + 1] = row[x + 1]
                t[o, 3 * b + 2] = row[x + 2]
            h = ring[r % n_ring]
            for p in range(n_p):
                base = p * b3
                tr = t[offs[p, 0]]
                w = wv[p, 0]
                for i in range(b3):
                    h[base + i] = np.float32(tr[i]) * w[i]
                for k in range(1, cnt[p]):
                    tr = t[offs[p, k]]
                    w = wv[p, k]
                    for i in range(b3):
                        h[base + i] = h[base + i] + np.float32(tr[i]) * w[i]
            done = r
        # Vertical pass: OpenCV's sum over this destination row's source rows, in order.
        beta = yw[dy, 0]
        h = ring[yi[dy, 0] % n_ring]
        for i in range(n):
            acc[i] = beta * h[i]
        for j in range(1, yc[dy]):
            beta = yw[dy, j]
            h = ring[yi[dy, j] % n_ring]
            for i in range(n):
                acc[i] = acc[i] + beta * h[i]
        # Round half to even and saturate (cvRound, saturate_cast<uchar>), vectorized: clamped to
        # 0..255 first (the same result), then adding 1.5 * 2**23 leaves no fraction bits in float32, so
        # the hardware rounds to the nearest integer, ties to even, and subtracting it back is exact.
        for i in range(n):
            v = min(max(acc[i], np.float32(0.0)), np.float32(255.0))
            v = (v + np.float32(12582912.0)) - np.float32(12582912.0)
            stage[i] = np.uint8(v)
        # stage is laid out (phase, block, channel): destination column dx = P*b + p is at perm[dx].
        # 4-byte moves in increasing dx (each spare byte is overwritten by the next pixel); the
        # last pixel byte by byte, so nothing is written past the row (a letterbox's bar).
        o_row = out[dy]
        for dx in range(dw - 1):
            _store4(o_row, 3 * dx, _load4(stage, perm[dx]))
        k = perm[dw - 1]
        o_row[3 * dw - 3] = stage[k]
        o_row[3 * dw - 2] = stage[k + 1]
        o_row[3 * dw - 1] = stage[k + 2]


# Unaligned 4-byte load and store at a byte offset of a unit-stride uint8 row (numba intrinsics,
# made by _kernel() with numba; plain LLVM loads and stores, so any CPU LLVM targets).
_load4: Any = None
_store4: Any = None


def _intrinsics() -> tuple[Any, Any]:
    from llvmlite import ir  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from numba import types
    from numba.extending import intrinsic

    i32p = ir.IntType(32).as_pointer()

    @intrinsic
    def load4(typingctx: Any, arr: Any, idx: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            value = builder.load(builder.bitcast(builder.gep(ary.data, [args[1]]), i32p))
            value.align = 1
            return value

        return types.uint32(arr, idx), codegen

    @intrinsic
    def store4(typingctx: Any, arr: Any, idx: Any, val: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            store = builder.store(args[2], builder.bitcast(builder.gep(ary.data, [args[1]]), i32p))
            store.align = 1
            return context.get_dummy_value()

        return types.void(arr, idx, val), codegen

    return load4, store4


@functools.cache
def _kernel() -> Any:
    """The kernel compiled once per process (explicit types: compiled here, never on a frame; no disk cache)."""
    try:
        import numba  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError as e:
        raise AreaResizeUnavailable(f"numba is not installed ({e}); pip install 'edgekit[fast]'") from e
    from numba import types

    global _load4, _store4
    _load4, _store4 = _intrinsics()  # globals of _resize_kernel, resolved when it compiles below
    u8, f32, i32 = types.uint8, types.float32, types.int32
    sig = types.void(
        u8[:, :],  # src (rows, width*3): a crop is a view (rows apart, pixels contiguous)
        i32[:, ::1],  # offs (P, taps)
        i32[::1],  # cnt (P,)
        f32[:, :, ::1],  # wv (P, taps, B*3)
        i32[:, ::1],  # yi (dh, taps)
        f32[:, ::1],  # yw
        i32[::1],  # yc
        u8[:, ::1],  # t (S, B*3 + 1)
        f32[:, ::1],  # ring (rows, dw*3)
        f32[::1],  # acc (dw*3,)
        u8[::1],  # stage (dw*3 + 1,)
        i32[::1],  # perm (dw,): where destination column dx is in stage
        u8[:, :],  # out (rows, width*3): a view too (letterbox writes inside a canvas)
    )
    # nogil: the frame loop's other threads run meanwhile; cache=False: nothing is loaded from disk.
    return numba.njit(sig, nogil=True, cache=False, boundscheck=False, fastmath=False)(_resize_kernel)


@functools.cache
def available() -> str | None:
    """None when the kernel compiles here, else why not (compiles it once a process: ~1 s)."""
    try:
        _kernel()
    except AreaResizeUnavailable as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - a numba that cannot compile here means cv2, never a failed frame loop
        return f"numba could not compile the kernel ({type(e).__name__}: {e})"
    return None


class AreaResizer:
    """``cv2.resize(src, (dst_w, dst_h), interpolation=INTER_AREA)`` for one size of 3-channel uint8 image, into ``out``.

    Raises ``AreaResizeUnavailable`` when built for sizes OpenCV does not resize by its generic
    area path, without numba, or when its result on a random image differs from ``cv2.resize``.
    """

    def __init__(self, src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> None:
        sh, sw = src_hw
        dh, dw = dst_hw
        if not opencv_takes_generic_area(src_hw, dst_hw):
            raise AreaResizeUnavailable(f"{sw}x{sh} -> {dw}x{dh} is not a non-integer INTER_AREA shrink")
        reason = available()
        if reason is not None:
            raise AreaResizeUnavailable(reason)
        self._kernel = _kernel()
        self.src_hw, self.dst_hw = (sh, sw), (dh, dw)
        xi, xw, xc = area_tab(sw, dw)
        yi, yw, yc = area_tab(sh, dh)
        n_p, n_s, n_b = _blocks(sw, dw, xi, xc)
        self.period = (n_p, n_s, n_b)
        taps = xi.shape[1]
        self._offs = np.ascontiguousarray(xi[:n_p] - 0, np.int32)
        self._cnt = np.ascontiguousarray(xc[:n_p], np.int32)
        # Per-block weights: column P*b + p's own (float32) weights, so that nothing depends on
        # the double-precision table being periodic to the last bit.
        wv = np.zeros((n_p, taps, n_b * 3), np.float32)
        for p in range(n_p):
            cols = p + n_p * np.arange(n_b)
            wv[p] = np.repeat(xw[cols].T, 3, axis=1)
        self._wv = wv
        self._yi, self._yw, self._yc = yi, yw, yc
        self._t = np.zeros((n_s, n_b * 3 + 1), np.uint8)
        # Source rows are consumed in order, each by at most two destination rows: a ring holds
        # the horizontal sums of the rows still needed (cache-resident, unlike all rows).
        self._ring = np.empty((yi.shape[1] + 1, dw * 3), np.float32)
        self._acc = np.empty(dw * 3, np.float32)
        self._stage = np.zeros(dw * 3 + 1, np.uint8)
        dx = np.arange(dw)
        self._perm = np.ascontiguousarray((dx % n_p) * (n_b * 3) + 3 * (dx // n_p), np.int32)
        self._out_rows = np.empty((dh, dw * 3), np.uint8)  # only for an ``out`` with odd strides
        self._self_check()

    def __call__(self, src: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Resize ``src`` (``src_hw`` x 3 uint8, any strides) into ``out`` (``dst_hw`` x 3 uint8, any strides)."""
        if (
            src.shape != (*self.src_hw, 3)
            or out.shape != (*self.dst_hw, 3)
            or src.dtype != out.dtype != np.uint8
        ):
            raise ValueError(f"AreaResizer for {self.src_hw} -> {self.dst_hw} got {src.shape} -> {out.shape}")
        rows = _pixel_rows(out)
        src_rows = _pixel_rows(src)  # once: a view made per frame costs tens of µs on a cold cache
        self._kernel(
            src_rows if src_rows is not None else np.ascontiguousarray(src).reshape(self.src_hw[0], -1),
            self._offs,
            self._cnt,
            self._wv,
            self._yi,
            self._yw,
            self._yc,
            self._t,
            self._ring,
            self._acc,
            self._stage,
            self._perm,
            rows if rows is not None else self._out_rows,
        )
        if rows is None:
            out[...] = self._out_rows.reshape(out.shape)
        return out

    def _self_check(self) -> None:
        import cv2

        (sh, sw), (dh, dw) = self.src_hw, self.dst_hw
        image = np.random.default_rng(sh * 100_003 + sw).integers(0, 256, (sh, sw, 3), np.uint8)
        want = cv2.resize(image, (dw, dh), interpolation=cv2.INTER_AREA)
        got = self(image, np.empty((dh, dw, 3), np.uint8))
        if not np.array_equal(got, want):
            differ = int(np.count_nonzero(got != want))
            raise AreaResizeUnavailable(
                f"{sw}x{sh} -> {dw}x{dh} differs from cv2.resize in {differ} values on this machine"
            )


def _pixel_rows(image: np.ndarray) -> np.ndarray | None:
    """``image`` (h, w, 3) as a (h, w*3) view, when its pixels are contiguous in each row (any crop of a frame)."""
    if image.strides[2] != 1 or image.strides[1] != 3:
        return None
    shape = (image.shape[0], image.shape[1] * 3)
    return np.lib.stride_tricks.as_strided(image, shape=shape, strides=(image.strides[0], 1))


def area_resizer(src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> AreaResizer | None:
    """An ``AreaResizer`` proven exact here for these sizes, or None (the reason logged once at INFO)."""
    try:
        return AreaResizer(src_hw, dst_hw)
    except AreaResizeUnavailable as e:
        log_once(str(e))
        return None
