"""The INT8 calibrator the TensorRT backend builds with: it only replays a calibration cache.

edgekit calibrates offline, at build time, from real images; on the device TensorRT reads
the scales from that cache and is given no data.
"""

from __future__ import annotations

from typing import Any


def _calibrator(trt: Any, cache: bytes) -> Any:
    """An INT8 calibrator that only replays a calibration cache (edgekit build made it from real data)."""
    # TensorRT ignores a cache whose header names another algorithm and would then try to calibrate
    # with no data, so the calibrator class must match the one that wrote the cache.
    header = cache.split(b"\n", 1)[0].decode(errors="replace")
    base = trt.IInt8EntropyCalibrator2
    if header.endswith("MinMaxCalibration"):
        base = trt.IInt8MinMaxCalibrator
    elif header.endswith("-EntropyCalibration"):
        base = trt.IInt8EntropyCalibrator

    class _CacheCalibrator(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            base.__init__(self)

        def get_batch_size(self) -> int:
            return 1

        def get_batch(self, names: Any, *args: Any) -> None:
            return None  # no data: everything comes from the cache

        def read_calibration_cache(self, *args: Any) -> bytes:
            return cache

        def write_calibration_cache(self, *args: Any) -> None:
            return None

    return _CacheCalibrator()
