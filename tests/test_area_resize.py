"""The fast INTER_AREA resize: OpenCV's arithmetic exactly, used by the Preprocessor only where proven, else cv2."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from dataclasses import replace

import cv2
import numpy as np
import pytest

from edgekit.backends.base import Quantization, TensorSpec
from edgekit.processing import area_resize
from edgekit.processing.area_resize import (
    AreaResizer,
    AreaResizeUnavailable,
    area_tab,
    opencv_takes_generic_area,
)
from edgekit.processing.preprocessing import Preprocessor, PreprocessSpec, placement, preprocess
from edgekit.processing.tensors import to_input

pytest.importorskip("numba")

SPEC = PreprocessSpec((224, 224), (127.0, 127.0, 127.0), (128.0, 128.0, 128.0))
FLOAT_NCHW = TensorSpec("x", (1, 3, 224, 224), "float32")


def emulate_opencv(src: np.ndarray, dst_hw: tuple[int, int]) -> np.ndarray:
    """OpenCV's generic area resize written out in numpy float32, one rounded operation at a time, in its order."""
    (sh, sw), (dh, dw) = src.shape[:2], dst_hw
    xi, xw, xc = area_tab(sw, dw)
    yi, yw, yc = area_tab(sh, dh)
    f = src.astype(np.float32)
    h = f[:, xi[:, 0], :] * xw[None, :, 0, None]
    for k in range(1, xi.shape[1]):
        more = h + f[:, xi[:, k], :] * xw[None, :, k, None]
        h = np.where((k < xc)[None, :, None], more, h)
    v = yw[:, 0, None, None] * h[yi[:, 0]]
    for j in range(1, yi.shape[1]):
        more = v + yw[:, j, None, None] * h[yi[:, j]]
        v = np.where((j < yc)[:, None, None], more, v)
    return np.clip(np.rint(v), 0, 255).astype(np.uint8)


def exact_here() -> bool:
    """Whether this machine's cv2.resize is OpenCV's arithmetic unfused (else AreaResizer refuses, by design)."""
    try:
        AreaResizer((480, 480), (224, 224))
    except AreaResizeUnavailable:
        return False
    return True


needs_exact = pytest.mark.skipif(
    not exact_here(), reason="this OpenCV build's INTER_AREA differs from its unfused arithmetic (e.g. FMA)"
)

SIZES = [
    ((480, 480), (224, 224)),  # the frame loop's: 640x480 center-crop, ratio 15/7
    ((720, 720), (224, 224)),  # 1280x720, 45/14
    ((1080, 1080), (224, 224)),  # 1920x1080, 135/28
    ((480, 640), (128, 96)),  # different ratios per axis
    ((301, 457), (224, 224)),  # odd, 301/224 has no common factor
    ((480, 640), (320, 320)),  # 3/2 and 2/1: not both integers
    ((225, 224), (224, 224)),  # one axis kept (ratio 1)
]


