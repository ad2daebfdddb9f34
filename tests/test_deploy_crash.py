"""Crash safety: ``edgekit agent install`` SIGKILLed 50 times at random points (crash_harness.py);
after each kill a restarted agent (recover()) finds the active slot complete and verified."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from crash_harness import sigkill_installs
from deploy_bundles import slim_bundle

from edgekit.bundle import pack, read_manifest


def test_fifty_sigkills_never_leave_a_broken_active_slot(
    x86_bundle: tuple[Path, dict[str, Any]], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, _ = x86_bundle
    # One serial for both, so they can take turns: the second is let in once (--allow-downgrade, as
    # an operator would), then each is a bundle the device took at its floor and goes in again freely.
    serial = read_manifest(folder).build.serial + 1
    v1 = pack(
        slim_bundle(folder, tmp_path / "v1", keys[0], version="1.0-crash", serial=serial),
        tmp_path / "v1.tar.gz",
    )
    v2 = pack(
        slim_bundle(folder, tmp_path / "v2", keys[0], version="2.0-crash", serial=serial),
        tmp_path / "v2.tar.gz",
    )
    summary = sigkill_installs(
        tmp_path / "root", keys[1], (v1, v2), iterations=50, seed=7, health_runs=10, device="x86_64-cpu"
    )
    print("\n" + json.dumps(summary, indent=2))
    assert summary["failures"] == []
    kills = summary["kills_by_step"]
    assert sum(kills.values()) == 50
    # The kills really landed inside every step of an install, the switch included.
    for step in ("signature", "hashes", "unpack", "health", "switch"):
        assert kills[step] >= 1, kills
    # Both versions ended up active at some point: installs completed between kills too.
    assert set(summary["active_versions_after_kills"]) == {"1.0-crash", "2.0-crash"}


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q", "-s"]))
