"""An image request's picture: JPEG or PNG bytes, its size read from its header before it is decoded.

The size comes from the header (PNG's IHDR, JPEG's first start-of-frame marker) so that a
small file claiming a huge picture is refused before OpenCV allocates it; the decoded picture
must then have that very size.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from edgekit.serve.outcomes import Outcome, ProtocolError

if TYPE_CHECKING:
    import numpy as np

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (baseline, progressive, lossless...); not DHT (C4), JPG (C8), DAC (CC).
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's or JPEG's header; ProtocolError for anything else."""
    if data.startswith(PNG_MAGIC) and len(data) >= 24 and data[12:16] == b"IHDR":
        w, h = struct.unpack(">II", data[16:24])
        return w, h
    if data.startswith(b"\xff\xd8"):
        at = 2
        while at + 4 <= len(data):
            if data[at] != 0xFF:
                break
            marker = data[at + 1]
            if marker == 0xFF:  # fill byte
                at += 1
                continue
            if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
                at += 2
                continue
            (length,) = struct.unpack(">H", data[at + 2 : at + 4])
            if marker in _SOF and at + 9 <= len(data):
                h, w = struct.unpack(">HH", data[at + 5 : at + 9])
                return w, h
            at += 2 + length
        raise ProtocolError("IMAGE: a JPEG without a readable frame header")
    raise ProtocolError("IMAGE: not a JPEG or PNG file (send its bytes, or a UINT8 HxWx3 BGR tensor)")


def check_pixels(width: int, height: int, cap: int) -> None:
    if width * height > cap:
        raise ProtocolError(
            f"IMAGE: {width}x{height} is {width * height:,} pixels, over this server's {cap:,}",
            Outcome.TOO_LARGE,
        )
    if width == 0 or height == 0:
        raise ProtocolError(f"IMAGE: {width}x{height} has no pixels")


def decode(data: bytes, cap: int) -> np.ndarray:
    """JPEG/PNG bytes -> BGR uint8 HxWx3, refused over ``cap`` pixels before decoding."""
    import cv2
    import numpy as np

    width, height = image_size(data)
    check_pixels(width, height, cap)
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None or image.shape[:2] != (height, width):
        raise ProtocolError(f"IMAGE: its {width}x{height} picture does not decode")
    return image
