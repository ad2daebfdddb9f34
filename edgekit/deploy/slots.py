"""The device's state root: trusted keys, A/B slots, the ``active`` symlink, deploy records, one lock.

Layout (default ``/var/lib/edgekit``)::

    keys/*.pub.pem       trusted bundle-signing keys (``edgekit agent trust KEY.pub.pem``)
    slots/a/, slots/b/   each: bundle/ (an unpacked, verified bundle) + slot.json, written LAST
    active -> slots/a    symlink, swapped atomically
    deploys/<id>.json    the outcome of each deploy id (a replayed id returns it)
    floor.json           the anti-rollback floor (also kept in each slot.json: edgekit.deploy.floor)
    state.json           the last operation and its health numbers
    incoming/            downloads in progress (the MQTT agent's)
    proofs/              event proof the pipeline child writes (edgekit.deploy.agent_proofs)
    agent.lock           flock: one install, rollback or recovery at a time

Crash safety rests on three rules.  A slot is *complete* only when its ``slot.json`` exists,
and ``slot.json`` is written (atomically, fsynced) only after the bundle beside it is
fully written, fsynced and verified; an install removes the inactive slot's ``slot.json``
before it touches anything else there.  The ``active`` link only ever changes by
``os.replace`` of a new link made beside it, followed by an fsync of the root folder, so
it names the old slot or the new one, never nothing.  And an install only ever writes
into the slot ``active`` does not name.  ``recover()`` then has little to do: delete
temp files, empty incomplete slots, and move ``active`` off a slot that is damaged (onto
the other slot only when its bundle is not below the floor: damage is no way to roll back).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# TMP_MARK: every temp name of ours starts with "." and holds it, so recover() deletes them.
from edgekit.core.io import TMP_MARK, fsync_dir, remove_tree, sha256_file, write_atomic
from edgekit.errors import DeployError

log = logging.getLogger(__name__)

DEFAULT_ROOT = Path("/var/lib/edgekit")
SLOTS = ("a", "b")
SLOT_FILE = "slot.json"
BUNDLE_DIR = "bundle"
ACTIVE = "active"
STATE_FILE = "state.json"
LOCK_FILE = "agent.lock"
MAX_STATE_BYTES = 1 << 20  # our own JSON files are a few kB; anything bigger is damage


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``write_atomic`` of ``data`` as indented JSON."""
    write_atomic(path, (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode())


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file of ours, or None when it is missing, too big, not JSON or not an object."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_STATE_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    if len(data) > MAX_STATE_BYTES:
        return None
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def fsync_tree(folder: Path) -> None:
    """fsync every file and folder under ``folder`` (so ``slot.json`` never outlives its bundle on power loss)."""
    for root, dirs, files in os.walk(folder):
        for name in files:
            fd = os.open(Path(root, name), os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for name in dirs:
            fsync_dir(Path(root, name))
    fsync_dir(folder)


def now_iso() -> str:
    """The time now, UTC, to the second, ISO 8601."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


@dataclass(frozen=True)
class SlotInfo:
    """A complete slot's ``slot.json``: which deploy put which bundle there, and its health numbers."""

    deploy_id: str
    model: str
    version: str
    manifest_sha256: str
    installed_at: str
    health: dict[str, Any] = field(default_factory=dict)
    serial: int = 0  # the bundle's signed serial, and the device's floor after this install:
    floor: int = 0  # one of the places the floor is kept (edgekit.deploy.floor)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, as written to ``slot.json``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> SlotInfo | None:
        """The info in ``doc``, or None when a field is missing or of the wrong type (a damaged file)."""
        strings = ("deploy_id", "model", "version", "manifest_sha256", "installed_at")
        if not all(isinstance(doc.get(k), str) for k in strings):
            return None
        health = doc.get("health", {})
        if not isinstance(health, dict):
            return None

        def number(key: str) -> int:  # absent from a slot.json written before floors: 0
            value = doc.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

        return cls(
            **{k: doc[k] for k in strings}, health=health, serial=number("serial"), floor=number("floor")
        )


class StateRoot:
    """A device's deploy state under one folder; creates the layout.  Methods are safe across processes."""

    def __init__(self, path: Path = DEFAULT_ROOT) -> None:
        self.path = Path(path).absolute()
        try:
            for sub in ("keys", "slots", "deploys", "incoming", *(f"slots/{s}" for s in SLOTS)):
                (self.path / sub).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise DeployError(
                f"cannot create the state root {self.path}: {err.strerror or err}",
                "run as the agent's user, or pass a writable --root",
            ) from err

    # -- paths ---------------------------------------------------------------------

    @property
    def keys_dir(self) -> Path:
        return self.path / "keys"

    @property
    def deploys_dir(self) -> Path:
        return self.path / "deploys"

    @property
    def incoming(self) -> Path:
        return self.path / "incoming"

    @property
    def state_file(self) -> Path:
        return self.path / STATE_FILE

    @property
    def active_link(self) -> Path:
        return self.path / ACTIVE

    def slot_dir(self, slot: str) -> Path:
        """``slots/<slot>`` (``a`` or ``b``)."""
        if slot not in SLOTS:
            raise ValueError(f"no slot {slot!r}")
        return self.path / "slots" / slot

    def slot_bundle(self, slot: str) -> Path:
        """The bundle folder of ``slot`` (which may be absent or incomplete)."""
        return self.slot_dir(slot) / BUNDLE_DIR

    @staticmethod
    def other(slot: str | None) -> str:
        """The slot an install writes into when ``slot`` is active (``a`` when none is)."""
        return "b" if slot == "a" else "a"

    def trusted_keys(self) -> list[Path]:
        """The public keys this device trusts, sorted by name; none from a store the agent's user could change."""
        from edgekit.deploy.keystore import check_trust_store

        try:
            check_trust_store(self.path, self.keys_dir)  # the system root's keys are root's
        except DeployError as err:
            log.error("%s (%s)", err.message, err.hint)
            return []
        return sorted(p for p in self.keys_dir.glob("*.pub.pem") if p.is_file())

    # -- the lock --------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, timeout: float = 600.0) -> Iterator[None]:
        """Hold ``agent.lock`` (flock; the kernel drops it when a holder dies, even by SIGKILL)."""
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as err:
                    if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                    if time.monotonic() >= deadline:
                        raise DeployError(
                            f"another install or rollback holds {self.path / LOCK_FILE} (waited {timeout:g} s)",
                            "wait for it to finish, then try again",
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # closing drops the flock

    # -- reading state -----------------------------------------------------------------

    def active(self) -> str | None:
        """The slot ``active`` names (``a``/``b``), or None when there is no link or it names something else."""
        try:
            target = str(self.active_link.readlink())
        except OSError:
            return None
        name = target.rstrip("/").split("/")
        if len(name) == 2 and name[0] == "slots" and name[1] in SLOTS:
            return name[1]
        return None

    def slot_info(self, slot: str) -> SlotInfo | None:
        """The slot's ``slot.json`` if the slot is complete (marker present, parses, bundle folder there)."""
        doc = read_json(self.slot_dir(slot) / SLOT_FILE)
        if doc is None:
            return None
        info = SlotInfo.from_dict(doc)
        if info is None or not self.slot_bundle(slot).is_dir():
            return None
        return info

    def verify_slot(self, slot: str) -> tuple[bool, str]:
        """``(ok, why not)``: the slot is complete, and its bundle verifies (every hash, a trusted signature).

        Also checks that the manifest is the one ``slot.json`` recorded, so a slot cannot
        be swapped under its marker.
        """
        from edgekit.bundle import MANIFEST_FILE, verify
        from edgekit.errors import EdgekitError

        info = self.slot_info(slot)
        if info is None:
            return False, "incomplete (no valid slot.json, or no bundle)"
        bundle = self.slot_bundle(slot)
        try:
            if sha256_file(bundle / MANIFEST_FILE) != info.manifest_sha256:
                return False, "its manifest is not the one slot.json recorded"
            report = verify(bundle, self.trusted_keys(), require_signature=True)
        except (OSError, EdgekitError) as err:
            return False, str(getattr(err, "message", err))
        if not report.ok:
            return False, "; ".join(f"{c.name}: {c.detail}" for c in report.failures)
        return True, ""

    def active_bundle(self) -> Path | None:
        """The active slot's bundle folder (its real path, stable across later switches), or None."""
        slot = self.active()
        if slot is None or self.slot_info(slot) is None:
            return None
        return self.slot_bundle(slot)

    def last_state(self) -> dict[str, Any] | None:
        """``state.json``: the last install or rollback, or None before the first."""
        return read_json(self.state_file)

    def deploy_record(self, deploy_id: str) -> dict[str, Any] | None:
        """The recorded outcome of ``deploy_id`` (an install or rollback), or None."""
        return read_json(self.deploys_dir / f"{deploy_id}.json")

    def status(self) -> dict[str, Any]:
        """Plain data: the active slot, each slot's deploy and version, the last operation's outcome and health."""
        from edgekit.bundle.keys import key_id, load_public_key
        from edgekit.errors import EdgekitError

        active = self.active()
        slots: dict[str, Any] = {}
        for slot in SLOTS:
            info = self.slot_info(slot)
            slots[slot] = (
                {"complete": True, "active": slot == active, **info.to_dict()}
                if info
                else {"complete": False, "active": slot == active}
            )
        keys: list[dict[str, Any]] = []
        for p in self.trusted_keys():
            try:
                keys.append({"file": p.name, "key_id": key_id(load_public_key(p))})
            except EdgekitError as err:
                keys.append({"file": p.name, "key_id": None, "error": err.message})
        active_info = slots.get(active or "", {})
        return {
            "root": str(self.path),
            "active": active if active and slots[active]["complete"] else None,
            "model": active_info.get("model"),
            "version": active_info.get("version"),
            "deploy_id": active_info.get("deploy_id"),
            "health": active_info.get("health"),
            "slots": slots,
            "last": self.last_state(),
            "trusted_keys": keys,
        }

    # -- changing state ----------------------------------------------------------------

    def mark_incomplete(self, slot: str) -> None:
        """Remove the slot's ``slot.json`` (durably): from now on nothing treats the slot as complete."""
        marker = self.slot_dir(slot) / SLOT_FILE
        if marker.exists() or marker.is_symlink():
            marker.unlink()
            fsync_dir(self.slot_dir(slot))

    def clear_slot(self, slot: str) -> None:
        """Mark the slot incomplete, then delete everything in it."""
        self.mark_incomplete(slot)
        folder = self.slot_dir(slot)
        for child in folder.iterdir():
            remove_tree(child)
        fsync_dir(folder)

    def write_slot_info(self, slot: str, info: SlotInfo) -> None:
        """Write ``slot.json``: the last write of an install into a slot, which makes the slot complete."""
        write_json(self.slot_dir(slot) / SLOT_FILE, info.to_dict())

    def switch(self, slot: str) -> None:
        """Point ``active`` at ``slot`` atomically: a new link beside it, ``os.replace``, fsync the root."""
        tmp = self.path / f".{ACTIVE}{TMP_MARK}{secrets.token_hex(4)}"
        tmp.symlink_to(f"slots/{slot}")
        try:
            os.replace(tmp, self.active_link)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(self.path)

    def record(self, deploy_id: str, result: dict[str, Any]) -> None:
        """Record a deploy id's outcome (for replays) and make it the last operation in ``state.json``."""
        write_json(self.deploys_dir / f"{deploy_id}.json", result)
        write_json(self.state_file, {**result, "at": now_iso()})

    def clean_temps(self) -> list[str]:
        """Delete temp files and folders of ours that a killed operation left (never ``incoming/`` downloads)."""
        removed: list[str] = []
        places = [self.path, self.deploys_dir, self.keys_dir, *(self.slot_dir(s) for s in SLOTS)]
        for place in places:
            for child in place.iterdir():
                if child.name.startswith(".") and (TMP_MARK in child.name or ".unpack-" in child.name):
                    remove_tree(child)
                    removed.append(str(child.relative_to(self.path)))
        return removed
