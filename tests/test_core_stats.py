"""edgekit's one percentile and one top-1 agreement rule (``edgekit.core.stats``)."""

from __future__ import annotations

import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgekit.core.stats import PERCENTILES, TIE_MARGIN, agreement, label, median, percentile

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


def test_percentile_on_known_data() -> None:
    data = [float(x) for x in range(1, 101)]  # 1..100
    assert percentile(data, 50) == 51.0  # LoadGen: index floor(100 * 0.5) = 50
    assert percentile(data, 90) == 91.0
    assert percentile(data, 99) == 100.0  # of 100 runs, p99 is the slowest
    assert percentile([float(x) for x in range(1, 102)], 99) == 100.0  # of 101, it leaves it out
    assert percentile(data, 0) == 1.0 and percentile(data, 100) == 100.0
    assert percentile([7.0], 99.9) == 7.0
    assert percentile(data, 50, "linear") == 50.5
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match=r"within 0\.\.100"):
        percentile(data, -1)
    assert [label(q) for q in PERCENTILES] == ["p50", "p90", "p95", "p97", "p99", "p99.9"]


@given(st.lists(finite, min_size=1, max_size=300), st.floats(min_value=0, max_value=100))
def test_percentile_is_an_observed_value_with_at_least_q_percent_at_or_below(
    values: list[float], q: float
) -> None:
    ordered = sorted(values)
    got = percentile(ordered, q)
    assert got in ordered
    at_or_below = sum(v <= got for v in ordered)
    assert at_or_below >= len(ordered) * q / 100 - 1e-9
    # ...and it is the least such value but one at most (LoadGen rounds the rank down, then takes the next)
    assert sum(v < got for v in ordered) <= len(ordered) * q / 100 + 1e-9


@given(st.lists(finite, min_size=1, max_size=200), st.floats(0, 100), st.floats(0, 100))
def test_percentile_is_monotone_in_q_and_between_min_and_max(values: list[float], a: float, b: float) -> None:
    ordered = sorted(values)
    lo, hi = sorted((a, b))
    for method in ("loadgen", "linear"):
        assert ordered[0] <= percentile(ordered, lo, method) <= percentile(ordered, hi, method) + 1e-6
        assert percentile(ordered, hi, method) <= ordered[-1] + 1e-6


def test_median_is_the_p50_of_the_values_in_any_order() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    # Of an even count, the upper of the two middle values (LoadGen's index n // 2), not their mean.
    assert median([4.0, 1.0, 3.0, 2.0]) == 3.0 and statistics.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert median(x for x in (5, 9)) == 9.0  # any iterable, ints too
    assert math.isnan(median([]))


@given(st.lists(finite, min_size=1, max_size=300))
def test_median_is_percentile_50_and_an_observed_value(values: list[float]) -> None:
    got = median(values)
    assert got == percentile(sorted(values), 50) and got in values
    if len(values) % 2:  # of an odd count every rule agrees
        assert got == statistics.median(values)


ROOT = Path(__file__).resolve().parents[1]
# Another median or percentile rule: the standard library's or numpy's (a sketch's quantile is the
# streamed estimate of this one, within its accuracy, and is not matched), or a hand-written middle.
OTHER_RULES = re.compile(
    r"statistics\.(median|quantiles)\b|np\.(median|percentile|quantile|nanmedian|nanpercentile)\b"
    r"|\[len\((\w+)\) // 2\]"
)


def test_no_other_median_or_percentile_rule_in_edgekit_benchmarks_or_tools() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for top in ("edgekit", "benchmarks", "tools")
        for path in sorted((ROOT / top).rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OTHER_RULES.search(line)
    ]
    assert not found, "use edgekit.core.stats.median / percentile:\n" + "\n".join(found)


def test_the_bench_and_the_pipeline_use_this_percentile() -> None:
    from edgekit.bench import loadgen as bench_stats
    from edgekit.pipeline import run_stats as pipeline_stats

    assert bench_stats.percentile is percentile and bench_stats.PERCENTILES == PERCENTILES
    # The pipeline summary's wire keys stay p50/p90/p95/p99/p99.9: a subset of the one list.
    assert pipeline_stats.PERCENTILES == (50.0, 90.0, 95.0, 99.0, 99.9)
    assert set(pipeline_stats.PERCENTILES) <= set(PERCENTILES)


