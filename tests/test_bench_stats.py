"""The benchmark's statistics: percentiles against numpy, LoadGen's query-count rule, the summary."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.bench.loadgen import (
    PERCENTILES,
    early_stopping_estimate,
    min_passing,
    min_queries,
    odds,
    percentile,
    summarize,
)

latencies = st.lists(
    st.floats(min_value=0.01, max_value=1e4, allow_nan=False, allow_infinity=False), min_size=1, max_size=400
)
quantiles = st.floats(min_value=0.0, max_value=100.0)


@settings(max_examples=300, deadline=None)
@given(latencies, quantiles)
def test_linear_percentile_is_numpys_default(values: list[float], q: float) -> None:
    ordered = sorted(values)
    assert percentile(ordered, q, "linear") == pytest.approx(np.percentile(values, q), rel=1e-12, abs=1e-9)


@settings(max_examples=300, deadline=None)
@given(latencies, st.floats(min_value=0.0, max_value=99.99))
def test_loadgen_percentile_is_an_observed_value_at_or_above_the_nearest_rank(
    values: list[float], q: float
) -> None:
    ordered = sorted(values)
    got = percentile(ordered, q)
    assert got in ordered
    # numpy's inverted_cdf is the nearest-rank rule; LoadGen's index floor(n q) is never below it.
    assert got >= np.percentile(values, q, method="inverted_cdf")
    # ...and at most one rank above it.
    assert got <= np.percentile(values, min(100.0, q + 100 / len(values)), method="inverted_cdf")


def test_percentiles_on_known_data() -> None:
    data = [float(i) for i in range(1, 1001)]  # 1..1000 ms
    assert percentile(data, 50) == 501.0  # index floor(1000 * 0.5) = 500
    assert percentile(data, 90) == 901.0
    assert percentile(data, 99) == 991.0
    assert percentile(data, 99.9) == 1000.0
    assert percentile(data, 100) == 1000.0
    assert percentile(data, 0) == 1.0
    assert percentile(data, 50, "linear") == np.percentile(data, 50) == 500.5
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match=r"0\.\.100"):
        percentile(data, 101)
    with pytest.raises(ValueError, match="unknown percentile method"):
        percentile(data, 50, "nearest")  # type: ignore[arg-type]


def test_loadgen_query_count_rule() -> None:
    # LoadGen's SingleStream early-stopping floors (99% confidence, one query over the estimate).
    assert min_queries(99.0) == 662
    assert min_queries(90.0) == 64
    # h_min with no query over it: the closed form ceil(log(1 - c) / log(p)).
    assert min_passing(0, 0.99) == 459 == math.ceil(math.log(0.01) / math.log(0.99))
    assert min_passing(0, 0.90) == 44


def test_odds_is_the_binomial_cdf() -> None:
    rng = np.random.default_rng(7)
    for h, t, p in ((100, 0, 0.9), (661, 1, 0.99), (300, 5, 0.95), (50, 50, 0.5)):
        n = h + t
        exact = sum(math.comb(n, x) * p ** (n - x) * (1 - p) ** x for x in range(t + 1))
        assert odds(h, t, p) == pytest.approx(exact, rel=1e-9)
        # and a simulation agrees roughly: P(at most t of n queries over the p quantile)
        sim = np.mean(rng.binomial(n, 1 - p, size=20000) <= t)
        assert odds(h, t, p) == pytest.approx(sim, abs=0.02)


def test_early_stopping_estimate() -> None:
    data = [float(i) for i in range(1, 663)]
    # 662 queries allow exactly one over the p99 estimate: the second largest.
    assert early_stopping_estimate(data, 99.0) == 661.0
    assert early_stopping_estimate(data[:661], 99.0) is None
    big = sorted(np.random.default_rng(1).exponential(5.0, size=5000).tolist())
    est = early_stopping_estimate(big, 90.0)
    assert est is not None and est >= percentile(big, 90.0)  # conservative
    assert est <= percentile(big, 92.0)  # but not absurdly so with 5000 queries


def test_summary_fields_and_underpowered_percentiles() -> None:
    short = summarize([5.0, 1.0, 3.0], duration_s=0.5)
    d = short.to_dict()
    assert (d["count"], d["min_ms"], d["max_ms"], d["mean_ms"], d["qps"]) == (3, 1.0, 5.0, 3.0, 6.0)
    assert d["p50_ms"] == 3.0 and d["headline"] == "p90_ms"
    assert not short.p99_valid and d["p99_valid"] is False
    assert "p99" in d["underpowered"] and "p90" in d["underpowered"]
    assert d["early_stopping_p99_ms"] is None

    values = np.random.default_rng(3).gamma(4.0, 2.0, size=700).tolist()
    long = summarize(values, duration_s=7.0)
    d = long.to_dict()
    assert long.p99_valid and "p99" not in d["underpowered"] and "p99.9" in d["underpowered"]
    for q in PERCENTILES:
        key = f"p{q:g}_ms"
        assert d[key] == pytest.approx(percentile(sorted(values), q), abs=1e-4)
    assert d["mean_ms"] == pytest.approx(np.mean(values), abs=1e-4)
    assert long.headline_ms == pytest.approx(d["p90_ms"], abs=1e-4)
    assert d["early_stopping_p99_ms"] >= d["p99_ms"]