@pytest.mark.parametrize(("src_hw", "dst_hw"), SIZES)
def test_kernel_is_opencvs_arithmetic_in_opencvs_order(
    src_hw: tuple[int, int], dst_hw: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    img = np.random.default_rng(3).integers(0, 256, (*src_hw, 3), np.uint8)
    # Built without its check against cv2 (which depends on how this machine's OpenCV was compiled):
    # the kernel against the arithmetic it implements, which no machine changes.
    monkeypatch.setattr(AreaResizer, "_self_check", lambda self: None)
    r = AreaResizer(src_hw, dst_hw)
    out = np.full((*dst_hw, 3), 7, np.uint8)
    assert np.array_equal(r(img, out), emulate_opencv(img, dst_hw))
    # Extremes: all white stays 255 (sums of weights round to 255), all black 0.
    assert (r(np.full_like(img, 255), out) == 255).all()
    assert (r(np.zeros_like(img), out) == 0).all()


@needs_exact
@pytest.mark.parametrize(("src_hw", "dst_hw"), SIZES)
def test_equals_cv2_on_crops_and_into_views(src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> None:
    sh, sw = src_hw
    frame = np.random.default_rng(4).integers(0, 256, (sh + 10, sw + 31, 3), np.uint8)
    crop = frame[3 : 3 + sh, 17 : 17 + sw]  # a view: rows apart, like a center crop
    canvas = np.zeros((dst_hw[0] + 4, dst_hw[1] + 6, 3), np.uint8)
    inner = canvas[2:-2, 3:-3]  # a view, like the letterbox's inside
    AreaResizer(src_hw, dst_hw)(crop, inner)
    assert np.array_equal(inner, cv2.resize(crop, dst_hw[::-1], interpolation=cv2.INTER_AREA))
    inner[...] = 0
    # Nothing written outside ``out`` (its last pixel's spare byte would land in the next one).
    assert not canvas.any()


@needs_exact
def test_odd_strides_are_copied_not_misread() -> None:
    frame = np.random.default_rng(8).integers(0, 256, (480, 640, 3), np.uint8)
    crop = frame[:, 80:560, ::-1]  # channel-reversed view: pixels are not contiguous bytes
    out = np.zeros((224, 224, 3), np.uint8)[..., ::-1]
    AreaResizer((480, 480), (224, 224))(crop, out)
    assert np.array_equal(
        out, cv2.resize(np.ascontiguousarray(crop), (224, 224), interpolation=cv2.INTER_AREA)
    )
    with pytest.raises(ValueError, match="got"):
        AreaResizer((480, 480), (224, 224))(crop[1:], out)


@pytest.mark.parametrize(
    ("src_hw", "dst_hw"),
    [((224, 224), (224, 224)), ((200, 300), (224, 224)), ((448, 448), (224, 224)), ((480, 640), (240, 320))],
)
def test_only_opencvs_generic_area_shrink_is_taken(src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> None:
    # Same size: a copy; an upscale: not area at all; integer ratios: OpenCV's integer block mean.
    assert not opencv_takes_generic_area(src_hw, dst_hw)
    with pytest.raises(AreaResizeUnavailable, match="not a non-integer INTER_AREA shrink"):
        AreaResizer(src_hw, dst_hw)


def test_area_tab_is_opencvs_table_for_15_over_7() -> None:
    idx, weight, count = area_tab(480, 224)
    # Destination 0 covers source [0, 15/7): 1, 1, 1/7 of a pixel, over 15/7.
    assert list(idx[0, : count[0]]) == [0, 1, 2]
    assert np.allclose(weight[0, : count[0]], [7 / 15, 7 / 15, 1 / 15], atol=1e-7)
    assert count.sum() == len({(d, s) for d in range(224) for s in idx[d, : count[d]]})
    assert np.allclose([weight[d, : count[d]].sum() for d in range(224)], 1.0, atol=1e-6)


FRAMES = [(480, 640), (720, 1280), (1080, 1920), (301, 457), (481, 641), (120, 90), (224, 224)]


@needs_exact
@pytest.mark.parametrize("resize", ["center-crop", "squash", "letterbox"])
@pytest.mark.parametrize(
    "tensor",
    [FLOAT_NCHW, TensorSpec("x", (1, 224, 224, 3), "int8", Quantization(0.0078125, -1))],
)
def test_preprocessor_fast_path_equals_the_reference_for_every_frame_size(
    resize: str, tensor: TensorSpec
) -> None:
    spec = replace(SPEC, resize=resize)
    prep = Preprocessor(spec, tensor, image_color="BGR")
    rng = np.random.default_rng(5)
    for size in [*FRAMES, FRAMES[0]]:  # sizes change mid-stream, and back
        img = rng.integers(0, 256, (*size, 3), np.uint8)
        prep(255 - img)  # an earlier frame must not show through (the letterbox's bars included)
        got = prep(img)
        want = to_input(preprocess(img, spec, image_color="BGR"), tensor)
        assert np.array_equal(got, want), (resize, size)
        (_, _, sw, sh), (_, _, dw, dh) = placement(spec, *size)
        fast = opencv_takes_generic_area((sh, sw), (dh, dw))
        # The fast resizer exactly where fit() would run OpenCV's generic area path: never for an
        # upscale (120x90), a frame already the input's size, or an integer ratio.
        assert (prep._area_resizer is not None) == fast, (resize, size)
        if fast:
            assert prep._area_resizer is not None and prep._area_resizer.src_hw == (sh, sw)


@pytest.fixture
def fresh_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(area_resize, "_logged", set())
    yield


@pytest.mark.usefixtures("fresh_logs")
def test_a_resizer_that_disagrees_with_cv2_is_not_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = AreaResizer.__call__

    def off_by_one(self: AreaResizer, src: np.ndarray, out: np.ndarray) -> np.ndarray:
        real(self, src, out)
        out[0, 0, 0] ^= 1
        return out

    monkeypatch.setattr(AreaResizer, "__call__", off_by_one)
    prep = Preprocessor(SPEC, FLOAT_NCHW, image_color="BGR")
    img = np.random.default_rng(6).integers(0, 256, (480, 640, 3), np.uint8)
    with caplog.at_level(logging.INFO, logger=area_resize.__name__):
        got = prep(img)
        prep(img)
    assert prep._area and prep._area_resizer is None  # numba is fine; this size failed its check
    assert np.array_equal(got, to_input(preprocess(img, SPEC, image_color="BGR"), FLOAT_NCHW))
    said = [m for m in caplog.messages if "differs from cv2.resize in 1 values" in m]
    assert len(said) == 1  # once, however many frames


@pytest.mark.usefixtures("fresh_logs")
def test_without_numba_the_preprocessor_uses_cv2(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba -> ImportError
    area_resize.available.cache_clear()
    area_resize._kernel.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger=area_resize.__name__):
            prep = Preprocessor(SPEC, FLOAT_NCHW, image_color="BGR")
            Preprocessor(SPEC, FLOAT_NCHW, image_color="BGR")
        img = np.random.default_rng(7).integers(0, 256, (480, 640, 3), np.uint8)
        got = prep(img)
        assert not prep._area and prep._area_resizer is None
        assert np.array_equal(got, to_input(preprocess(img, SPEC, image_color="BGR"), FLOAT_NCHW))
        assert [m for m in caplog.messages if "numba is not installed" in m and "edgekit[fast]" in m] != []
        assert len([m for m in caplog.messages if "numba" in m]) == 1
        with pytest.raises(AreaResizeUnavailable, match="numba is not installed"):
            AreaResizer((480, 480), (224, 224))
    finally:
        area_resize.available.cache_clear()
        area_resize._kernel.cache_clear()


def test_box2_linear_never_takes_the_area_resizer() -> None:
    prep = Preprocessor(replace(SPEC, interpolation="box2-linear"), FLOAT_NCHW)
    prep(np.zeros((480, 640, 3), np.uint8))
    assert not prep._area and prep._area_resizer is None
