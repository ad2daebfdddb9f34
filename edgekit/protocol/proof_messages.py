"""Event proof on the deploy channel: what an agent says it keeps, and one proof file sent in chunks.

A proof (a JPEG snapshot with the boxes drawn, maybe a Motion JPEG AVI clip; ``edgekit.events``)
stays on the device.  The fleet server asks the device's agent for it, on demand, with a signed
command, and the answer comes back on ``cmd/result`` (an agent may write there already: no new
ACL line, no new topic)::

    cmd  list-proofs  (camera, limit)   ->  one ProofList, then the final Result
    cmd  fetch-proof  (event, file)     ->  ProofChunk 0 .. count-1, then the final Result
                                            (ok, or not with ``step`` not-found / too-large / refused)

Bounds, so that neither side can be made to hold more than it means to:

- a chunk carries at most ``CHUNK_BYTES`` (192 KiB) of the file, ``MAX_CHUNK_CHARS`` (256 KiB)
  of base64: a quarter of the packet the fleet's collector still reads whole;
- a snapshot is at most ``MAX_PROOF_BYTES["snapshot"]`` (4 MiB: a 4K frame at quality 80 is
  ~1-2 MB), a clip ``MAX_PROOF_BYTES["clip"]`` (32 MiB: the writer's 5 s of 720p Motion JPEG is
  ~5-10 MB; past the cap a clip is refused, never cut, since a cut AVI has no index and does not
  play);
- a list names at most ``MAX_LISTED`` proofs, the newest.

The receiver checks every chunk against the first (the same size, count and SHA-256), the
total against ``size`` and ``sha256``, and the first bytes against the file's kind
(``has_magic``) before it shows anything (``edgekit.protocol.control.parse_answer`` reads them).
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal

from pydantic import Field

from edgekit.protocol.control_messages import MAX_LISTED, PROOF_FILES, DeployId, ProofFile
from edgekit.protocol.event_messages import EVENT_ID_PATTERN
from edgekit.protocol.telemetry_messages import CameraName, Count, Name, WireMessage
from edgekit.protocol.topics import SCHEMA_PROOF_CHUNK, SCHEMA_PROOF_LIST

KiB, MiB = 1 << 10, 1 << 20
CHUNK_BYTES = 192 * KiB
MAX_CHUNK_CHARS = 4 * CHUNK_BYTES // 3  # base64 of a full chunk: 256 KiB
MAX_PROOF_BYTES: dict[str, int] = {"snapshot": 4 * MiB, "clip": 32 * MiB}
PROOF_SUFFIX: dict[str, str] = {"snapshot": ".jpg", "clip": ".avi"}
PROOF_MEDIA: dict[str, str] = {"snapshot": "image/jpeg", "clip": "video/x-msvideo"}
#: The most a cmd/result message of a proof command may be: a full chunk and its fields.
MAX_ANSWER_BYTES = MAX_CHUNK_CHARS + 4 * KiB
_SHA256 = r"^[0-9a-f]{64}$"

__all__ = [
    "CHUNK_BYTES",
    "MAX_ANSWER_BYTES",
    "MAX_CHUNK_CHARS",
    "MAX_LISTED",
    "MAX_PROOF_BYTES",
    "PROOF_FILES",
    "PROOF_MEDIA",
    "PROOF_SUFFIX",
    "ProofChunk",
    "ProofItem",
    "ProofList",
    "chunk_count",
    "has_magic",
    "proof_chunk_message",
    "proof_list_message",
]


class ProofItem(WireMessage):
    """One event's proof on the device: when and where, and the size of each file it has."""

    event: str = Field(pattern=EVENT_ID_PATTERN)
    camera: CameraName
    kind: str = Field(default="", max_length=32, description="enter, leave, dwell, cross, present, count")
    t: float = Field(ge=0, description="the event's capture time, seconds since the epoch")
    snapshot: Count | None = Field(
        default=None, description="the snapshot's size in bytes (none: no snapshot)"
    )
    clip: Count | None = Field(default=None, description="the clip's size in bytes (none: no clip)")


class ProofList(WireMessage):
    """An agent's answer to ``list-proofs`` (on ``cmd/result``): its newest proofs, newest first."""

    schema_: Literal["edgekit/v1/proof-list"] = Field(alias="schema")
    id: DeployId
    device: Name
    proofs: list[ProofItem] = Field(max_length=MAX_LISTED)
    more: bool = Field(default=False, description="the device keeps older proofs than these")
    ts: float | None = Field(default=None, description="seconds since the epoch")


class ProofChunk(WireMessage):
    """One piece of a proof file, an answer to ``fetch-proof`` (on ``cmd/result``, in order)."""

    schema_: Literal["edgekit/v1/proof-chunk"] = Field(alias="schema")
    id: DeployId
    device: Name
    event: str = Field(pattern=EVENT_ID_PATTERN)
    file: ProofFile
    index: int = Field(ge=0, description="this chunk's place, from 0")
    count: int = Field(ge=1, description="how many chunks the file is")
    size: int = Field(ge=1, le=max(MAX_PROOF_BYTES.values()), description="the whole file's size in bytes")
    sha256: str = Field(pattern=_SHA256, description="the whole file's SHA-256")
    data: str = Field(max_length=MAX_CHUNK_CHARS, pattern=r"^[A-Za-z0-9+/]*={0,2}$", description="base64")


def chunk_count(size: int) -> int:
    """How many chunks a file of ``size`` bytes travels in."""
    return max(1, math.ceil(size / CHUNK_BYTES))


def has_magic(file: str, data: bytes) -> bool:
    """``data`` starts as its kind must: a JPEG (``FF D8 FF``), or a RIFF file of form ``AVI ``."""
    if file == "snapshot":
        return data[:3] == b"\xff\xd8\xff"
    return data[:4] == b"RIFF" and data[8:12] == b"AVI "


def proof_list_message(
    device: str, command_id: str, proofs: list[dict[str, Any]], more: bool
) -> dict[str, Any]:
    """The ``ProofList`` body an agent publishes."""
    body: dict[str, Any] = {"schema": SCHEMA_PROOF_LIST, "id": command_id, "device": device, "proofs": proofs}
    body |= {"more": more, "ts": round(time.time(), 3)}
    ProofList.model_validate(body)  # a sender sends nothing a receiver refuses
    return body


def proof_chunk_message(
    device: str, command_id: str, event: str, file: str, index: int, size: int, sha256: str, data: str
) -> dict[str, Any]:
    """The ``ProofChunk`` body of chunk ``index`` (``data``: its base64) of a ``size``-byte file."""
    body: dict[str, Any] = {"schema": SCHEMA_PROOF_CHUNK, "id": command_id, "device": device}
    body |= {"event": event, "file": file, "index": index, "count": chunk_count(size)}
    body |= {"size": size, "sha256": sha256, "data": data}
    ProofChunk.model_validate(body)
    return body
