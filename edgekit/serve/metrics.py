"""``/metrics``: the server's requests by outcome and its latency per stage, Prometheus text format 0.0.4.

- ``edgekit_serve_requests_total{model,protocol,outcome}``: every infer request, by how it
  ended (``ok``, ``invalid``, ``too_large``, ``busy``, ``deadline``, ``failed``, ...);
- ``edgekit_serve_stage_seconds{model,stage}``: a histogram per stage: ``queue`` (waiting for
  the worker), ``decode`` (an image's file or tensor into a frame), ``preprocess``, ``infer``,
  ``postprocess`` and ``request`` (the server's whole time: read, decode, queue, run, encode);
- ``edgekit_serve_queue_depth`` and ``edgekit_serve_queue_capacity``;
- ``edgekit_serve_inferences_total`` and ``edgekit_serve_batched_requests_total``: the model's
  inferences and the requests they answered (their ratio: the mean batch).
- ``edgekit_serve_camera_frames_total`` and ``edgekit_serve_shared_inferences_total``: camera
  frames of a pipeline sharing the model (``edgekit.serve.frames``), and the inferences that held
  frames and requests together.

Exact counts (the server sees every request), fixed buckets from 0.25 ms to 10 s.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BUCKETS = (0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STAGES = ("queue", "decode", "preprocess", "infer", "postprocess", "request")


class _Histogram:
    __slots__ = ("buckets", "count", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * (len(BUCKETS) + 1)  # the last: above every edge
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.count += 1
        self.sum += seconds


class ServeMetrics:
    """Counters and histograms, thread-safe; ``render()`` is the scrape."""

    def __init__(self, queue_depth: Callable[[], int] = lambda: 0, queue_capacity: int = 0) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, str], int] = defaultdict(int)
        self._stages: dict[tuple[str, str], _Histogram] = {}
        self.queue_depth = queue_depth
        self.queue_capacity = queue_capacity
        #: (inferences, requests they answered) so far.
        self.inferences: Callable[[], tuple[int, int]] = lambda: (0, 0)
        #: (camera frames inferred, inferences that held both frames and requests) so far.
        self.sharing: Callable[[], tuple[int, int]] = lambda: (0, 0)

    def request(self, model: str, protocol: str, outcome: str) -> None:
        with self._lock:
            self._requests[(model, protocol, outcome)] += 1

    def stages(self, model: str, stages: Mapping[str, float]) -> None:
        with self._lock:
            for stage, seconds in stages.items():
                self._observe(model, stage, seconds)

    def _observe(self, model: str, stage: str, seconds: float) -> None:
        hist = self._stages.get((model, stage))
        if hist is None:
            hist = self._stages[(model, stage)] = _Histogram()
        hist.observe(seconds)

    def requests(self) -> dict[tuple[str, str, str], int]:
        with self._lock:
            return dict(self._requests)

    def render(self) -> str:
        lines = [
            "# HELP edgekit_serve_requests_total Inference requests by model, protocol and outcome.",
            "# TYPE edgekit_serve_requests_total counter",
        ]
        with self._lock:
            for (model, protocol, outcome), n in sorted(self._requests.items()):
                labels = f'model="{_esc(model)}",protocol="{protocol}",outcome="{outcome}"'
                lines.append(f"edgekit_serve_requests_total{{{labels}}} {n}")
            lines += [
                "# HELP edgekit_serve_stage_seconds Server-side latency per stage of an inference request.",
                "# TYPE edgekit_serve_stage_seconds histogram",
            ]
            for (model, stage), hist in sorted(self._stages.items()):
                base = f'model="{_esc(model)}",stage="{stage}"'
                running = 0
                for edge, n in zip((*BUCKETS, float("inf")), hist.buckets, strict=True):
                    running += n
                    le = "+Inf" if edge == float("inf") else repr(edge)
                    lines.append(f'edgekit_serve_stage_seconds_bucket{{{base},le="{le}"}} {running}')
                lines.append(f"edgekit_serve_stage_seconds_sum{{{base}}} {hist.sum!r}")
                lines.append(f"edgekit_serve_stage_seconds_count{{{base}}} {hist.count}")
        lines += [
            "# HELP edgekit_serve_queue_depth Requests (and camera frames) waiting for the inference worker now.",
            "# TYPE edgekit_serve_queue_depth gauge",
            f"edgekit_serve_queue_depth {self.queue_depth()}",
            "# HELP edgekit_serve_queue_capacity Requests the queue holds before answering 429.",
            "# TYPE edgekit_serve_queue_capacity gauge",
            f"edgekit_serve_queue_capacity {self.queue_capacity}",
        ]
        inferences, answered = self.inferences()
        lines += [
            "# HELP edgekit_serve_inferences_total Inferences run on the model, each one request or a batch.",
            "# TYPE edgekit_serve_inferences_total counter",
            f"edgekit_serve_inferences_total {inferences}",
            "# HELP edgekit_serve_batched_requests_total Requests those inferences answered.",
            "# TYPE edgekit_serve_batched_requests_total counter",
            f"edgekit_serve_batched_requests_total {answered}",
        ]
        frames, shared = self.sharing()
        lines += [
            "# HELP edgekit_serve_camera_frames_total Camera frames inferred on the model (shared with a pipeline).",
            "# TYPE edgekit_serve_camera_frames_total counter",
            f"edgekit_serve_camera_frames_total {frames}",
            "# HELP edgekit_serve_shared_inferences_total Inferences that held camera frames and requests together.",
            "# TYPE edgekit_serve_shared_inferences_total counter",
            f"edgekit_serve_shared_inferences_total {shared}",
        ]
        return "\n".join(lines) + "\n"


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
