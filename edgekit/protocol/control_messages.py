"""The deploy channel's messages: commands to an agent, its results and progress, its status, health reports.

One model per payload, used by both sides: ``edgekit.protocol.control`` builds commands and
results with them and validates what arrives into them; ``edgekit.deploy``'s health gate
reports with one.  As for telemetry, a model says what a receiver accepts: fields an older
agent may leave out are optional.  A command ignores fields it does not know; the other
messages keep them.  The JSON Schemas in ``edgekit/protocol/schema/`` are generated from
these models (``edgekit.protocol.schemas``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from edgekit.protocol.event_messages import EVENT_ID_PATTERN
from edgekit.protocol.telemetry_messages import CameraName, Count, Name, WireMessage

#: What a command may ask: change what runs (deploy, rollback), or read event proof (list, fetch one).
ACTIONS = ("deploy", "rollback", "list-proofs", "fetch-proof")
PROOF_ACTIONS = ("list-proofs", "fetch-proof")
#: The files of an event's proof an agent sends: the JPEG snapshot, the Motion JPEG AVI clip.
PROOF_FILES = ("snapshot", "clip")
ProofFile = Literal["snapshot", "clip"]
Action = Literal["deploy", "rollback", "list-proofs", "fetch-proof"]
#: The most proofs one ``list-proofs`` answer names (the newest).
MAX_LISTED = 200
MAX_URL_CHARS = 2048
MAX_SIGNATURE_CHARS = 4096
# Deploy ids name files (deploys/<id>.json): no separators, no "." or "..", no wildcards.
DEPLOY_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_SHA256 = r"^[0-9a-f]{64}$"
_BASE64 = r"^[A-Za-z0-9+/=_-]+$"
NONCE_PATTERN = r"^[A-Za-z0-9_-]{16,64}$"

#: A deploy id: 1-64 of ``A-Z a-z 0-9 . _ -``, starting with a letter or digit (safe as a file name).
DeployId = Annotated[str, Field(pattern=DEPLOY_ID_PATTERN)]


def check_url(url: str) -> str:
    """``url`` if it is a plain http(s) URL of at most ``MAX_URL_CHARS``; else ``ValueError`` saying why."""
    if len(url) > MAX_URL_CHARS or any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise ValueError(f"url {url[:80]!r} is too long or holds spaces or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as err:
        raise ValueError(f"url {url[:80]!r} is not a URL: {err}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        # file://, ftp://, data: ... would let a command read the device's own files or more.
        raise ValueError(f"url {url[:80]!r} is not an http(s) URL")
    return url


class Command(BaseModel):
    """A command for one agent (``edgekit/v1/<fleet>/<device>/cmd``, QoS 1): deploy, rollback, or proof.

    At most 16 KiB of UTF-8 JSON, no duplicate keys, no NaN.  Fields this version does not
    know are ignored, so a newer sender still reaches an older agent.  A deploy names the
    bundle archive (``url``, ``sha256``, ``size``); a deploy id is answered once: a replayed
    id returns the recorded outcome.

    ``signature`` is the sender's Ed25519 signature (base64) over the command's canonical
    JSON: the whole object as received, ``signature`` left out, keys sorted, no whitespace
    (``edgekit.protocol.control.signed_bytes``); ``expires_at`` and a random ``nonce`` make
    each signed command good once and for a while.  ``fleet`` and ``device`` say whom it is
    for, under the signature: a device id is unique only within its fleet.  An agent checks
    the signature against its trusted keys, and refuses unsigned commands unless run with
    ``--allow-unsigned-commands``.

    ``list-proofs`` and ``fetch-proof`` read the event proof the device keeps
    (``edgekit.protocol.proof_messages``): the newest ``limit`` proofs (of ``camera``), or one
    ``file`` of one ``event``; they change nothing, and are signed like the others.

    Versioning: ``fleet`` was added to ``edgekit/v1/cmd`` as a required field.  A newer sender
    still reaches an older agent (which ignores it, as it ignores every unknown field); a
    command from an older sender (no ``fleet``) is refused by a newer agent with a message
    that says so: upgrade the sender first, then the agents.
    """

    # Unlike the other messages, unknown fields are dropped: an agent acts only on what it knows.
    model_config = ConfigDict(
        strict=True,
        allow_inf_nan=False,
        extra="ignore",
        frozen=True,
        # What _names_what_it_needs checks, said in the schema.
        json_schema_extra={
            "allOf": [
                {
                    "if": {"properties": {"action": {"const": "deploy"}}},
                    "then": {
                        "required": ["url", "sha256", "size"],
                        "properties": {
                            "url": {"type": "string"},
                            "sha256": {"type": "string"},
                            "size": {"type": "integer"},
                        },
                    },
                },
                {
                    "if": {"properties": {"action": {"const": "fetch-proof"}}},
                    "then": {
                        "required": ["event", "file"],
                        "properties": {"event": {"type": "string"}, "file": {"type": "string"}},
                    },
                },
            ]
        },
    )

    schema_: Literal["edgekit/v1/cmd"] = Field(alias="schema")
    id: DeployId
    action: Action
    fleet: Name = Field(
        description="the fleet the command is for: signed with the rest, so a command signed for one "
        "fleet cannot be replayed onto a device of the same id in another"
    )
    device: Name
    url: Annotated[str, AfterValidator(check_url)] | None = Field(
        default=None,
        json_schema_extra={"pattern": r"^https?://[^\s]+$", "maxLength": MAX_URL_CHARS},
        description="the bundle archive, http(s) only (deploy)",
    )
    sha256: str | None = Field(default=None, pattern=_SHA256, description="the archive's SHA-256 (deploy)")
    size: int | None = Field(default=None, gt=0, description="the archive's size in bytes (deploy)")
    signature: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SIGNATURE_CHARS,
        pattern=_BASE64,
        description="Ed25519 signature (base64) over the canonical command JSON without this field",
    )
    issued_at: float | None = Field(default=None, ge=0, description="seconds since the epoch")
    expires_at: float | None = Field(
        default=None, ge=0, description="seconds since the epoch; an agent refuses the command after it"
    )
    nonce: str | None = Field(
        default=None, pattern=NONCE_PATTERN, description="random, once per command: a replay is refused"
    )

    event: str | None = Field(
        default=None, pattern=EVENT_ID_PATTERN, description="the event whose proof to send (fetch-proof)"
    )
    file: ProofFile | None = Field(default=None, description="which file of its proof (fetch-proof)")
    camera: CameraName | None = Field(default=None, description="only this camera's proofs (list-proofs)")
    limit: int | None = Field(
        default=None, ge=1, le=MAX_LISTED, description="at most this many, the newest (list-proofs)"
    )

    @model_validator(mode="after")
    def _names_what_it_needs(self) -> Command:
        if self.action == "fetch-proof":
            if self.event is None:
                raise ValueError("a fetch-proof command needs the proof's event")
            if self.file is None:
                raise ValueError("a fetch-proof command needs the proof's file")
        if self.action == "deploy":
            if self.url is None:
                raise ValueError("a deploy command needs the bundle's url")
            if self.sha256 is None:
                raise ValueError("a deploy command needs the bundle's sha256")
            if self.size is None:
                raise ValueError("a deploy command needs the bundle's size")
        return self

    def to_dict(self) -> dict[str, Any]:
        """The wire form (``schema`` first; absent optional fields left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def to_json(self) -> bytes:
        """The payload to publish."""
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()


class HealthDetection(WireMessage):
    """A detector's health gate numbers: its detections on the evaluation frames against the bundle's reference.

    The detection gate's rule (``edgekit.detection.agreement``): a reference detection is
    decisive when it scores well above the threshold; ``matched`` of them were found (same
    class, IoU >= 0.5), ``missed`` were not, ``extra`` are decisive detections the reference
    does not have.  ``mean_iou`` is over the matched pairs.
    """

    matched: Count
    decisive: Count
    missed: Count
    extra: Count
    mean_iou: float = Field(ge=0, le=1, description="mean IoU of the matched decisive detections")


class HealthReport(WireMessage):
    """What an agent's health gate measured of a bundle before activating it, and whether it passed.

    ``reason`` says why not (null when it passed).  Latencies are LoadGen's percentiles
    over ``runs`` timed frames; agreement is top-1 against the build's fp32 reference on the
    decisive frames, or for a detector the share of the reference's decisive detections
    matched, its numbers in ``detection`` (absent for a classifier, and from agents older than
    detection).  Only ``ok`` is certain: a gate that could not load the bundle has no numbers.
    """

    ok: bool
    p50_ms: float | None = None
    p99_ms: float | None = None
    budget_ms: float | None = None
    top1_agreement: float | None = Field(default=None, ge=0, le=1)
    threshold: float | None = Field(default=None, ge=0, le=1)
    frames: int = Field(default=0, ge=0)
    decisive_frames: int = Field(default=0, ge=0)
    runs: int = Field(default=0, ge=0)
    flipped: list[str] = Field(default_factory=list, description="frames whose top-1 changed")
    backend: str | None = None
    precision: str | None = None
    candidate: str | None = None
    load_ms: float | None = None
    reason: str | None = None
    detection: HealthDetection | None = Field(default=None, description="a detector's gate numbers")


class NoHealth(BaseModel):
    """No health report: the command ended before the health gate ran."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Result(WireMessage):
    """An agent's answer to a command (``edgekit/v1/<fleet>/<device>/cmd/result``, QoS 1).

    Progress steps (``final`` false, ``ok`` null, ``info`` saying how far) then one final
    outcome (``ok`` true or false).  ``id`` is null when a command was refused before its id
    could be read.  An agent sends every field but ``info``.
    """

    schema_: Literal["edgekit/v1/cmd-result"] = Field(alias="schema")
    id: DeployId | None = None
    device: Name
    action: Action | None = None
    step: str = Field(
        default="", description="command, download, signature, hashes, unpack, health, switch, done ..."
    )
    final: bool
    ok: bool | None = None
    reason: str = ""
    hint: str = ""
    health: HealthReport | NoHealth = Field(default_factory=NoHealth)
    version: str | None = Field(default=None, description="the bundle version the command installed or kept")
    replayed: bool = Field(default=False, description="an id handled before: its recorded outcome")
    ts: float | None = Field(default=None, description="seconds since the epoch")
    info: dict[str, Any] | None = None


class ActiveSlot(WireMessage):
    """The slot an agent runs from, and what is installed in it."""

    slot: str | None = None
    model: str | None = None
    version: str | None = None
    deploy_id: str | None = None


class AgentStatus(WireMessage):
    """A deploy agent's status (``edgekit/v1/<fleet>/<device>/agent``, retained; its Last Will says offline).

    Online, it says what is installed and active, its group and profile, the pipeline's state
    and the command it is busy with.
    """

    schema_: Literal["edgekit/v1/agent"] = Field(alias="schema")
    state: Literal["online", "offline"]
    device: Name
    fleet: Name | None = None
    group: str | None = None
    profile: str | None = None
    ts: float | None = Field(default=None, description="seconds since the epoch")
    session: str | None = None
    edgekit: str | None = Field(default=None, description="the agent's edgekit version")
    active: ActiveSlot | None = None
    slots: dict[str, Any] | None = Field(default=None, description="the state root's slots")
    pipeline: Literal["running", "starting", "backoff", "stopped", "none"] | None = None
    busy: str | None = Field(default=None, description="the deploy id being handled")
    dropped: int | None = Field(
        default=None, ge=0, description="commands dropped since the agent started (its queue was full)"
    )
