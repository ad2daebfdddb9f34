"""The deploy commands a fleet sends its agents over MQTT, the results they send back, and their checks.

Topics (JSON payloads; the schemas are in ``edgekit/protocol/schema/``)::

    edgekit/v1/<fleet>/<device>/cmd          QoS 1: a deploy, rollback or proof command (``Command``)
    edgekit/v1/<fleet>/<device>/cmd/result   QoS 1: progress steps and one final result per command
                                             (a proof command's answer comes first: ``proof_messages``)
    edgekit/v1/<fleet>/<device>/agent        retained: the agent's status; its Will says offline

A command comes from the network, so ``parse_command`` trusts nothing in it: a size cap
before parsing, JSON only (no NaN, no duplicate keys: two readers must never see two
different commands in one payload), every field's type and shape checked by the
``Command`` model (``edgekit.protocol.control_messages``), and the command must name this
device.  Nothing received is ever unpickled or evaluated; the
bundle it points at is verified (signature, hashes) by the install, not trusted because
a command named it.  Fields this version does not know are ignored, so a newer sender
still reaches an older agent.  Who sent a command is the agent's check
(``edgekit.deploy.command_trust``): ``signed_bytes`` is what the sender signed.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from edgekit.errors import DeployError
from edgekit.protocol.control_messages import (
    ACTIONS,
    DEPLOY_ID_PATTERN,
    MAX_LISTED,
    MAX_SIGNATURE_CHARS,
    MAX_URL_CHARS,
    AgentStatus,
    Command,
    ProofFile,
    Result,
)
from edgekit.protocol.messages import checked
from edgekit.protocol.proof_messages import MAX_ANSWER_BYTES, ProofChunk, ProofList
from edgekit.protocol.topics import (
    SCHEMA_AGENT,
    SCHEMA_COMMAND,
    SCHEMA_PROOF_CHUNK,
    SCHEMA_PROOF_LIST,
    SCHEMA_RESULT,
)

__all__ = [
    "ACTIONS",
    "MAX_COMMAND_BYTES",
    "MAX_SIGNATURE_CHARS",
    "MAX_URL_CHARS",
    "Command",
    "CommandError",
    "check_deploy_id",
    "deploy_message",
    "fetch_proof_message",
    "list_proofs_message",
    "loads_strict",
    "new_deploy_id",
    "new_nonce",
    "parse_agent_status",
    "parse_answer",
    "parse_command",
    "parse_result",
    "result_message",
    "rollback_message",
    "safe_deploy_id",
    "signed_bytes",
    "with_signature",
]

# A command is a few hundred bytes; anything much bigger is a mistake or an attack.
MAX_COMMAND_BYTES = 16 * 1024
_DEPLOY_ID = re.compile(DEPLOY_ID_PATTERN)
_ID_RULE = "is not 1-64 of A-Z a-z 0-9 . _ - starting with a letter or digit"


def safe_deploy_id(value: object) -> bool:
    """1-64 of ``A-Z a-z 0-9 . _ -``, starting with a letter or digit: safe as a file name and in a topic."""
    return isinstance(value, str) and bool(_DEPLOY_ID.fullmatch(value))


def check_deploy_id(deploy_id: str) -> str:
    """``deploy_id`` if ``safe_deploy_id`` (the one rule of every transport); else ``DeployError``."""
    if not safe_deploy_id(deploy_id):
        raise DeployError(f"deploy id {deploy_id!r} {_ID_RULE}", "pass --id with a safe name")
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


def new_nonce() -> str:
    """A command's nonce: 128 random bits as 32 hex digits."""
    return os.urandom(16).hex()


def signed_bytes(body: dict[str, Any]) -> bytes:
    """What a command's ``signature`` signs: the object without ``signature``, keys sorted, no whitespace."""
    rest = {k: v for k, v in body.items() if k != "signature"}
    return json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def with_signature(cmd: Command, sign: Callable[[bytes], bytes]) -> Command:
    """``cmd`` with its ``signature``: base64 of ``sign(signed_bytes(...))`` (an Ed25519 key's ``sign``).

    Only a command that expires and carries a nonce is signed: an agent refuses a signed one without.
    """
    if cmd.expires_at is None or cmd.nonce is None:
        raise DeployError(
            "a command to sign needs expires_at and a nonce", "build it with a ttl_s (deploy_message)"
        )
    body = cmd.to_dict()
    body["signature"] = base64.b64encode(sign(signed_bytes(body))).decode("ascii")
    return parse_command(json.dumps(body, separators=(",", ":")).encode(), cmd.device, cmd.fleet)


