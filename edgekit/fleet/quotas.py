"""What one device, one credential or one fleet may cost the collector, and what becomes of quiet devices.

Devices are untrusted: a stolen or buggy camera must not fill the collector for everyone.
With the broker ACL of docs/guides/fleet.md (``pattern write edgekit/v1/+/%u/...``, Sparkplug
``spBv1.0/+/+/%u``) a credential may publish only under its own name, in any fleet: MQTT
does not tell a subscriber who published, but the topic's device segment *is* the
credential.  So the collector bounds:

- devices per credential: the fleets one device name may appear in (``per_credential``);
- fleets (``max_fleets``) and devices in all (``max_devices``);
- per device, messages and bytes per minute, each a token bucket whose burst is big enough
  for a spool's replay after an outage (a full 64 MiB spool replays whole);
- what a message stores: only the fields of the validated schema (``known_fields``), so
  padding a valid message with unknown fields never reaches the store or memory.

Devices not heard from for ``quiet_s`` (24 h by default) are aged out when room is needed:
a new device, fleet or credential entry past its bound first frees the quietest ones (their
rows leave the devices table; their windows stay for history and age out with ``--keep``).
While nothing is that quiet the newcomer is refused.  Without that ACL a credential
can take any device name: then only the fleet and device bounds, the rates and age-out hold.
Every refusal is counted by reason (``Rejected.reason``): ``credential-quota``,
``too-many-fleets``, ``too-many-devices``, ``rate-messages``, ``rate-bytes``.
"""

from __future__ import annotations

import functools
import typing
from collections import Counter
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from edgekit.errors import EdgekitError

Key = tuple[str, str]  # (fleet, device)


class Rejected(ValueError):
    """A message that is not stored; ``reason`` is the counter it adds to."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class Quotas:
    """The collector's bounds (see the module); ``edgekit fleet serve`` sets them from its options."""

    max_devices: int = 10_000
    max_fleets: int = 1_000
    per_credential: int = 4  # fleets one device name (one credential, under the ACL) may appear in
    messages_per_min: float = 300.0  # a device sends a window every 5 s, a status now and then
    message_burst: int = 20_000  # a day's windows replayed from the spool after an outage
    bytes_per_min: float = 4 * 1024 * 1024
    byte_burst: int = 64 * 1024 * 1024  # a device spool's default bound: a full spool replays whole
    quiet_s: float = 24 * 3600

    def __post_init__(self) -> None:
        counts = (self.max_devices, self.max_fleets, self.per_credential, self.message_burst, self.byte_burst)
        rates = (self.messages_per_min, self.bytes_per_min, self.quiet_s)
        if min(counts) < 1 or not min(rates) > 0:
            raise EdgekitError(
                f"collector quotas must be positive: {self}",
                "e.g. --max-devices 10000 --max-fleets 1000 --per-credential 4 --quiet 24h",
            )


class TokenBucket:
    """``capacity`` tokens, refilled at ``per_s``; ``take`` spends ``n`` of them or refuses (and spends none)."""

    __slots__ = ("capacity", "last", "per_s", "tokens")

    def __init__(self, per_s: float, capacity: float, now: float) -> None:
        self.per_s, self.capacity, self.tokens, self.last = per_s, capacity, capacity, now

    def take(self, n: float, now: float) -> bool:
        if now > self.last:
            self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.per_s)
            self.last = now
        if n > self.tokens:
            return False
        self.tokens -= n
        return True


