"""What one request may ask of the server: its size, its tensors' elements, its image's pixels, its wait.

Each cap is checked before the work it bounds: the body's size before it is read (and while
it is read, for a body without a length), a tensor's element count before its data is
converted, an image's pixels from its header before it is decoded.  A request over a cap is
answered 413 (gRPC ``RESOURCE_EXHAUSTED``) and never reaches the model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    #: A request body (HTTP) or message (gRPC), in bytes: a 4K frame as raw FP32 is ~100 MB.
    max_request_bytes: int = 64 * 1024 * 1024
    #: Elements of one input tensor (a 1x3x224x224 input is 150,528).
    max_elements: int = 16 * 1024 * 1024
    #: Pixels of one decoded image (a 4K frame is 8.3 M).
    max_image_pixels: int = 40_000_000
    #: Requests waiting for the inference worker; one more is answered 429 at once.
    queue_size: int = 16
    #: How long a request may wait and run before it is answered with an error instead of computed.
    deadline_s: float = 10.0
    #: The most labels an image request may ask for (``top_k``).
    max_top_k: int = 100