def deploy_message(
    deploy_id: str, device: str, url: str, sha256: str, size: int, ttl_s: float | None = None, *, fleet: str
) -> Command:
    """A deploy command for ``fleet``/``device``, checked as an agent will check it (a sender finds its mistakes first).

    ``ttl_s``: the command carries ``expires_at`` (now + ``ttl_s``) and a ``nonce`` (to be signed).
    """
    body: dict[str, Any] = {"schema": SCHEMA_COMMAND, "id": deploy_id, "action": "deploy"}
    body |= {"fleet": fleet, "device": device, "url": url, "sha256": sha256, "size": size}
    return _stamped(body, ttl_s)


def rollback_message(deploy_id: str, device: str, ttl_s: float | None = None, *, fleet: str) -> Command:
    """A rollback command: switch ``fleet``/``device`` back to its other complete slot."""
    body: dict[str, Any] = {"schema": SCHEMA_COMMAND, "id": deploy_id, "action": "rollback"}
    body |= {"fleet": fleet, "device": device}
    return _stamped(body, ttl_s)


def list_proofs_message(
    command_id: str,
    device: str,
    ttl_s: float,
    *,
    fleet: str,
    camera: str | None = None,
    limit: int | None = None,
) -> Command:
    """Ask ``fleet``/``device``'s agent which event proofs it keeps (the newest ``limit``, of ``camera``)."""
    body: dict[str, Any] = {"schema": SCHEMA_COMMAND, "id": command_id, "action": "list-proofs"}
    body |= {"fleet": fleet, "device": device}
    body |= {k: v for k, v in (("camera", camera), ("limit", limit)) if v is not None}
    return _stamped(body, ttl_s)


def fetch_proof_message(
    command_id: str, device: str, event: str, file: ProofFile, ttl_s: float, *, fleet: str
) -> Command:
    """Ask ``fleet``/``device``'s agent for ``file`` (snapshot or clip) of ``event``'s proof."""
    body: dict[str, Any] = {"schema": SCHEMA_COMMAND, "id": command_id, "action": "fetch-proof"}
    body |= {"fleet": fleet, "device": device, "event": event, "file": file}
    return _stamped(body, ttl_s)


def _stamped(body: dict[str, Any], ttl_s: float | None) -> Command:
    now = round(time.time(), 3)
    body["issued_at"] = now
    if ttl_s is not None:
        body["expires_at"] = round(now + ttl_s, 3)
        body["nonce"] = new_nonce()
    return parse_command(
        json.dumps(body, separators=(",", ":")).encode(), str(body["device"]), str(body["fleet"])
    )


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


_URL_HINT = "send a plain http(s) URL"
# What to say about a field the Command model refused, and what to do about it.
_REFUSALS: dict[str, tuple[str, str]] = {
    "action": ("unknown action {}", "use deploy, rollback, list-proofs or fetch-proof"),
    "event": ("event {} is not an event id (a lower-case UUID)", "name the event by the id it was sent with"),
    "file": ("file {} is not snapshot or clip", "ask for the snapshot or the clip"),
    "camera": ("camera {} is not a camera name", "a camera name as the device reports it"),
    "limit": (f"limit {{}} is not 1-{MAX_LISTED}", f"ask for at most {MAX_LISTED} proofs"),
    "url": ("a deploy command needs the bundle's url", "http(s)://host:port/artifacts/<name>.tar.gz"),
    "sha256": ("sha256 {} is not 64 lower-case hex digits", "sha256sum the bundle archive"),
    "size": ("size {} is not a positive number of bytes", "the archive's size in bytes"),
    "signature": (
        f"signature {{}} is not base64 text of at most {MAX_SIGNATURE_CHARS} characters",
        "sign commands with edgekit deploy --fleet ... --sign-key KEY.pem",
    ),
    "issued_at": ("issued_at {} is not a time", "seconds since the epoch, e.g. 1764500000.0"),
    "expires_at": ("expires_at {} is not a time", "seconds since the epoch, e.g. 1764500900.0"),
    "nonce": ("nonce {} is not 16-64 of A-Z a-z 0-9 _ -", "a fresh random value per command"),
}


def _refusal(err: ValidationError) -> tuple[str, str]:
    """The message and hint of the first problem the ``Command`` model found."""
    e = err.errors(include_url=False)[0]
    field = str(e["loc"][0]) if e["loc"] else ""
    said = str(e.get("ctx", {}).get("error", ""))
    if field == "url" and e["type"] == "value_error":  # check_url says which rule the URL broke
        hint = "host bundles with edgekit fleet serve --artifacts DIR" if "http(s)" in said else _URL_HINT
        return said, hint
    if not field:  # the model's own rule: a deploy names its bundle ("... needs the bundle's <field>")
        return said, _REFUSALS.get(said.rpartition(" ")[2], _REFUSALS["url"])[1]
    message, hint = _REFUSALS.get(field, (f"{field} {{}}: {e['msg']}", f"send a {SCHEMA_COMMAND} object"))
    return message.format(_short(e["input"])), hint


