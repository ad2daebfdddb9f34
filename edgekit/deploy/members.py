"""Who a fleet rollout goes to: the members its retained agent messages describe, and how many canaries.

``choose_members`` picks the online agents of ``--group`` or ``--target`` by name (a
repeatable order); ``canary_count`` says how many of them, first by name, are the canaries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgekit.errors import DeployError


@dataclass
class Member:
    """A fleet device as its retained agent message describes it."""

    device: str
    state: str
    group: str | None
    active_version: str | None
    pipeline: str | None
    profile: str | None


def parse_share(text: str) -> float:
    """``10%`` or ``0.1`` -> 0.1 (a share in (0, 1])."""
    t = text.strip()
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise DeployError(f"--canary {text!r} is not a share of the fleet", "write e.g. 10% or 0.25")
    return value


def canary_count(members: int, share: float) -> int:
    """ceil(share x members), at least one when there is anyone."""
    return min(members, max(1, math.ceil(share * members - 1e-9))) if members else 0


def _member(device: str, body: dict[str, Any]) -> Member:
    active = body.get("active") if isinstance(body.get("active"), dict) else {}
    version = active.get("version") if isinstance(active, dict) else None
    return Member(
        device,
        str(body.get("state")),
        body.get("group") if isinstance(body.get("group"), str) else None,
        version if isinstance(version, str) else None,
        body.get("pipeline") if isinstance(body.get("pipeline"), str) else None,
        body.get("profile") if isinstance(body.get("profile"), str) else None,
    )


def choose_members(
    agents: dict[str, dict[str, Any]], targets: Sequence[str], group: str | None
) -> tuple[list[Member], dict[str, str]]:
    """The devices to deploy to, by name, and those left out with why (offline, unknown)."""
    skipped: dict[str, str] = {}
    chosen: list[Member] = []
    if targets:
        for device in sorted(set(targets)):
            body = agents.get(device)
            if body is None:
                skipped[device] = "no agent with this id has reported to the broker"
                continue
            m = _member(device, body)
            if m.state != "online":
                skipped[device] = "its agent is offline"
            else:
                chosen.append(m)
        return chosen, skipped
    for device in sorted(agents):
        m = _member(device, agents[device])
        if m.group != group:
            continue
        if m.state != "online":
            skipped[device] = "its agent is offline"
        else:
            chosen.append(m)
    return chosen, skipped
