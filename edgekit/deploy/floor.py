"""The anti-rollback floor: the newest bundle a device took, kept where one damaged file cannot lower it.

A bundle's signed serial (``build.serial``; 0 when it has none) must not be below the
floor, and a bundle *at* the floor must be one this device already took there (the same
manifest, by its SHA-256): another bundle signed with an old serial (a re-signed old build,
two builds stamped alike, ``--serial 0``) is not a newer release.  Only a local operator's
``--allow-downgrade`` goes under it.

The floor is the highest of every source that still reads, so losing or damaging one file
never lowers it:

- ``floor.json``: ``{"serial": N, "manifests": [SHA-256 of each manifest taken at N]}``;
- each slot's ``slot.json``: its bundle's ``serial`` and the ``floor`` after its install
  (which keeps the floor when a downgrade was allowed into a slot);
- each slot's bundle whose manifest a trusted key's signature checks, whatever its
  ``slot.json`` says: the device took that bundle, so its serial is a floor it accepted.
  (An install killed after its unpack counts too: that bundle passed the floor check; a
  bundle that failed its health gate was cleared and does not.)

``keep_floor`` writes the result back to ``floor.json`` when that file says less (missing,
damaged, older): a lost ``floor.json`` is rebuilt from the slots, never reset to 0.
``recover()`` reads it before it clears a damaged slot (whose signed manifest still counts)
and never makes a slot below it active.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.deploy.slots import SLOT_FILE, SLOTS, now_iso, read_json, write_json

if TYPE_CHECKING:
    from edgekit.deploy.slots import StateRoot

log = logging.getLogger(__name__)

FLOOR_FILE = "floor.json"
MAX_MANIFESTS = 16  # bundles taken at one serial: more only by allowed downgrades; the newest kept


def _serial(value: Any) -> int | None:
    """A serial from our own JSON: a non-negative int (never a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _digest(value: Any) -> str | None:
    ok = isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    return value if ok else None


@dataclass(frozen=True)
class Floor:
    """The floor ``serial`` and the ``manifests`` (SHA-256) taken at it; ``known`` False: nothing installed yet."""

    serial: int = 0
    manifests: tuple[str, ...] = ()
    known: bool = False
    sources: dict[str, int] = field(default_factory=dict, compare=False)  # where each part came from

    def admits(self, serial: int, digest: str) -> bool:
        """Whether a bundle of ``serial`` whose manifest hashes to ``digest`` may be installed."""
        return not self.known or serial > self.serial or (serial == self.serial and digest in self.manifests)

    def after(self, serial: int, digest: str) -> Floor:
        """The floor once that bundle is installed (an allowed downgrade leaves it where it was)."""
        if not self.known or serial > self.serial:
            return Floor(serial, (digest,), True)
        if serial == self.serial and digest not in self.manifests:
            return Floor(serial, (*self.manifests, digest)[-MAX_MANIFESTS:], True)
        return Floor(self.serial, self.manifests, True)

    def refusal(self, serial: int, digest: str) -> tuple[str, str] | None:
        """``(reason, hint)`` when ``admits`` is False, else None."""
        if self.admits(serial, digest):
            return None
        hint = (
            "build a newer bundle (edgekit build stamps a new serial), roll back to the other slot "
            "(edgekit agent rollback), or, as this device's operator, go back on purpose: "
            "edgekit agent install --allow-downgrade"
        )
        if serial < self.serial:
            return (
                f"refusing a downgrade: the bundle's serial {serial} is below this device's floor "
                f"{self.serial} (the newest bundle it installed); an old signed bundle cannot be "
                "installed over a newer one",
                hint,
            )
        return (
            f"refusing a different bundle with the same serial {serial} as the newest one this device "
            f"installed (manifest {digest[:12]}, not {', '.join(d[:12] for d in self.manifests) or 'known'}); "
            "only that bundle may be installed again at this serial",
            hint,
        )

    def to_dict(self) -> dict[str, Any]:
        """What ``floor.json`` holds."""
        return {"serial": self.serial, "manifests": list(self.manifests), "at": now_iso()}


def read_floor(root: StateRoot, keys: list[Path] | None = None) -> Floor:
    """The floor of ``root``: the highest serial of every source that reads (see the module docstring)."""
    from edgekit.deploy.bundle_checks import StepFailed, check_signature

    keys = root.trusted_keys() if keys is None else keys
    taken: list[tuple[int, str | None, str]] = []  # (serial, manifest digest or None, source)
    doc = read_json(root.path / FLOOR_FILE) or {}
    stored = _serial(doc.get("serial"))
    if stored is not None:
        manifests = doc.get("manifests")
        digests = [d for d in map(_digest, manifests if isinstance(manifests, list) else []) if d]
        taken += [(stored, d, FLOOR_FILE) for d in digests] or [(stored, None, FLOOR_FILE)]
    for slot in SLOTS:
        record = read_json(root.slot_dir(slot) / SLOT_FILE) or {}
        serial, floor = _serial(record.get("serial")), _serial(record.get("floor"))
        if serial is not None:
            taken.append((serial, _digest(record.get("manifest_sha256")), f"slot {slot} record"))
        if floor is not None:
            taken.append((floor, None, f"slot {slot} record"))
        bundle = root.slot_bundle(slot)
        if keys and bundle.is_dir():
            try:
                data, _, manifest = check_signature(bundle, keys)
            except (StepFailed, OSError):
                continue  # not a bundle a trusted key signed: it says nothing about the floor
            taken.append((manifest.build.serial, hashlib.sha256(data).hexdigest(), f"slot {slot} bundle"))
    if not taken:
        return Floor()
    top = max(serial for serial, _, _ in taken)
    manifests = tuple(dict.fromkeys(d for s, d, _ in taken if s == top and d))[-MAX_MANIFESTS:]
    sources: dict[str, int] = {}
    for serial, _, source in taken:
        sources[source] = max(serial, sources.get(source, serial))
    return Floor(top, manifests, True, sources)


def write_floor(root: StateRoot, floor: Floor) -> None:
    """Record ``floor`` in ``floor.json`` (a failure is logged: the slots still hold it)."""
    try:
        write_json(root.path / FLOOR_FILE, floor.to_dict())
    except OSError as err:
        log.warning("cannot record the serial floor %s: %s", floor.serial, err)


def keep_floor(root: StateRoot, keys: list[Path] | None = None) -> Floor:
    """``read_floor``, and ``floor.json`` rewritten when it says less than the other sources (held under the lock)."""
    floor = read_floor(root, keys)
    if not floor.known:
        return floor
    doc = read_json(root.path / FLOOR_FILE) or {}
    listed = doc.get("manifests")
    if (
        _serial(doc.get("serial")) != floor.serial
        or not isinstance(listed, list)
        or set(listed) != set(floor.manifests)
    ):
        if _serial(doc.get("serial")) != floor.serial:
            log.warning(
                "%s says %s, the slots say the floor is %s; rebuilding it",
                FLOOR_FILE, doc.get("serial", "nothing"), floor.serial,
            )  # fmt: skip
        write_floor(root, floor)
    return floor


def slot_serial(root: StateRoot, slot: str) -> int | None:
    """The serial of the bundle in ``slot`` (its manifest; None when that does not read)."""
    from edgekit.bundle import MANIFEST_FILE, BundleError, parse_manifest

    try:
        return parse_manifest((root.slot_bundle(slot) / MANIFEST_FILE).read_bytes()).build.serial
    except (OSError, BundleError):
        return None
