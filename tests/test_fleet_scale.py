"""A fleet at scale, CI-sized: ``edgekit fleet simulate --scale`` (every device its own MQTT connection)
through a real Mosquitto into two ``edgekit fleet collect --share`` processes and a real PostgreSQL, one
collector SIGKILLed mid-run; and the simulator's own parts.  ``benchmarks.fleet_scale`` runs the same
with 10,000 devices for 10 minutes."""

from __future__ import annotations

import argparse
import resource
import subprocess

import pytest

from edgekit.errors import EdgekitError
from edgekit.telemetry.simulate_fleet import Ledger, raise_fd_limit
from edgekit.testing.mosquitto import BrokerMissing
from edgekit.testing.postgres import PostgresMissing

from conftest import EDGEKIT, ROOT


def test_a_fleet_through_two_collectors_one_killed_loses_and_repeats_nothing() -> None:
    from benchmarks.fleet_scale import measure

    args = argparse.Namespace(
        devices=200, minutes=0.4, interval=2.0, collectors=2, kill=True, down=3.0, outages=0.05, restarts=0.05
    )
    try:
        r = measure(args)
    except (BrokerMissing, PostgresMissing) as err:
        pytest.skip(str(err))
    assert r["windows"] > 2000 and r["sent"] == r["windows"]  # the simulator had every window acknowledged
    # A fault finds its device online unless another fault has it down then.
    assert 0 < r["outages"] <= 10 and 0 < r["restarts"] <= 10 and r["killed_at_s"] is not None
    assert r["lost"] == 0 and r["duplicated_rows"] == 0 and r["stored"] == r["sent"]
    assert (
        r["stored_not_acked"] == 0
    )  # what a lost PUBACK left unacknowledged was sent again and acknowledged
    assert r["devices_by_state"] == {"offline": 200}  # every device known, and gone at the end
    assert r["lag_ms"]["p50"] is not None and r["lag_ms"]["p50"] <= r["lag_ms"]["p99"] <= r["lag_ms"]["max"]


def test_the_ledger_keeps_each_seq_once_as_ranges() -> None:
    ledger = Ledger()
    for seq in (0, 1, 2, 4, 2, 5, 9):  # 2 acknowledged twice: sent again after a lost link
        ledger.add("d1", "e1", seq)
    ledger.add("d1", "e2", 0)
    assert ledger.ranges() == {"d1": {"e1": [[0, 2], [4, 5], [9, 9]], "e2": [[0, 0]]}}
    assert ledger.distinct() == 7 and ledger.count == 8


def test_too_few_open_files_is_a_clear_error_before_anything_connects() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit on open files here")
    with pytest.raises(EdgekitError) as err:
        raise_fd_limit(hard + 1)
    assert "a socket per device" in err.value.message and "ulimit -Hn" in err.value.hint


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--outages", "1.5"], "--outages 1.5: a share of the devices, 0 to 1"),
        (["--restarts", "-0.1"], "--restarts -0.1: a share of the devices, 0 to 1"),
        (["--format", "sparkplug"], "--scale speaks the JSON format only"),
    ],
)
def test_scale_mode_mistakes_are_plain_errors(extra: list[str], says: str) -> None:
    run = subprocess.run(
        [*EDGEKIT, "fleet", "simulate", "--scale", "--mqtt", "mqtt://127.0.0.1:9", *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode != 0 and says in run.stderr and "Traceback" not in run.stderr
