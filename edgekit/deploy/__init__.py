"""Deploying bundles: the device's state root with A/B slots, install with a health gate, rollback.

The device side (this package's core)::

    root = StateRoot(Path("/var/lib/edgekit"))   # creates the layout
    recover(root)                                # at agent start: the active slot is complete and verified
    result = install(root, Path("bundle.tar.gz"), "deploy-42", profile="jetson-orin-nano")
    result.ok, result.step, result.reason, result.health
    rollback(root, "deploy-43")

An install runs the steps ``signature``, ``hashes``, ``unpack``, ``health``, ``switch``,
``done`` (``STEPS``); a failure at any of them returns ``InstallResult(ok=False, step=...)``
and leaves the active slot as it was.  Nothing received is unpickled or evaluated: a bundle
is JSON, a signature, and files checked against the signed hashes.

The transports (``ssh``, the MQTT agent, ``rollout``) build on this.
"""

from __future__ import annotations

from edgekit.deploy.health import HealthReport, check_health
from edgekit.deploy.install import STEPS, InstallResult, install, rollback
from edgekit.deploy.recovery import recover
from edgekit.deploy.slots import DEFAULT_ROOT, SLOTS, SlotInfo, StateRoot

__all__ = [
    "DEFAULT_ROOT",
    "SLOTS",
    "STEPS",
    "HealthReport",
    "InstallResult",
    "SlotInfo",
    "StateRoot",
    "check_health",
    "install",
    "recover",
    "rollback",
]
