"""The deploy commands a fleet sends its agents over MQTT, the results they send back, and their checks.

Topics (JSON payloads; the schemas are in ``edgekit/telemetry/schema/``)::

    edgekit/v1/<fleet>/<device>/cmd          QoS 1: a deploy or rollback command (``Command``)
    edgekit/v1/<fleet>/<device>/cmd/result   QoS 1: progress steps and one final result per command
    edgekit/v1/<fleet>/<device>/agent        retained: the agent's status; its Will says offline

A command comes from the network, so ``parse_command`` trusts nothing in it: a size cap
before parsing, JSON only (no NaN, no duplicate keys: two readers must never see two
different commands in one payload), every field's type and shape checked, and the
command must name this device.  Nothing received is ever unpickled or evaluated; the
bundle it points at is verified (signature, hashes) by the install, not trusted because
a command named it.  Fields this version does not know are ignored, so a newer sender
still reaches an older agent.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from edgekit.errors import DeployError
from edgekit.protocol.topics import SCHEMA_AGENT, SCHEMA_COMMAND, SCHEMA_RESULT

ACTIONS = ("deploy", "rollback")
# A command is a few hundred bytes; anything much bigger is a mistake or an attack.
MAX_COMMAND_BYTES = 16 * 1024
MAX_URL_CHARS = 2048
MAX_SIGNATURE_CHARS = 4096
# Deploy ids name files (deploys/<id>.json): no separators, no "." or "..", no wildcards.
_DEPLOY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_BASE64 = re.compile(r"[A-Za-z0-9+/=_-]+")


def safe_deploy_id(value: object) -> bool:
    """1-64 of ``A-Z a-z 0-9 . _ -``, starting with a letter or digit: safe as a file name and in a topic."""
    return isinstance(value, str) and bool(_DEPLOY_ID.fullmatch(value))


def check_deploy_id(deploy_id: str) -> str:
    """``deploy_id`` if ``safe_deploy_id`` (the one rule of every transport); else ``DeployError``."""
    if not safe_deploy_id(deploy_id):
        raise DeployError(
            f"deploy id {deploy_id!r} is not 1-64 of A-Z a-z 0-9 . _ - starting with a letter or digit",
            "pass --id with a safe name",
        )
    return deploy_id


def new_deploy_id(prefix: str, sha256: str = "") -> str:
    """``<prefix>-<UTC time>-<sha8 or random>-<random>``: unique per run, safe as a file name."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    tail = sha256[:8] if sha256 else os.urandom(4).hex()
    return f"{prefix}-{stamp}-{tail}-{os.urandom(2).hex()}"


class CommandError(DeployError):
    """A command payload was refused; ``deploy_id`` is its id when one could be read (to answer to)."""

    def __init__(self, message: str, hint: str = "", deploy_id: str | None = None) -> None:
        super().__init__(message, hint)
        self.deploy_id = deploy_id


