"""What the agent says about itself on the wire, and how it connects: kept apart from ``edgekit.deploy.agent``.

``agent_client_id`` is who the agent is to the broker (its fleet and device id);
``status_payload`` is the retained ``agent`` message (an ``AgentStatus``); ``connect_kwargs``
the MQTT 5 CONNECT properties: a session the broker keeps while the agent is away, and a
Maximum Packet Size so that the broker drops a command bigger than ``MAX_COMMAND_BYTES``
instead of sending it (paho would buffer all of it before the agent could refuse it).  Over
MQTT 3.1.1 there is no such property: the broker's own limit bounds it (Mosquitto's
``max_packet_size``, or ``message_size_limit`` in older versions).

Who may publish what is the broker's ACL.  With Mosquitto and one user per device named like
the device id (``%u``)::

    pattern read  edgekit/v1/+/%u/cmd
    pattern write edgekit/v1/+/%u/cmd/result
    pattern write edgekit/v1/+/%u/agent
    pattern write edgekit/v1/+/%u/status
    pattern write edgekit/v1/+/%u/telemetry
    pattern write edgekit/v1/+/%u/labels

and for the user ``edgekit deploy`` runs as: ``write edgekit/v1/<fleet>/+/cmd`` and
``read`` on ``.../+/agent``, ``.../+/cmd/result``, ``.../+/status``, ``.../+/telemetry``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from edgekit._version import __version__
from edgekit.protocol.control import MAX_COMMAND_BYTES
from edgekit.protocol.topics import SCHEMA_AGENT

# The biggest PUBLISH the broker may send the agent: a command, its topic and the headers.
MAX_PACKET_BYTES = MAX_COMMAND_BYTES + 1024


def agent_client_id(fleet: str, device: str) -> str:
    """The agent's MQTT client id: ``edgekit-agent:<fleet>:<device>``.

    The fleet is in it: a device id is unique only within its fleet, and a broker disconnects
    the older of two clients with one id and hands the newer one its kept session (and with
    it the other's subscriptions and queued commands).  ``:`` is in no fleet or device name,
    so two pairs never make one id.  Not the device id alone: the pipeline child connects with
    that one.
    """
    return f"edgekit-agent:{fleet}:{device}"


def connect_kwargs(protocol: str, session_expiry_s: int) -> dict[str, Any]:
    """``connect_async`` keyword arguments for ``protocol`` (``"5"``: properties; else none)."""
    if protocol != "5":
        return {}
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = session_expiry_s
    props.MaximumPacketSize = MAX_PACKET_BYTES
    return {"clean_start": False, "properties": props}


def status_payload(
    state: str,
    device: str,
    fleet: str,
    group: str | None,
    profile: str | None,
    online: dict[str, Any] | None,
    root_status: Callable[[], dict[str, Any]],
) -> bytes:
    """The retained agent message: who, and (``online``) what is installed and active, and how it runs."""
    body: dict[str, Any] = {
        "schema": SCHEMA_AGENT,
        "state": state,
        "device": device,
        "fleet": fleet,
        "group": group,
        "profile": profile,
    }
    if state == "online":
        status = root_status()
        body |= {
            "ts": round(time.time(), 3),
            "edgekit": __version__,
            "active": _active_of(status),
            "slots": status.get("slots", status),
            **(online or {}),
        }
    return json.dumps(body, separators=(",", ":"), default=str).encode()


def _active_of(status: dict[str, Any]) -> dict[str, Any] | None:
    """The active slot's facts (slot, model, version, deploy id) out of ``StateRoot.status()``."""
    if not status.get("active"):
        return None
    return {"slot": status["active"]} | {k: status.get(k) for k in ("model", "version", "deploy_id")}


def plain(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with what JSON cannot carry (paths, numpy numbers) as text."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if value is None or isinstance(value, (bool, int, float, str)):
            out[str(key)] = value
        elif isinstance(value, dict):
            out[str(key)] = plain(value)
        elif isinstance(value, (list, tuple)):
            out[str(key)] = [v if isinstance(v, (bool, int, float, str)) else str(v) for v in value]
        else:
            out[str(key)] = str(value)
    return out
