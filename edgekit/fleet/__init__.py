"""The fleet side: the collector of device telemetry, its store, the live view, the dashboard and /metrics."""

from __future__ import annotations

from edgekit.core.names import safe_name
from edgekit.fleet.collector import Collector, CollectorListener
from edgekit.fleet.open_store import open_store
from edgekit.fleet.store import FleetStore
from edgekit.fleet.sums import merge
from edgekit.fleet.view import FleetView, SloPolicy

__all__ = [
    "Collector",
    "CollectorListener",
    "FleetStore",
    "FleetView",
    "SloPolicy",
    "merge",
    "open_store",
    "safe_name",
]
