"""The agent's side of event proof: list what the pipeline child wrote, read one file to send.

The child (``edgekit run --proof-dir``) writes each event's snapshot and clip under
``<state root>/proofs`` (``edgekit.events.proof_store``: ``<camera>/<YYYYMMDD>/<event id>.{jpg,avi,json}``,
whole or not at all, with retention by age and size).  The agent only reads there, for the
``list-proofs`` and ``fetch-proof`` commands (``edgekit.protocol.proof_messages``).

A command names an event by its id and a file by its kind, never a path: the id must be a
lower-case UUID (the command's model refuses anything else: no separator, no ``..``), the
file is the id plus the kind's suffix, and it is found only at ``<camera>/<day>/`` depth under
the proof folder.  What is found must be a regular file, not a link, inside the folder once
resolved, and within its kind's cap.  A temp file (``.<name>.tmp-…``, still being written)
cannot be named at all.  Each refusal says why (``ProofRefused.step``: ``not-found``,
``too-large``, ``refused``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from edgekit.errors import DeployError
from edgekit.events.proof_store import list_proofs
from edgekit.protocol.event_messages import EVENT_ID_PATTERN
from edgekit.protocol.proof_messages import (
    CHUNK_BYTES,
    MAX_LISTED,
    MAX_PROOF_BYTES,
    PROOF_SUFFIX,
    ProofItem,
    proof_chunk_message,
)

#: The proof folder in the agent's state root: the child writes it, the agent reads it.
PROOF_DIR = "proofs"
_EVENT_ID = re.compile(EVENT_ID_PATTERN)


class ProofRefused(DeployError):
    """A proof the agent will not send; ``step`` says which kind of no it is (the result's ``step``)."""

    def __init__(self, step: str, message: str, hint: str = "") -> None:
        super().__init__(message, hint)
        self.step = step


def _size(path: Path | None) -> int | None:
    try:
        return path.stat().st_size if path is not None else None
    except OSError:  # removed by retention since it was listed
        return None


def proof_items(
    root: Path, camera: str | None = None, limit: int = MAX_LISTED
) -> tuple[list[dict[str, Any]], bool]:
    """The newest ``limit`` proofs under ``root`` (of ``camera``), newest first, as ``ProofItem`` bodies; and
    whether there are more.  A proof whose names a receiver would refuse (a file someone else put
    there) is left out, not sent to break the whole list."""
    entries = list_proofs(root, camera)
    newest = entries[::-1][: max(1, min(limit, MAX_LISTED))]
    items = []
    for e in newest:
        item: dict[str, Any] = {"event": e.event_id, "camera": e.camera, "kind": e.kind, "t": e.t}
        item |= {"snapshot": _size(e.snapshot), "clip": _size(e.clip)}
        try:
            ProofItem.model_validate(item)
        except ValidationError:
            continue
        items.append(item)
    return items, len(entries) > len(newest)


def read_proof(root: Path, event: str, file: str) -> bytes:
    """The bytes of ``file`` (``snapshot`` or ``clip``) of ``event``'s proof under ``root``; ``ProofRefused`` if not."""
    if not _EVENT_ID.fullmatch(event) or file not in PROOF_SUFFIX:
        raise ProofRefused(
            "refused",
            f"{event[:80]!r} / {file[:20]!r} names no proof file",
            "an event id and snapshot or clip",
        )
    name = f"{event}{PROOF_SUFFIX[file]}"
    found = sorted(root.glob(f"*/*/{name}")) if root.is_dir() else []
    if not found:
        raise ProofRefused(
            "not-found",
            f"no {file} of event {event} on this device",
            "it was never written (no proof folder, or a clip still waiting for its post-roll) "
            "or retention removed it",
        )
    path = found[0]
    base = root.resolve()
    if not path.resolve().is_relative_to(base) or path.parent.resolve().parent.parent != base:
        raise ProofRefused("refused", f"the {file} of event {event} is outside the proof folder", "")
    cap = MAX_PROOF_BYTES[file]
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as err:  # a link (ELOOP), or removed by retention just now
        raise ProofRefused(
            "refused", f"the {file} of event {event} cannot be read: {err.strerror}", ""
        ) from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ProofRefused("refused", f"the {file} of event {event} is not a plain file", "")
        if info.st_size > cap:
            raise ProofRefused(
                "too-large",
                f"the {file} of event {event} is {info.st_size} bytes, over the {cap} a {file} may be",
                "it stays on the device (a shorter post-roll or a smaller frame makes smaller clips)",
            )
        data = f.read(cap + 1)
    if not data or len(data) > cap:
        raise ProofRefused("refused", f"the {file} of event {event} is empty or changed while read", "")
    return data


def chunks(device: str, command_id: str, event: str, file: str, data: bytes) -> Iterator[dict[str, Any]]:
    """The ``ProofChunk`` bodies of ``data``, in order."""
    digest = hashlib.sha256(data).hexdigest()
    for index, start in enumerate(range(0, len(data), CHUNK_BYTES)):
        piece = base64.b64encode(data[start : start + CHUNK_BYTES]).decode("ascii")
        yield proof_chunk_message(device, command_id, event, file, index, len(data), digest, piece)
