"""Recovery of a device's state root after a crash: the slots made consistent, never below the floor.

Above both :mod:`edgekit.deploy.slots` (the files) and :mod:`edgekit.deploy.floor` (the
anti-rollback rule): recovery reads the floor before it clears a damaged slot, and only
switches to a slot at or above it.
"""

from __future__ import annotations

import logging
from typing import Any

from edgekit.core.io import fsync_dir, remove_tree
from edgekit.deploy.floor import keep_floor, slot_serial
from edgekit.deploy.slots import SLOTS, StateRoot

log = logging.getLogger("edgekit.deploy.slots")  # the slots' own log, as before the move


def recover(root: StateRoot, *, verify: bool = True) -> dict[str, Any]:
    """Bring ``root`` to a consistent state after a crash; call it when the agent starts.

    Reads the floor first (and rebuilds ``floor.json`` from the slots when it says less);
    deletes temp files; empties every slot that is not complete (and, with ``verify``, every
    slot whose bundle no longer verifies); if ``active`` then names no complete slot, points it
    at the other complete slot when that one is not below the floor, or removes it.  Returns
    what it did, as plain data (``refused``: a slot left inactive because it is below the floor).
    """
    with root.lock():
        return _recover(root, verify)


def _recover(root: StateRoot, verify: bool) -> dict[str, Any]:
    report: dict[str, Any] = {"removed": root.clean_temps(), "cleared": {}, "switched": None}
    # The floor first: a damaged slot about to be cleared may be the last place that holds it.
    floor = keep_floor(root)
    report["floor"] = floor.serial if floor.known else None
    for slot in SLOTS:
        if verify:
            ok, why = root.verify_slot(slot)
        else:
            ok, why = root.slot_info(slot) is not None, "incomplete"
        if not ok:
            has_content = any(root.slot_dir(slot).iterdir())
            if has_content:
                log.warning("slot %s: %s; clearing it", slot, why)
                root.clear_slot(slot)
                report["cleared"][slot] = why
    active = root.active()
    complete = [s for s in SLOTS if root.slot_info(s) is not None]
    link_exists = root.active_link.is_symlink() or root.active_link.exists()
    if active not in complete and link_exists:
        # Only a damaged root gets here (an install never writes into the active slot).  The
        # other slot may hold an older bundle: that one is never made active behind the
        # operator's back (damage must not be a way around the floor), only one at or above it.
        serials = {s: slot_serial(root, s) for s in complete if s != active}
        fallback = next(
            (s for s, n in serials.items() if not floor.known or (n is not None and n >= floor.serial)),
            None,
        )
        if fallback is not None:
            log.warning("active slot %s is not complete; switching to slot %s", active, fallback)
            root.switch(fallback)
            report["switched"] = fallback
        else:
            for slot, serial in serials.items():
                log.error(
                    "active slot %s is not complete; slot %s holds serial %s, below this device's floor %s, "
                    "so it is not made active: deploy a bundle at or above the floor, or, as this "
                    "device's operator, edgekit agent install --allow-downgrade BUNDLE",
                    active, slot, serial, floor.serial,
                )  # fmt: skip
                report.setdefault("refused", {})[slot] = {"serial": serial, "floor": floor.serial}
            if not serials:
                log.warning(
                    "active slot %s is not complete and no other slot is; no bundle is active", active
                )
            remove_tree(root.active_link)
            fsync_dir(root.path)
            report["switched"] = "none"
    report["active"] = root.active()
    return report