def test_a_flip_on_a_near_tie_does_not_count_and_one_on_a_decisive_frame_does() -> None:
    ref = [1, 2, 3, 4]
    margins = [0.5, TIE_MARGIN, TIE_MARGIN - 0.01, 0.9]  # the margin itself is decisive
    near_tie_flip = agreement([1, 2, 9, 4], ref, margins)
    assert near_tie_flip.rate == 1.0 and near_tie_flip.all_rate == 0.75
    assert (near_tie_flip.decisive, near_tie_flip.counted, near_tie_flip.frames) == (3, 3, 4)
    assert near_tie_flip.flipped == (2,)
    assert near_tie_flip.flipped_names(["a", "b", "c", "d"]) == ("~c",)

    decisive_flip = agreement([1, 9, 3, 4], ref, margins)
    assert decisive_flip.rate == pytest.approx(2 / 3) and decisive_flip.all_rate == 0.75
    assert decisive_flip.flipped_names(["a", "b", "c", "d"]) == ("b",)


def test_with_no_decisive_frame_every_frame_counts_and_with_none_there_is_no_rate() -> None:
    a = agreement([1, 2], [1, 3], [0.01, 0.02])
    assert a.rate == 0.5 and a.decisive == 0 and a.counted == 2
    assert a.flipped_names(["x", "y"]) == ("~y",)
    empty = agreement([], [], [])
    assert empty.rate is None and empty.all_rate is None and empty.frames == 0
    with pytest.raises(ValueError, match="one answer and one margin per frame"):
        agreement([1], [1, 2], [0.5, 0.5])


frames = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 3), st.floats(0, 1, allow_nan=False)), max_size=60
)


@given(frames)
def test_agreement_properties(rows: list[tuple[int, int, float]]) -> None:
    got, ref, margin = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    a = agreement(got, ref, margin)
    n = len(rows)
    assert a.frames == n and len(a.near_tie) == n
    assert a.decisive == sum(m >= TIE_MARGIN for m in margin)
    assert set(a.flipped) == {i for i in range(n) if got[i] != ref[i]}
    if n == 0:
        assert a.rate is None
        return
    assert a.all_rate == pytest.approx(1 - len(a.flipped) / n)
    assert a.counted == (a.decisive or n)
    decisive_flips = sum(1 for i in a.flipped if not a.near_tie[i])
    flips_counted = decisive_flips if a.decisive else len(a.flipped)
    assert a.rate == pytest.approx(1 - flips_counted / a.counted)
    # Changing a near-tie frame's answer never moves the rate while a decisive frame exists.
    if a.decisive and a.decisive < n:
        i = a.near_tie.index(True)
        other = [*got]
        other[i] = (got[i] + 1) % 4
        assert agreement(other, ref, margin).rate == a.rate


def test_the_build_gate_uses_the_rule() -> None:
    np = pytest.importorskip("numpy")
    from edgekit.convert.accuracy import compare

    # Image 0: decisive, kept; image 1: near-tie (0.51 vs 0.49), flipped; image 2: decisive, flipped.
    reference = np.log(np.array([[0.9, 0.05, 0.05], [0.51, 0.49, 1e-9], [0.05, 0.9, 0.05]]))
    logits = np.log(np.array([[0.9, 0.05, 0.05], [0.3, 0.7, 1e-9], [0.9, 0.05, 0.05]]))
    acc = compare(logits, reference, ["a", "b", "c"], smoke_set=True)
    assert acc.top1_agreement == 0.5 and acc.decisive_images == 2
    assert acc.top1_agreement_all == pytest.approx(1 / 3)
    assert acc.flipped == ("~b", "c") and not acc.passed
    only_tie = compare(logits[:2], reference[:2], ["a", "b"], smoke_set=True)
    assert only_tie.top1_agreement == 1.0 and only_tie.passed and only_tie.flipped == ("~b",)


def test_the_bench_result_uses_the_rule() -> None:
    from edgekit.bench.report import BenchCandidate as Candidate
    from edgekit.bench.report import Result

    cand = Candidate("onnxruntime-int8", "onnxruntime", "int8", 1, {})
    res = Result(cand, top1=[1, 9, 3], reference_top1=[1, 2, 3], reference_margin=[0.5, 0.05, 0.5])
    assert res.agreement == 1.0  # the flip is on a near-tie
    res = Result(cand, top1=[1, 2, 9], reference_top1=[1, 2, 3], reference_margin=[0.5, 0.05, 0.5])
    assert res.agreement == 0.5
    # Without margins every frame counts; the grey stand-in frame (-1) never does.
    assert Result(cand, top1=[1, 9], reference_top1=[1, 2]).agreement == 0.5
    assert Result(cand, top1=[4], reference_top1=[-1]).agreement is None


def test_the_module_imports_nothing_heavy() -> None:
    code = (
        "import sys, edgekit; before = set(sys.modules); import edgekit.core.stats; "
        "bad = sorted(m for m in set(sys.modules) - before "
        "if m.split('.')[0] == 'numpy' or (m.startswith('edgekit.') and not m.startswith('edgekit.core'))); "
        "print(bad); raise SystemExit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
