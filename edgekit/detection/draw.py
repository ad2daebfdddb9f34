"""Boxes, labels and scores drawn into a copy of a frame: what the preview streams and event proofs keep.

They are drawn into the JPEG itself rather than over it in the page, so every frame of the
stream carries the boxes of exactly that frame (an overlay fetched beside the stream would
lag it), and any MJPEG client (VLC, ffplay, an ``<img>``) shows them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from edgekit.detection.detector import Box, Detection

# BGR, by class id (cycled).  Saturated primaries-and-mixes that photographs rarely contain, so a
# box stands out (and a test can find it in a screenshot); class 0 is the conventional green.
BOX_COLOURS: tuple[tuple[int, int, int], ...] = (
    (0, 255, 0),
    (255, 0, 255),
    (255, 255, 0),
    (0, 128, 255),
    (255, 0, 0),
    (0, 0, 255),
)
KEYPOINT_COLOUR = (0, 255, 255)  # yellow: landmarks are not box edges
HIGHLIGHT_COLOUR = (255, 255, 255)  # white: the box an event is about, drawn just outside its edges


def colour_of(class_id: int) -> tuple[int, int, int]:
    """The BGR colour of class ``class_id``'s boxes."""
    return BOX_COLOURS[class_id % len(BOX_COLOURS)]


def line_width(frame_hw: tuple[int, int]) -> int:
    """Box line width in pixels: visible in a 320-pixel thumbnail and a 4K frame alike."""
    return max(2, round(max(frame_hw) / 320))


def draw_detections(
    frame: np.ndarray, detections: Sequence[Detection], *, highlight: Box | None = None
) -> np.ndarray:
    """A copy of ``frame`` (BGR) with each detection's box, ``name score`` label and keypoints drawn.

    ``highlight``: a box (an event's) framed in :data:`HIGHLIGHT_COLOUR` just outside its edges,
    so a detection drawn on the same box keeps its class colour.
    """
    import cv2

    out: np.ndarray = frame.copy()  # the frame belongs to the pipeline and its other sinks
    h, w = out.shape[:2]
    thick = line_width((h, w))
    scale = 0.4 * thick
    for det in reversed(detections):  # best last, so it is drawn on top
        colour = colour_of(det.class_id)
        x0, y0, x1, y1 = (round(v) for v in det.box)
        cv2.rectangle(out, (x0, y0), (x1, y1), colour, thick)
        for kx, ky in det.keypoints:
            cv2.circle(out, (round(kx), round(ky)), thick, KEYPOINT_COLOUR, -1)
        text = f"{det.name} {det.score:.2f}"
        (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
        # Above the box's top edge when there is room, else just below it: never over the edge.
        label_h = th + base + thick
        top = y0 - thick - label_h if y0 - thick - label_h >= 0 else y0 + thick
        # Text in the box's colour on black: legible on any picture, and no block of the box's
        # colour that could be taken for an edge.
        cv2.rectangle(out, (x0, top), (x0 + tw + 2 * thick, top + label_h), (0, 0, 0), -1)
        cv2.putText(
            out,
            text,
            (x0 + thick, top + th + thick // 2),
            cv2.FONT_HERSHEY_SIMPLEX,
            scale,
            colour,
            1,
            cv2.LINE_AA,
        )
    if highlight is not None:
        x0, y0, x1, y1 = (round(v) for v in highlight)
        pad = 2 * thick  # outside the class-coloured line, which is centred on the box edge
        cv2.rectangle(out, (x0 - pad, y0 - pad), (x1 + pad, y1 + pad), HIGHLIGHT_COLOUR, thick)
    return out
