"""Install a bundle into the inactive slot, health-gate it, switch to it; or roll back to the other slot.

Steps of an install, each reported through ``progress(step, info)`` as it starts:

``signature``  ``manifest.json`` and ``manifest.sig`` (only those: read from the head of
               an archive) checked against the root's trusted keys; a signature is required.
               The signed serial (``build.serial``; 0 when absent) must not be below the
               root's floor, the highest serial it installed, and a bundle at the floor
               must be one it took there (the same manifest), unless ``allow_downgrade``
               (a local operator's ``edgekit agent install --allow-downgrade``).  The floor
               is kept redundantly (``edgekit.deploy.floor``), raised at each switch.
``hashes``     every file checked against the signed manifest's SHA-256 and size, no file
               missing or extra, no link or odd member — for an archive while streaming
               it, so nothing received touches the disk before it is known to be right.
``unpack``     the inactive slot's ``slot.json`` removed first, then its bundle replaced
               (safe unpack or copy), fsynced, and verified again where it now lies.
``health``     ``edgekit.load`` with the profile's selection, warm-up, the bundle's
               evaluation frames: p99 within budget, top-1 agreement with the reference.
``switch``     ``slot.json`` written (the slot is now complete), ``active`` swapped
               atomically, the outcome recorded under the deploy id.
``done``       finished.

A failure returns ``InstallResult(ok=False, step=..., reason=..., hint=...)`` and leaves
the active slot as it was; only a broken state root or a lock held too long raises
(``DeployError``).  A deploy id seen before returns its recorded outcome (``replayed``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.core.io import TMP_MARK, fsync_dir, remove_tree
from edgekit.deploy.bundle_checks import REBUILD, StepFailed, check_hashes, check_signature
from edgekit.deploy.floor import Floor, keep_floor, write_floor
from edgekit.deploy.health import DEFAULT_RUNS, check_health
from edgekit.deploy.slots import SlotInfo, StateRoot, fsync_tree, now_iso
from edgekit.errors import EdgekitError
from edgekit.protocol.control import check_deploy_id

if TYPE_CHECKING:
    from edgekit.bundle.manifest import Manifest

log = logging.getLogger(__name__)

STEPS = ("signature", "hashes", "unpack", "health", "switch", "done")
ROLLBACK_STEPS = ("verify", "switch", "done")

Progress = Callable[[str, dict[str, Any]], None]
"""``progress(step, info)``: called as each step starts (``info`` is plain JSON-able data)."""


@dataclass(frozen=True)
class InstallResult:
    """How an install (or rollback) went: ``ok``; else the failed ``step``, its ``reason`` and a ``hint``."""

    ok: bool
    deploy_id: str
    step: str
    reason: str = ""
    hint: str = ""
    health: dict[str, Any] | None = None
    slot: str | None = None
    version: str | None = None
    model: str | None = None
    action: str = "install"
    replayed: bool = False
    elapsed_s: float | None = None
    active: str | None = None  # the slot active afterwards
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (what ``--json`` prints as ``{"result": ...}`` and ``deploys/<id>.json`` holds)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> InstallResult | None:
        """A result read back from a record, or None when the record is damaged."""
        names = set(cls.__dataclass_fields__)
        if not isinstance(doc.get("ok"), bool) or not isinstance(doc.get("deploy_id"), str):
            return None
        try:
            return cls(**{k: v for k, v in doc.items() if k in names})
        except TypeError:
            return None


def _nothing(step: str, info: dict[str, Any]) -> None:
    pass


def _replayed(root: StateRoot, deploy_id: str) -> InstallResult | None:
    doc = root.deploy_record(deploy_id)
    if doc is not None:
        found = InstallResult.from_dict(doc)
        if found is not None:
            return replace(found, replayed=True)
    # Killed between the switch and the record: the active slot says which deploy put it there.
    active = root.active()
    info = root.slot_info(active) if active else None
    if info is not None and info.deploy_id == deploy_id:
        result = InstallResult(
            True,
            deploy_id,
            "done",
            health=info.health,
            slot=active,
            version=info.version,
            model=info.model,
            active=active,
        )
        root.record(deploy_id, result.to_dict())
        return replace(result, replayed=True)
    return None


def install(
    root: StateRoot,
    bundle: Path,
    deploy_id: str,
    profile: str | None = None,
    progress: Progress | None = None,
    *,
    health_runs: int = DEFAULT_RUNS,
    lock_timeout: float = 600.0,
    budget_ms: float | None = None,
    allow_downgrade: bool = False,
) -> InstallResult:
    """Install the bundle folder or ``.tar.gz`` ``bundle`` into ``root``'s inactive slot and switch to it.

    ``profile`` is the device profile whose selection the health gate loads with (None:
    detect this host).  ``health_runs`` is how many frames the gate times; ``budget_ms`` the
    budget it holds p99 to when the device runs at another than the bundle's.
    ``allow_downgrade`` installs a bundle whose serial is below the floor (a local operator's
    choice; nothing from the network sets it).  See the module docstring for the steps.  Raises ``DeployError`` only for a bad deploy id, an unusable
    state root or a lock held longer than ``lock_timeout`` seconds.
    """
    check_deploy_id(deploy_id)
    report = progress or _nothing
    with root.lock(lock_timeout):
        replayed = _replayed(root, deploy_id)
        if replayed is not None:
            return replayed
        root.clean_temps()
        started = time.monotonic()
        active = root.active()
        target = root.other(active)
        manifest: Manifest | None = None
        try:
            keys = root.trusted_keys()
            report("signature", {"bundle": str(bundle), "slot": target})
            data, sig, manifest = check_signature(bundle, keys)
            digest = hashlib.sha256(data).hexdigest()
            floor = keep_floor(root, keys)  # before the target slot is touched: what it holds counts
            refused = floor.refusal(manifest.build.serial, digest)
            if refused is not None and not allow_downgrade:
                raise StepFailed("signature", *refused)
            raised = floor.after(manifest.build.serial, digest)
            report("hashes", {"files": len(manifest.files())})
            check_hashes(bundle, manifest)
            report("unpack", {"slot": target})
            _unpack(root, target, bundle, data, sig, manifest, keys)
            report("health", {"slot": target, "profile": profile or "auto", "runs": health_runs})
            health = check_health(
                root.slot_bundle(target), profile, keys, runs=health_runs, budget_ms=budget_ms
            )
            if not health.ok:
                root.clear_slot(target)  # free the space: a bundle that failed its gate is never used
                raise StepFailed("health", health.reason, health.hint, health.to_dict())
            report("switch", {"slot": target})
            _switch(root, target, deploy_id, manifest, health.to_dict(), raised)
            write_floor(root, raised)  # after the switch; slot.json already holds it (redundancy)
        except StepFailed as failed:
            result = InstallResult(
                False,
                deploy_id,
                failed.step,
                failed.reason,
                failed.hint,
                health=failed.health,
                slot=target,
                version=manifest.model.version if manifest else None,
                model=manifest.model.name if manifest else None,
                elapsed_s=round(time.monotonic() - started, 3),
                active=root.active(),
            )
            root.record(deploy_id, result.to_dict())
            return result
        result = InstallResult(
            True,
            deploy_id,
            "done",
            health=health.to_dict(),
            slot=target,
            version=manifest.model.version,
            model=manifest.model.name,
            elapsed_s=round(time.monotonic() - started, 3),
            active=target,
        )
        root.record(deploy_id, result.to_dict())
        report("done", {"slot": target, "version": manifest.model.version, "health": health.to_dict()})
        return result


def rollback(
    root: StateRoot, deploy_id: str, progress: Progress | None = None, *, lock_timeout: float = 600.0
) -> InstallResult:
    """Switch back to the other slot, if it holds a complete bundle that still verifies.

    Steps ``verify``, ``switch``, ``done``.  No health gate: the other slot passed its own
    when it was installed.  Idempotent per ``deploy_id`` like ``install``.
    """
    check_deploy_id(deploy_id)
    report = progress or _nothing
    with root.lock(lock_timeout):
        replayed = _replayed(root, deploy_id)  # an id names one command, whatever its action
        if replayed is not None:
            return replayed
        root.clean_temps()
        started = time.monotonic()
        active = root.active()
        target = root.other(active)
        info = root.slot_info(target)
        report("verify", {"slot": target})
        ok, why = root.verify_slot(target)
        if active is None or not ok or info is None:
            reason = (
                "no bundle is active, so there is nothing to roll back from"
                if active is None
                else f"slot {target} holds nothing to roll back to: {why}"
            )
            result = InstallResult(
                False,
                deploy_id,
                "verify",
                reason,
                "deploy a bundle instead (edgekit deploy / edgekit agent install)",
                action="rollback",
                slot=target,
                elapsed_s=round(time.monotonic() - started, 3),
                active=active,
            )
            root.record(deploy_id, result.to_dict())
            return result
        report("switch", {"slot": target})
        root.switch(target)
        result = InstallResult(
            True,
            deploy_id,
            "done",
            health=info.health,
            slot=target,
            version=info.version,
            model=info.model,
            action="rollback",
            elapsed_s=round(time.monotonic() - started, 3),
            active=target,
            extra={"rolled_back_from": active},
        )
        root.record(deploy_id, result.to_dict())
        report("done", {"slot": target, "version": info.version})
        return result


# -- unpack --------------------------------------------------------------------------------


def _unpack(
    root: StateRoot,
    slot: str,
    bundle: Path,
    data: bytes,
    sig: bytes | None,
    manifest: Manifest,
    keys: list[Path],
) -> None:
    """Replace the inactive slot's bundle; ``slot.json`` goes first, so a kill leaves an incomplete slot."""
    from edgekit.bundle import MANIFEST_FILE, unpack, verify

    root.mark_incomplete(slot)
    dest = root.slot_bundle(slot)
    try:
        remove_tree(dest)
        if bundle.is_dir():
            _copy_listed(bundle, dest, data, sig, manifest)
        else:
            unpack(bundle, dest)
        fsync_tree(dest)
        fsync_dir(dest.parent)
        unpacked = (dest / MANIFEST_FILE).read_bytes()
        report = verify(dest, keys, require_signature=True)
    except EdgekitError as err:
        remove_tree(dest)
        raise StepFailed("unpack", err.message, err.hint) from err
    except OSError as err:
        remove_tree(dest)
        raise StepFailed(
            "unpack", f"cannot write slot {slot}: {err}", "check free space under the state root"
        ) from err
    if unpacked != data:  # the archive was read again to unpack: it must be the bundle checked
        remove_tree(dest)
        raise StepFailed("unpack", f"{bundle} changed while it was installed (another manifest)", REBUILD)
    if not report.ok:
        remove_tree(dest)
        raise StepFailed(
            "unpack",
            "the unpacked bundle does not verify: "
            + "; ".join(f"{c.name}: {c.detail}" for c in report.failures),
            REBUILD,
        )


