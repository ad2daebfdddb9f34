"""top_k, TopK and output_top_k: the same labels as the first top_k, on every kind of output row.

"The same" is exact: ids in the same order (ties: lower id first), names, and probabilities
bit for bit (``Label`` equality compares the floats with ``==``).  The first ``top_k`` is
kept as ``_top_k_plain``; a plain reference (a full sort, a float64 softmax) checks that it,
and so the new code, ranks as documented.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgekit.backends.base import Quantization, TensorSpec
from edgekit.processing.postprocess import Label, TopK, _top_k_plain, top_k
from edgekit.processing.tensors import from_output, output_top_k

NAMES = [f"name {i}" for i in range(900)]  # fewer than 1000 classes: "class N" for the rest


def reference(row: np.ndarray, k: int) -> list[tuple[int, float]]:
    """(id, probability) of the k best: a full stable sort, a float64 softmax."""
    values = row.astype(np.float64)
    order = sorted(range(values.size), key=lambda i: (-values[i], i))[: max(k, 0)]
    e = np.exp(values - values.max())
    p = e / e.sum()
    return [(i, float(p[i])) for i in order]


def rows(rng: np.random.Generator, n: int, count: int) -> list[np.ndarray]:
    made = []
    for j in range(count):
        row = (rng.standard_normal(n) * 3).astype(np.float32)
        if j % 3 == 1:  # many ties, across the k-th place too
            row = np.round(row).astype(np.float32)
        if j % 3 == 2:
            row = (np.round(row * 4) / 4).astype(np.float32)
        made.append(row)
    return made


@pytest.mark.parametrize("k", [0, -1, 1, 2, 5, 999, 1000, 1003])
def test_top_k_is_the_first_top_k_and_the_reference(k: int) -> None:
    rng = np.random.default_rng(k + 7)
    reused = TopK(NAMES, k)
    for row in rows(rng, 1000, 24):
        want = _top_k_plain(row, NAMES, k, logits=True)
        assert top_k(row, NAMES, k) == want
        assert reused(row) == want  # the same object, its buffers reused, frame after frame
        assert top_k(row, NAMES, k, logits=False) == _top_k_plain(row, NAMES, k, logits=False)
        ref = reference(row, k)
        assert [lab.id for lab in want] == [i for i, _ in ref]
        assert [lab.name for lab in want] == [NAMES[i] if i < 900 else f"class {i}" for i, _ in ref]
        np.testing.assert_allclose([lab.score for lab in want], [p for _, p in ref], rtol=1e-12, atol=1e-15)


def test_ties_go_to_the_lower_id_inside_and_across_the_cut() -> None:
    row = np.array([1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.5, 3.0], np.float32)
    for k in (1, 2, 3, 4, 5):
        got = top_k(row, [], k)
        assert [lab.id for lab in got] == [1, 3, 7, 2, 4][:k]
        assert got == _top_k_plain(row, [], k, logits=True)
    assert [lab.name for lab in top_k(row, ["a", "b"], 2)] == ["b", "class 3"]
    assert top_k(np.zeros(6, np.float32), [], 3) == _top_k_plain(np.zeros(6, np.float32), [], 3, logits=True)
    assert [lab.id for lab in top_k(np.zeros(6, np.float32), [], 3)] == [0, 1, 2]


def test_k_beyond_the_classes_zero_and_empty_rows() -> None:
    row = np.array([0.2, -1.0, 4.0], np.float32)
    assert [lab.id for lab in top_k(row, [], 10)] == [2, 0, 1]
    assert abs(sum(lab.score for lab in top_k(row, [], 10)) - 1.0) < 1e-12
    assert top_k(row, [], 0) == ()
    assert top_k(row, [], -3) == ()
    assert top_k(np.zeros(0, np.float32), [], 5) == ()
    assert top_k(np.array([[0.2, 0.7]]), ["x", "y"], k=1, logits=False) == (Label(1, "y", 0.7),)


def test_rows_of_other_dtypes_and_shapes_rank_as_before() -> None:
    rng = np.random.default_rng(3)
    cases = [
        rng.standard_normal(300),  # float64: ranked without the float64 shortcut
        rng.standard_normal(300).astype(np.float16),
        rng.integers(-50, 50, 300).astype(np.int32),
        rng.standard_normal((1, 300)).astype(np.float32),
        np.asfortranarray(rng.standard_normal((3, 100)).astype(np.float32)),
    ]
    for row in cases:
        for k in (1, 5):
            for logits in (True, False):
                assert top_k(row, NAMES, k, logits=logits) == _top_k_plain(row, NAMES, k, logits=logits)


def test_scores_that_row_minus_top_would_round_alike_keep_their_order() -> None:
    # In float64, 1e-16 - 10 and 2e-16 - 10 (and 0 - 10) are all -10: ranked on the row itself.
    row = np.full(50, -1.0, np.float32)
    row[[5, 9, 17, 30]] = np.array([10.0, 1e-16, 2e-16, 0.0], np.float32)
    for k in (2, 3, 4, 6):
        assert top_k(row, [], k) == _top_k_plain(row, [], k, logits=True)
    assert [lab.id for lab in top_k(row, [], 4)] == [5, 17, 9, 30]
    # A float64 row: -3.5 - 1 and nextafter(-3.5, 0) - 1 are both -4.5.
    row64 = np.full(20, -9.0)
    row64[[0, 1, 2]] = [1.0, -3.5, math.nextafter(-3.5, 0.0)]
    assert [lab.id for lab in top_k(row64, [], 3)] == [0, 2, 1]
    assert top_k(row64, [], 3) == _top_k_plain(row64, [], 3, logits=True)


def test_nan_and_infinities_give_what_they_gave() -> None:
    # What the first top_k made of them is kept: a NaN or +inf among the best gives NaN
    # probabilities (the order is whatever argpartition left); -inf scores rank last, p = 0.
    nan_row = np.array([0.1, np.nan, 3.0, 2.0, np.nan, 1.0], np.float32)
    inf_row = np.array([0.1, np.inf, 3.0, 2.0, -np.inf, 1.0], np.float32)
    low_row = np.array([0.5, -np.inf, -np.inf, 2.0, -np.inf, -np.inf], np.float32)
    with np.errstate(invalid="ignore"):
        for row in (nan_row, inf_row, low_row):
            for k in (1, 3, 5, 6):
                for logits in (True, False):
                    got, want = top_k(row, [], k, logits=logits), _top_k_plain(row, [], k, logits=logits)
                    assert [lab.id for lab in got] == [lab.id for lab in want]
                    assert [repr(lab.score) for lab in got] == [repr(lab.score) for lab in want]
        assert all(math.isnan(lab.score) for lab in top_k(nan_row, [], 3))
    assert [(lab.id, lab.score) for lab in top_k(low_row, [], 3)][2] == (1, 0.0)


@pytest.mark.parametrize(
    ("dtype", "scale", "zero_point"),
    [
        ("int8", 0.0625, -8),
        ("int8", 0.1, 5),
        ("int8", 4.0, 0),
        ("uint8", 0.00390625, 0),
        ("uint8", 0.17, 131),
    ],
)
def test_quantized_outputs_equal_dequantizing_first(dtype: str, scale: float, zero_point: int) -> None:
    spec = TensorSpec("logits", (1, 1000), dtype, Quantization(scale, zero_point))
    info = np.iinfo(np.dtype(dtype))
    rng = np.random.default_rng(11)
    for k in (1, 2, 5, 1000):
        top = output_top_k(spec, NAMES, k)
        flat = output_top_k(spec, NAMES, k, logits=False)
        for j in range(12):
            y = rng.integers(info.min, info.max + 1, (1, 1000)).astype(dtype)
            if j % 2:  # few codes: ties everywhere, the lowest code among the best
                y = np.clip(y // 64 * 64, info.min, info.max).astype(dtype)
            scores = from_output(y, spec).reshape(-1)
            assert top(y) == _top_k_plain(scores, NAMES, k, logits=True) == top_k(scores, NAMES, k)
            assert flat(y) == _top_k_plain(scores, NAMES, k, logits=False)


def test_quantized_outputs_whose_best_include_the_lowest_code() -> None:
    # The codes already taken are marked with the lowest code: a best one that has it is ranked plainly.
    # Scale 4: exp(score - top) underflows to 0 for far codes, so the codes themselves are ranked.
    y = np.array([[-128, 7, -128, -128, 3, -128, -128, -128]], np.int8)
    for scale in (0.5, 4.0):
        spec = TensorSpec("logits", (1, 8), "int8", Quantization(scale, 0))
        for k in (2, 3, 5, 7):
            for logits in (True, False):
                got = output_top_k(spec, [], k, logits=logits)(y)
                assert got == _top_k_plain(from_output(y, spec).reshape(-1), [], k, logits=logits)
                assert [lab.id for lab in got] == [1, 4, 0, 2, 3, 5, 6][:k]


def test_quantized_outputs_whose_codes_do_not_keep_their_order() -> None:
    # A negative scale reverses the order, a subnormal one collapses codes: dequantized first.
    rng = np.random.default_rng(5)
    for q in (Quantization(-0.1, 3), Quantization(1e-45, 0)):
        spec = TensorSpec("logits", (1, 200), "int8", q)
        top = output_top_k(spec, [], 5)
        for _ in range(6):
            y = rng.integers(-128, 128, (1, 200)).astype(np.int8)
            assert top(y) == _top_k_plain(from_output(y, spec).reshape(-1), [], 5, logits=True)


def test_output_top_k_on_float_outputs_is_from_output_then_top_k() -> None:
    rng = np.random.default_rng(2)
    spec = TensorSpec("logits", (1, 1000), "float32")
    top = output_top_k(spec, NAMES, 5)
    for row in rows(rng, 1000, 9):
        y = row.reshape(1, -1)
        assert top(y) == top_k(from_output(y, spec).reshape(-1), NAMES, 5)
    # A float64 output (against its spec) is made float32 first, as from_output does.
    y64 = rng.standard_normal((1, 1000)) * 3
    assert top(y64) == _top_k_plain(from_output(y64, spec).reshape(-1), NAMES, 5, logits=True)
    # Rows of another size reuse the object: its buffers follow.
    assert output_top_k(spec, NAMES, 2)(y64[:, :10]) == _top_k_plain(
        from_output(y64[:, :10], spec).reshape(-1), NAMES, 2, logits=True
    )