@dataclass(frozen=True)
class Command:
    """One checked command: deploy the bundle at ``url`` (``sha256``, ``size`` bytes), or roll back."""

    id: str
    action: str
    device: str
    url: str | None = None
    sha256: str | None = None
    size: int | None = None
    signature: str | None = None
    issued_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The wire form (``schema`` first; absent optional fields left out)."""
        body: dict[str, Any] = {"schema": SCHEMA_COMMAND, "id": self.id, "action": self.action}
        body["device"] = self.device
        for key in ("url", "sha256", "size", "signature", "issued_at"):
            value = getattr(self, key)
            if value is not None:
                body[key] = value
        return body

    def to_json(self) -> bytes:
        """The payload to publish."""
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()


def deploy_message(
    deploy_id: str, device: str, url: str, sha256: str, size: int, signature: str | None = None
) -> Command:
    """A deploy command, checked as an agent will check it (a sender finds its mistakes first)."""
    cmd = Command(deploy_id, "deploy", device, url, sha256, size, signature, round(time.time(), 3))
    return parse_command(cmd.to_json(), device)


def rollback_message(deploy_id: str, device: str) -> Command:
    """A rollback command: switch ``device`` back to its other complete slot."""
    cmd = Command(deploy_id, "rollback", device, issued_at=round(time.time(), 3))
    return parse_command(cmd.to_json(), device)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} appears twice")
        out[key] = value
    return out


def loads_strict(payload: bytes, limit: int = MAX_COMMAND_BYTES) -> Any:
    """JSON from the network: at most ``limit`` bytes, UTF-8, no NaN/Infinity, no duplicate keys.

    Raises ``ValueError`` with a short reason.
    """
    if len(payload) > limit:
        raise ValueError(f"{len(payload)} bytes, more than the {limit} a command may have")
    try:
        text = bytes(payload).decode("utf-8")
        return json.loads(text, parse_constant=_no_constants, object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8: {err.reason}") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON: {err.msg} at line {err.lineno} column {err.colno}") from None


def _short(value: object) -> str:
    return repr(value)[:80]


def parse_command(payload: bytes, device: str) -> Command:
    """Check a command received by ``device``; raises ``CommandError`` saying what is wrong.

    The error carries the command's id when the id itself was readable and safe, so the
    agent can answer on ``cmd/result`` about that id.
    """
    try:
        body = loads_strict(payload)
    except ValueError as err:
        raise CommandError(
            f"unreadable command: {err}",
            f"send one JSON object of at most {MAX_COMMAND_BYTES} bytes (schema {SCHEMA_COMMAND})",
        ) from None
    if type(body) is not dict:
        raise CommandError("the command is not a JSON object", f"send a {SCHEMA_COMMAND} object")
    raw_id = body.get("id")
    deploy_id = raw_id if safe_deploy_id(raw_id) else None

    def bad(message: str, hint: str) -> CommandError:
        return CommandError(message, hint, deploy_id)

    if body.get("schema") != SCHEMA_COMMAND:
        raise bad(
            f"schema {_short(body.get('schema'))} is not {SCHEMA_COMMAND!r}",
            "this agent speaks edgekit/v1 commands; upgrade the sender or the agent",
        )
    if deploy_id is None:
        raise bad(
            f"deploy id {_short(raw_id)} is not 1-64 of A-Z a-z 0-9 . _ - starting with a letter or digit",
            "edgekit deploy makes one; pass --id with a safe name",
        )
    target = body.get("device")
    if target != device:
        raise bad(
            f"the command is for device {_short(target)}, this is {device!r}",
            "publish to edgekit/v1/<fleet>/<device>/cmd with that device's own id in the payload",
        )
    action = body.get("action")
    if action not in ACTIONS:
        raise bad(f"unknown action {_short(action)}", "use deploy or rollback")
    issued_at = body.get("issued_at")
    if issued_at is not None and (
        type(issued_at) not in (int, float) or not math.isfinite(issued_at) or issued_at < 0
    ):
        raise bad(
            f"issued_at {_short(issued_at)} is not a time", "seconds since the epoch, e.g. 1764500000.0"
        )
    if action == "rollback":
        return Command(deploy_id, "rollback", device, issued_at=issued_at)
    return Command(
        deploy_id,
        "deploy",
        device,
        url=_check_url(body.get("url"), bad),
        sha256=_check_sha256(body.get("sha256"), bad),
        size=_check_size(body.get("size"), bad),
        signature=_check_signature(body.get("signature"), bad),
        issued_at=issued_at,
    )


def _check_url(url: object, bad: Any) -> str:
    if type(url) is not str or not url:
        raise bad("a deploy command needs the bundle's url", "http(s)://host:port/artifacts/<name>.tar.gz")
    if len(url) > MAX_URL_CHARS or any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise bad(
            f"url {_short(url)} is too long or holds spaces or control characters", "send a plain http(s) URL"
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as err:
        raise bad(f"url {_short(url)} is not a URL: {err}", "send a plain http(s) URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        # file://, ftp://, data: ... would let a command read the device's own files or more.
        raise bad(
            f"url {_short(url)} is not an http(s) URL",
            "host bundles with edgekit fleet serve --artifacts DIR",
        )
    return url


def _check_sha256(value: object, bad: Any) -> str:
    if type(value) is not str or not _SHA256.fullmatch(value):
        raise bad(f"sha256 {_short(value)} is not 64 lower-case hex digits", "sha256sum the bundle archive")
    return value


def _check_size(value: object, bad: Any) -> int:
    # type() is int, not isinstance: JSON true must not pass as the size 1.
    if type(value) is not int or value <= 0:
        raise bad(f"size {_short(value)} is not a positive number of bytes", "the archive's size in bytes")
    return value


def _check_signature(value: object, bad: Any) -> str | None:
    if value is None:
        return None
    if type(value) is not str or not 0 < len(value) <= MAX_SIGNATURE_CHARS or not _BASE64.fullmatch(value):
        raise bad(
            f"signature {_short(value)} is not base64 text of at most {MAX_SIGNATURE_CHARS} characters",
            "leave it out, or send the bundle's manifest.sig in base64",
        )
    return value


def result_message(
    device: str,
    deploy_id: str | None,
    step: str,
    *,
    final: bool,
    ok: bool | None = None,
    action: str | None = None,
    reason: str = "",
    hint: str = "",
    health: dict[str, Any] | None = None,
    version: str | None = None,
    replayed: bool = False,
    info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``cmd/result`` message: a progress step (``final`` false, ``ok`` null) or the final outcome.

    ``deploy_id`` is ``None`` when a command was refused before its id could be read.
    """
    body: dict[str, Any] = {
        "schema": SCHEMA_RESULT,
        "id": deploy_id,
        "device": device,
        "action": action,
        "step": step,
        "final": final,
        "ok": ok if final else None,
        "reason": reason,
        "hint": hint,
        "health": health or {},
        "version": version,
        "replayed": replayed,
        "ts": round(time.time(), 3),
    }
    if info:
        body["info"] = info
    return body


def parse_result(payload: bytes) -> dict[str, Any] | None:
    """A ``cmd/result`` message as a dict when it is one (the rollout reads agents' answers), else None."""
    try:
        body = loads_strict(payload, limit=4 * MAX_COMMAND_BYTES)
    except ValueError:
        return None
    if type(body) is not dict or body.get("schema") != SCHEMA_RESULT:
        return None
    if not (body.get("id") is None or safe_deploy_id(body.get("id"))) or type(body.get("final")) is not bool:
        return None
    if type(body.get("device")) is not str or body.get("ok") not in (True, False, None):
        return None
    if type(body.get("health", {})) is not dict:
        return None
    return body


def parse_agent_status(payload: bytes) -> dict[str, Any] | None:
    """A retained ``agent`` message as a dict when it is one, else None (an empty payload clears it)."""
    try:
        body = loads_strict(payload, limit=4 * MAX_COMMAND_BYTES)
    except ValueError:
        return None
    if type(body) is not dict or body.get("schema") != SCHEMA_AGENT:
        return None
    if body.get("state") not in ("online", "offline") or type(body.get("device")) is not str:
        return None
    return body
