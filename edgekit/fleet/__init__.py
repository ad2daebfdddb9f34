"""The fleet side: a collector of device telemetry and the store it keeps (the dashboard builds on these)."""

from __future__ import annotations

from edgekit.fleet.collector import Collector
from edgekit.fleet.store import FleetStore, merge
from edgekit.names import safe_name

__all__ = ["Collector", "FleetStore", "merge", "safe_name"]