def _copy_listed(src: Path, dest: Path, data: bytes, sig: bytes | None, manifest: Manifest) -> None:
    """Copy exactly the files the manifest lists (hashing as they go), and the checked manifest bytes."""
    import secrets

    from edgekit.bundle import MANIFEST_FILE, SIGNATURE_FILE
    from edgekit.bundle._fs import copy_hashed
    from edgekit.bundle.integrity import digest_mismatch

    tmp = dest.with_name(f".{dest.name}{TMP_MARK}{secrets.token_hex(4)}")
    tmp.mkdir()
    try:
        for rel, entry in manifest.files().items():
            out = tmp / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            digest, size = copy_hashed(src / rel, out)
            if digest_mismatch(digest, size, entry) is not None:
                raise StepFailed("unpack", f"{rel} changed while it was copied", REBUILD)
        (tmp / MANIFEST_FILE).write_bytes(data)
        if sig is not None:
            (tmp / SIGNATURE_FILE).write_bytes(sig)
        tmp.rename(dest)
    except BaseException:
        remove_tree(tmp)
        raise


# -- switch --------------------------------------------------------------------------------


def _switch(
    root: StateRoot, slot: str, deploy_id: str, manifest: Manifest, health: dict[str, Any], floor: Floor
) -> None:
    info = SlotInfo(
        deploy_id=deploy_id,
        model=manifest.model.name,
        version=manifest.model.version,
        manifest_sha256=hashlib.sha256(manifest_bytes(root, slot)).hexdigest(),
        installed_at=now_iso(),
        health=health,
        serial=manifest.build.serial,
        floor=floor.serial,
    )
    try:
        root.write_slot_info(slot, info)
        root.switch(slot)
    except OSError as err:
        raise StepFailed(
            "switch", f"cannot switch to slot {slot}: {err}", "check the state root's disk"
        ) from err


def manifest_bytes(root: StateRoot, slot: str) -> bytes:
    """The manifest.json bytes in ``slot``'s bundle."""
    from edgekit.bundle import MANIFEST_FILE

    return (root.slot_bundle(slot) / MANIFEST_FILE).read_bytes()
