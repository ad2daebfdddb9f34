"""Telemetry through a silent network drop: windows made, received, lost and duplicated, JSON and Sparkplug.

Starts its own Mosquitto on a free loopback port and puts a TCP proxy between each
publisher and it (``edgekit.testing.blackhole``): it forwards, swallows every byte for
``--seconds`` (default 10: no FIN, no RST, as a dead NAT or radio link), then resets the
connections.  A subscriber on the broker itself counts the seqs that arrive.  Goal: 0 lost
in both formats; duplicates are allowed (subscribers de-duplicate on seq).

    .venv/bin/python -m benchmarks.telemetry_blackhole [--seconds 10] [--interval 0.2]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from edgekit.testing.blackhole import telemetry_through_blackhole
from edgekit.testing.mosquitto import Mosquitto


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="how long the blackhole swallows")
    ap.add_argument("--interval", type=float, default=0.2, help="telemetry interval, seconds")
    ap.add_argument("--formats", default="json,sparkplug")
    args = ap.parse_args(argv)
    lost = 0
    with tempfile.TemporaryDirectory() as tmp, Mosquitto(Path(tmp), persistence=False, log=False) as broker:
        print(f"blackhole {args.seconds:g} s, a window every {args.interval:g} s")
        for fmt in args.formats.split(","):
            run = telemetry_through_blackhole(
                broker.port,
                Path(tmp) / f"{fmt}.db",
                format=fmt,
                seconds=args.seconds,
                interval_s=args.interval,
            )
            print(run.line())
            lost += run.lost
    print("PASS: nothing lost" if lost == 0 else f"FAIL: {lost} windows lost")
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
