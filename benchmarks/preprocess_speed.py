"""Preprocessing resize speed: cv2.resize INTER_AREA vs the bit-exact AreaResizer, side by side, one core.

The frame loop's model input must equal the build's ``fit()`` (``cv2.resize``, INTER_AREA) bit
for bit; ``edgekit.processing.area_resize`` does OpenCV's arithmetic in a layout that vectorizes.
For each frame size, the center crop ``fit()`` takes is resized to 224x224 by both, in
alternating rounds (a slow phase of the machine weighs on both alike), and every output is
compared.  Goal: identical bytes, and the fast one at most 0.25 ms for 640x480 (one core).

    .venv/bin/python -m benchmarks.preprocess_speed [--rounds 5] [--reps 200] [--json]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from benchmarks._harness import parse, parser, print_json, progress_on_stderr, run, verdict
from edgekit.core.stats import median

FRAMES = [(480, 640), (720, 1280), (1080, 1920)]
TARGET = (224, 224)
GOAL_US = 250.0  # 640x480 -> 224x224 on one core


def _median_us(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return median(times)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, json_flag=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=200, help="calls per round and method")
    args = parse(ap, argv)

    import cv2
    import numpy as np

    from edgekit.processing.area_resize import AreaResizer, available
    from edgekit.processing.preprocessing import PreprocessSpec, placement

    area = cv2.INTER_AREA
    cv2.setNumThreads(1)  # one core, as the frame loop's preprocessing runs
    spec = PreprocessSpec(TARGET, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    rows: list[dict[str, Any]] = []
    with progress_on_stderr(args.json):
        t0 = time.perf_counter()
        reason = available()
        if reason is not None:
            print(f"the fast resize is not available here: {reason}")
            return 1
        print(f"numba kernel compiled in {time.perf_counter() - t0:.2f} s (once a process)")
        rng = np.random.default_rng(0)
        for fh, fw in FRAMES:
            (x, y, w, h), _ = placement(spec, fh, fw)
            frame = rng.integers(0, 256, (fh, fw, 3), np.uint8)
            crop = frame[y : y + h, x : x + w]  # a view, as fit() resizes it
            resizer = AreaResizer((h, w), TARGET)  # checks itself against cv2.resize
            a = np.empty((*TARGET, 3), np.uint8)
            b = np.empty((*TARGET, 3), np.uint8)
            exact = True
            slow: list[float] = []
            fast: list[float] = []
            for _ in range(args.rounds):
                frame[:] = rng.integers(0, 256, frame.shape, np.uint8)
                cv2.resize(crop, TARGET[::-1], dst=a, interpolation=cv2.INTER_AREA)
                resizer(crop, b)
                exact = exact and bool(np.array_equal(a, b))
                slow.append(
                    _median_us(partial(cv2.resize, crop, TARGET[::-1], dst=a, interpolation=area), args.reps)
                )
                fast.append(_median_us(partial(resizer, crop, b), args.reps))
            row = {
                "frame": f"{fw}x{fh}",
                "crop": f"{w}x{h}",
                "period": list(resizer.period),
                "cv2_us": round(median(slow), 1),
                "fast_us": round(median(fast), 1),
                "speedup": round(median(slow) / median(fast), 2),
                "bit_exact": exact,
            }
            rows.append(row)
            print(
                f"{row['frame']:>9} crop {row['crop']:>9} -> 224x224: cv2 {row['cv2_us']:7.1f} us  "
                f"fast {row['fast_us']:7.1f} us  x{row['speedup']:.2f}  bit-exact {exact}"
            )
        met = all(r["bit_exact"] for r in rows) and rows[0]["fast_us"] <= GOAL_US
        print(f"goal: identical bytes everywhere, 640x480 at most {GOAL_US:g} us: {verdict(met)}")
    if args.json:
        print_json({"target": list(TARGET), "goal_us": GOAL_US, "rows": rows, "met": met})
    return 0 if all(r["bit_exact"] for r in rows) else 1


if __name__ == "__main__":
    run(main)