def parse_command(payload: bytes, device: str, fleet: str) -> Command:
    """Check a command received by ``device`` of ``fleet``; raises ``CommandError`` saying what is wrong.

    The command must name both: a device id is unique only within its fleet, and what names
    them is under the signature (``edgekit.deploy.command_trust``), so a command signed for
    ``lab/cam-1`` is refused by ``prod/cam-1``.  One without a fleet (from a sender older than
    this check, or made by hand) is refused too: taking it would let a command signed for any
    fleet's ``cam-1`` be replayed here until it expires.

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
    # Schema, id and device first, each with its own answer: they say whether to answer at all.
    if body.get("schema") != SCHEMA_COMMAND:
        raise CommandError(
            f"schema {_short(body.get('schema'))} is not {SCHEMA_COMMAND!r}",
            "this agent speaks edgekit/v1 commands; upgrade the sender or the agent",
            deploy_id,
        )
    if deploy_id is None:
        raise CommandError(
            f"deploy id {_short(raw_id)} {_ID_RULE}", "edgekit deploy makes one; pass --id with a safe name"
        )
    if body.get("device") != device:
        raise CommandError(
            f"the command is for device {_short(body.get('device'))}, this is {device!r}",
            "publish to edgekit/v1/<fleet>/<device>/cmd with that device's own id in the payload",
            deploy_id,
        )
    if "fleet" not in body:
        raise CommandError(
            "the command names no fleet (an older edgekit deploy sent it, or it was made by hand); "
            "a command must name its fleet so that one signed for another fleet cannot be replayed here",
            f"upgrade edgekit where the command is sent from and send it again ({fleet!r} in its 'fleet')",
            deploy_id,
        )
    if body.get("fleet") != fleet:
        raise CommandError(
            f"the command is for fleet {_short(body.get('fleet'))}, this device is in {fleet!r}",
            "publish to edgekit/v1/<fleet>/<device>/cmd with that fleet's own name in the payload",
            deploy_id,
        )
    if body.get("action") == "rollback":  # a rollback names no bundle: whatever else it carries is ignored
        kept = ("schema", "id", "action", "fleet", "device", "issued_at", "expires_at", "nonce", "signature")
        body = {k: v for k, v in body.items() if k in kept}
    try:
        return Command.model_validate(body)
    except ValidationError as err:
        message, hint = _refusal(err)
        raise CommandError(message, hint, deploy_id) from None


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
    """A ``cmd/result`` message (a ``Result``): a progress step (``final`` false, ``ok`` null) or the final outcome.

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
    return checked(Result, body)


def parse_result(payload: bytes) -> dict[str, Any] | None:
    """A ``cmd/result`` message as a dict when it is a valid ``Result`` (the rollout reads agents' answers), else None."""
    try:
        body = loads_strict(payload, limit=4 * MAX_COMMAND_BYTES)
    except ValueError:
        return None
    if type(body) is not dict or body.get("schema") != SCHEMA_RESULT:
        return None
    try:
        Result.model_validate(body)
    except ValidationError:
        return None
    return body


def parse_answer(payload: bytes) -> ProofList | ProofChunk | Result | None:
    """A ``cmd/result`` message as its model: a proof list, a proof chunk or a result; else None."""
    try:
        body = loads_strict(payload, limit=MAX_ANSWER_BYTES)
    except ValueError:
        return None
    if type(body) is not dict:
        return None
    models: dict[str, type[ProofList | ProofChunk | Result]] = {
        SCHEMA_PROOF_CHUNK: ProofChunk,
        SCHEMA_PROOF_LIST: ProofList,
        SCHEMA_RESULT: Result,
    }
    model = models.get(str(body.get("schema")))
    if model is None:
        return None
    try:
        return model.model_validate(body)
    except ValidationError:
        return None


def parse_agent_status(payload: bytes) -> dict[str, Any] | None:
    """A retained ``agent`` message as a dict when it is a valid ``AgentStatus``, else None (an empty payload clears it)."""
    try:
        body = loads_strict(payload, limit=4 * MAX_COMMAND_BYTES)
    except ValueError:
        return None
    if type(body) is not dict or body.get("schema") != SCHEMA_AGENT:
        return None
    try:
        AgentStatus.model_validate(body)
    except ValidationError:
        return None
    return body