class Gate:
    """Which devices the collector knows, and whether one more (or one more message) is let in.

    ``admit`` before a message of a device not known yet, ``add`` once it is stored, ``charge``
    for every message of a known device.  ``admit`` returns the devices it aged out to make
    room: the caller forgets them too (store, tracks, the view).  Not thread-safe: the
    collector calls it under its lock.
    """

    def __init__(self, quotas: Quotas, last_seen: dict[Key, float]) -> None:
        self.quotas = quotas
        self.last: dict[Key, float] = {}
        self._names: dict[str, set[str]] = {}  # device name (credential) -> its fleets
        self._fleets: Counter[str] = Counter()
        self._buckets: dict[Key, tuple[TokenBucket, TokenBucket]] = {}
        self._next_sweep = 0.0  # no device can be quiet enough to age out before this
        for key, at in last_seen.items():
            self.add(key, at)

    def __len__(self) -> int:
        return len(self.last)

    def __contains__(self, key: object) -> bool:
        return key in self.last

    def fleets(self) -> int:
        return len(self._fleets)

    def add(self, key: Key, now: float) -> None:
        """``key`` is stored now (or heard from again)."""
        if key not in self.last:
            self._names.setdefault(key[1], set()).add(key[0])
            self._fleets[key[0]] += 1
            self._next_sweep = min(self._next_sweep, now + self.quotas.quiet_s)
        self.last[key] = max(now, self.last.get(key, now))

    def forget(self, key: Key) -> None:
        if self.last.pop(key, None) is None:
            return
        fleets = self._names[key[1]]
        fleets.discard(key[0])
        if not fleets:
            del self._names[key[1]]
        self._fleets[key[0]] -= 1
        if self._fleets[key[0]] <= 0:
            del self._fleets[key[0]]
        self._buckets.pop(key, None)

    def admit(self, key: Key, now: float) -> list[Key]:
        """Room for ``key`` (not known yet), aging out quiet devices if it takes that; else ``Rejected``."""
        fleet, name = key
        q, evicted = self.quotas, []
        mine = self._names.get(name, set())
        if len(mine) >= q.per_credential:
            quiet = [(fleet_, name) for fleet_ in mine if self.last[(fleet_, name)] < now - q.quiet_s]
            for old in quiet:
                self.forget(old)
            evicted += quiet
            if len(self._names.get(name, ())) >= q.per_credential:
                raise Rejected(
                    "credential-quota",
                    f"{name!r} already reports in {q.per_credential} fleets ({fleet!r} refused)",
                )
        if fleet not in self._fleets and len(self._fleets) >= q.max_fleets:
            evicted += self._sweep(now)
            if len(self._fleets) >= q.max_fleets:
                raise Rejected("too-many-fleets", f"{fleet!r}: already {len(self._fleets)} fleets")
        if len(self.last) >= q.max_devices:
            evicted += self._sweep(now)
            if len(self.last) >= q.max_devices:
                raise Rejected("too-many-devices", f"{fleet}/{name}: already {len(self.last)} devices")
        return evicted

    def _sweep(self, now: float) -> list[Key]:
        """Forget every device quiet for ``quiet_s``; cheap while none can be (a flood asks on every message)."""
        if now < self._next_sweep:
            return []
        horizon = now - self.quotas.quiet_s
        quiet = [key for key, at in self.last.items() if at < horizon]
        for key in quiet:
            self.forget(key)
        self._next_sweep = min(self.last.values(), default=now) + self.quotas.quiet_s
        return quiet

    def charge(self, key: Key, size: int, now: float) -> None:
        """Spend one message and ``size`` bytes of ``key``'s budget, or ``Rejected`` (nothing spent)."""
        buckets = self._buckets.get(key)
        if buckets is None:
            q = self.quotas
            buckets = self._buckets[key] = (
                TokenBucket(q.messages_per_min / 60, q.message_burst, now),
                TokenBucket(q.bytes_per_min / 60, q.byte_burst, now),
            )
        messages, octets = buckets
        if not messages.take(1, now):
            raise Rejected("rate-messages", f"{key[0]}/{key[1]}: over {self.quotas.messages_per_min:g}/min")
        if not octets.take(size, now):
            messages.tokens += 1  # not let in: the message costs nothing
            raise Rejected("rate-bytes", f"{key[0]}/{key[1]}: over {self.quotas.bytes_per_min:g} bytes/min")


class LogThrottle:
    """At most one log line per reason every ``every_s``: a flood is counted in full, not logged in full."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._quiet: Counter[str] = Counter()

    def __call__(self, reason: str, now: float) -> int | None:
        """``None``: do not log this one; else log it, saying how many of its reason went unlogged before."""
        if now - self._last.get(reason, -self.every_s) < self.every_s:
            self._quiet[reason] += 1
            return None
        self._last[reason] = now
        return self._quiet.pop(reason, 0)


def known_fields(
    model: BaseModel, body: dict[str, Any], seen: Counter[str] | None = None
) -> dict[str, Any] | None:
    """``body`` with only the fields ``model`` (its validation) knows, at every depth; ``None`` when it had no others.

    The values are the ones sent (not a dump of the model: ``1`` stays ``1``); a message with
    nothing unknown is kept as it came, and stored as the bytes it came in.  ``seen`` counts
    the messages that had unknown fields (``unknown-fields-dropped``).
    """
    if not _has_extra(model):
        return None
    if seen is not None:
        seen["unknown-fields-dropped"] += 1
    known: dict[str, Any] = _strip(model, body)
    return known


@functools.cache
def _nested(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of ``model`` that may hold models (directly, in a map, a list or an optional)."""

    def holds_model(annotation: Any) -> bool:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return True
        return any(holds_model(arg) for arg in typing.get_args(annotation))

    return tuple(name for name, info in model.model_fields.items() if holds_model(info.annotation))


def _has_extra(value: Any) -> bool:
    # Walks only where models can be (a sketch's buckets are never looked at): ~12 steps a window.
    if isinstance(value, BaseModel):
        return bool(value.__pydantic_extra__) or any(
            _has_extra(getattr(value, n)) for n in _nested(type(value))
        )
    if isinstance(value, dict):
        return any(_has_extra(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_extra(v) for v in value)
    return False


def _strip(value: Any, sent: Any) -> Any:
    if isinstance(value, BaseModel) and isinstance(sent, dict):
        out = {}
        for name, info in type(value).model_fields.items():
            wire = info.alias or name
            if wire in sent:
                out[wire] = _strip(getattr(value, name), sent[wire])
        return out
    if isinstance(value, dict) and isinstance(sent, dict):
        return {k: _strip(value[k], v) for k, v in sent.items() if k in value}
    if isinstance(value, list) and isinstance(sent, list):
        return [_strip(v, s) for v, s in zip(value, sent, strict=False)]
    return sent
