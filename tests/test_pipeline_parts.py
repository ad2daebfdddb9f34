"""The pipeline's parts that need no model: the latency sketch, counters, the degrade controller, preprocessing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgekit.backends.base import Quantization, TensorSpec
from edgekit.core.sketch import LatencySketch
from edgekit.errors import EdgekitError, InputError, PipelineError
from edgekit.pipeline.policy import DegradeController, Policy
from edgekit.pipeline.records import Counters
from edgekit.processing.preprocessing import Preprocessor, PreprocessSpec, fit, preprocess
from edgekit.processing.tensors import to_input


def test_sketch_quantiles_are_within_one_percent_and_merge_exactly() -> None:
    rng = np.random.default_rng(7)
    a = rng.lognormal(mean=2.5, sigma=0.6, size=20_000)
    b = rng.lognormal(mean=3.5, sigma=0.3, size=5_000)
    sa, sb, sall = LatencySketch(), LatencySketch(), LatencySketch()
    sa.extend(a)
    sb.extend(b)
    sall.extend(np.concatenate([a, b]))
    sa.merge(sb)
    both = np.sort(np.concatenate([a, b]))
    for q in (0.5, 0.9, 0.99, 0.999):
        true = both[int(q * (len(both) - 1))]
        assert abs(sa.quantile(q) - true) / true <= 0.01 + 1e-9
        assert sa.quantile(q) == sall.quantile(q)  # merging is exact
    assert sa.count == 25_000 and sa.min == both[0] and sa.max == both[-1]
    assert sa.mean == pytest.approx(both.mean())


def test_sketch_round_trips_and_refuses_malformed_data() -> None:
    s = LatencySketch()
    s.extend([0.0, 1.0, 2.5, 40.0])
    back = LatencySketch.from_dict(s.to_dict())
    assert back.to_dict() == s.to_dict() and back.quantile(0.5) == s.quantile(0.5)
    assert math.isnan(LatencySketch().quantile(0.5))
    bad = s.to_dict() | {"count": 99}
    with pytest.raises(ValueError, match="add up"):
        LatencySketch.from_dict(bad)
    with pytest.raises(ValueError, match="not a latency sketch"):
        LatencySketch.from_dict({"accuracy": 0.01})
    with pytest.raises(ValueError, match="merge"):
        s.merge(LatencySketch(0.05))


def test_counters_only_go_up() -> None:
    c = Counters()
    c.add("missed", 2)
    c.raise_to("dropped", 5)
    c.raise_to("dropped", 3)  # a stale reading never lowers a counter
    assert (c.missed, c.dropped) == (2, 5)
    with pytest.raises(ValueError, match="only goes up"):
        c.add("frames", -1)


def test_policies_by_name_and_by_source() -> None:
    assert Policy.parse("degrade") is Policy.DEGRADE
    assert Policy.default_for(live=True) is Policy.DROP_OLDEST
    assert Policy.default_for(live=False) is Policy.BLOCK
    with pytest.raises(PipelineError) as err:
        Policy.parse("drop-newest")
    assert "drop-oldest, block, degrade" in err.value.hint


def feed(ctl: DegradeController, values: list[float]) -> list[tuple[int, int]]:
    """Feed latencies; return (frame number, new level) for every switch."""
    return [(i, lv) for i, v in enumerate(values) if (lv := ctl.observe(v)) is not None]


def test_degrade_steps_down_after_n_frames_over_budget() -> None:
    # given a primary at 40 ms and an int8 level at 12 ms, a 33 ms budget, window 10, after 5
    ctl = DegradeController(33.0, [40.0, 12.0], window=10, after=5, recover_after=20)
    # when every frame takes 45 ms
    switches = feed(ctl, [45.0] * 30)
    # then it steps down once, when the window is full and 5 frames in a row were over: frame 9 + 4
    assert switches == [(13, 1)] and ctl.switches == 1


def test_degrade_does_not_return_to_a_level_predicted_not_to_fit() -> None:
    ctl = DegradeController(33.0, [40.0, 12.0], window=10, after=5, recover_after=20)
    feed(ctl, [45.0] * 14)
    # 13 ms on int8 predicts 13 * 40/12 = 43 ms on the primary: over budget, so stay.
    assert feed(ctl, [13.0] * 200) == []


def test_degrade_returns_when_the_slower_level_would_fit_with_headroom() -> None:
    ctl = DegradeController(33.0, [40.0, 12.0], window=10, after=5, recover_after=20)
    feed(ctl, [45.0] * 14)
    # The load went away: 6 ms on int8 predicts 20 ms on the primary (< 0.8 x 33).
    back = feed(ctl, [6.0] * 40)
    assert back == [(28, 0)] and ctl.level == 0 and ctl.switches == 2


def test_degrade_backs_off_when_a_recovery_does_not_hold() -> None:
    ctl = DegradeController(33.0, [40.0, 12.0], window=10, after=5, recover_after=20)
    feed(ctl, [45.0] * 14)
    feed(ctl, [6.0] * 29)  # recovered to level 0
    assert ctl.level == 0
    feed(ctl, [45.0] * 14)  # over budget again at once: down again, recover_after doubles
    assert ctl.level == 1
    assert feed(ctl, [6.0] * 29) == []  # 20 frames are no longer enough
    assert feed(ctl, [6.0] * 20) != []


def test_degrade_with_nowhere_to_go_stays() -> None:
    ctl = DegradeController(33.0, [40.0], window=5, after=2)
    assert feed(ctl, [100.0] * 50) == [] and ctl.level == 0


SPEC = PreprocessSpec((224, 224), (127.0, 127.0, 127.0), (128.0, 128.0, 128.0))


@pytest.mark.parametrize(
    ("tensor", "tolerance"),
    [
        (TensorSpec("x", (1, 3, 224, 224), "float32"), 0.0),
        (TensorSpec("x", (1, 224, 224, 3), "float32"), 0.0),
        (TensorSpec("x", (1, 224, 224, 3), "int8", Quantization(0.0078125, -1)), 1.0),
        (TensorSpec("x", (1, 224, 224, 3), "uint8", Quantization(0.0079, 128)), 1.0),
        (TensorSpec("x", (1, 3, 224, 224), "int8", Quantization(0.0078125, -1)), 1.0),
    ],
)
@pytest.mark.parametrize("size", [(480, 640), (300, 451), (224, 224), (120, 90)])
@pytest.mark.parametrize("color", ["BGR", "RGB"])
def test_preprocessor_gives_the_reference_numbers_in_the_sessions_dtype(
    tensor: TensorSpec, tolerance: float, size: tuple[int, int], color: str
) -> None:
    img = np.random.default_rng(1).integers(0, 256, (*size, 3), dtype=np.uint8)
    prep = Preprocessor(SPEC, tensor, image_color=color)
    prep(255 - img)  # the buffers are reused: nothing of an earlier frame may show through
    got = prep(img)
    want = to_input(preprocess(img, SPEC, image_color=color), tensor)
    assert got.dtype == want.dtype and got.shape == want.shape
    # float: identical; quantized: at most one step where rounding meets a .5
    assert np.abs(got.astype(np.float64) - want.astype(np.float64)).max() <= tolerance + 1e-6


def test_preprocessor_reuses_its_buffer_and_refuses_a_mismatched_input() -> None:
    prep = Preprocessor(SPEC, TensorSpec("x", (1, 3, 224, 224), "float32"))
    a = prep(np.zeros((10, 10, 3), np.uint8))
    b = prep(np.full((10, 10, 3), 255, np.uint8))
    assert a is b  # no allocation per frame
    with pytest.raises(InputError, match="does not match"):
        Preprocessor(SPEC, TensorSpec("x", (1, 3, 256, 256), "float32"))


def test_box2_linear_interpolation_is_recorded_and_matches_its_definition() -> None:
    from dataclasses import replace

    import cv2

    fast = replace(SPEC, interpolation="box2-linear")
    assert "interpolation" not in SPEC.to_dict()  # the default is not written: old readers stay happy
    assert PreprocessSpec.from_dict(fast.to_dict()) == fast
    with pytest.raises(EdgekitError, match="interpolation"):
        replace(SPEC, interpolation="cubic")
    img = np.random.default_rng(2).integers(0, 256, (481, 641, 3), dtype=np.uint8)
    crop = img[:, 80:561]  # the centred 481x481 square of a 481x641 frame
    halved = cv2.resize(crop[:480, :480], (240, 240), interpolation=cv2.INTER_AREA)
    want = cv2.resize(halved, (224, 224), interpolation=cv2.INTER_LINEAR)
    assert np.array_equal(fit(img, fast), want)
    assert not np.array_equal(fit(img, SPEC), want)  # a different filter: a bundle must say which
    tensor = TensorSpec("x", (1, 3, 224, 224), "float32")
    got = Preprocessor(fast, tensor, image_color="BGR")(img)
    assert np.array_equal(got, to_input(preprocess(img, fast, image_color="BGR"), tensor))
