"""The candidate measured fastest on this host, kept per bundle so that only the first load measures.

``edgekit.load`` measures a bundle's candidates at the camera rate the first time it loads
that bundle here (``edgekit.selection.measured.measure_candidates``) and writes what it found
to ``<state root>/choices/<manifest sha256>.json``.  A later load of the same bundle reads
it back instead of measuring, as long as the host is the same one: the same CPU (model,
vector extensions, core count), the same runtime versions of the backends involved, the
same edgekit and the same device profile.  Anything else measures again, since a ranking
measured with another runtime or on another CPU says nothing about this one.

The file is state, not configuration: it is read bounded (``MAX_BYTES``), checked field by
field, and a file that is corrupt, too large, of another format or for another bundle is
ignored with a log line (and overwritten by the next measurement), never trusted blindly.
The folder is kept to ``MAX_FILES`` entries, oldest dropped first.

A choice is measured again on a later load when it is ``provisional`` (measured on a busy host,
``edgekit.selection.candidate_timing.busy_reason``; at most ``MAX_ATTEMPTS`` measurements in a row)
or ``stale`` (the running pipeline saw the chosen artifact far slower than measured:
``edgekit.pipeline.choice_watch``).  A record of an older format reads as stale: measured again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any

from edgekit._version import __version__
from edgekit.core.io import TMP_MARK, write_atomic
from edgekit.core.packages import installed_version
from edgekit.core.paths import state_root
from edgekit.errors import EdgekitError

log = logging.getLogger(__name__)

FORMAT = "edgekit-choice/2"
#: Measurements in a row a busy host gets before the last one is kept as it is: a device that is
#: always busy must not measure on every load.
MAX_ATTEMPTS = 3
#: A reason (busy, stale) is one line for a person.
MAX_REASON = 400
#: A choice file is a few hundred bytes; anything past this is not ours.
MAX_BYTES = 64 * 1024
#: Choice files kept (one per bundle measured here); the oldest go first.
MAX_FILES = 64
#: Candidates one file may list (a profile has about ten).
MAX_CANDIDATES = 64
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

#: The distributions that carry each built-in backend's runtime, in the order they are looked for.
#: Their installed versions come from package metadata: reading them imports no runtime, so a
#: cached load stays quick (``import tvm`` alone takes seconds).
RUNTIME_DISTRIBUTIONS: Mapping[str, tuple[str, ...]] = {
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml"),
    "openvino": ("openvino",),
    "litert": ("ai-edge-litert", "tflite-runtime"),
    "tvm": ("apache-tvm", "tlcpack", "tvm"),
    "tensorrt": ("tensorrt", "tensorrt-cu12", "tensorrt-libs"),
}


def runtime_version(backend: str) -> str:
    """The installed version of ``backend``'s runtime, from package metadata; ``"?"`` when not found.

    A plugin's or a runtime built from source has no known distribution: it still keys the
    cache by name, so a change of it is caught only with the edgekit or CPU fingerprint.
    """
    for dist in RUNTIME_DISTRIBUTIONS.get(backend, ()):
        found = installed_version(dist)
        if found is not None:
            return f"{dist} {found}"
    return "?"


@cache
def _cpu() -> tuple[str, str, tuple[str, ...], int]:
    # Read once per process: the hardware does not change under a running program.
    from edgekit.core.cpu import this_cpu
    from edgekit.device.host import read_host

    host = read_host(probe_runtimes=False)  # no runtime import: only /proc and /sys
    return host.arch, host.cpu_model, tuple(sorted(this_cpu().notable)), os.cpu_count() or 1


def host_fingerprint(profile: str, backends: Iterable[str]) -> dict[str, Any]:
    """What must be the same for a measured ranking to hold here: CPU, runtimes, edgekit, profile."""
    arch, model, flags, count = _cpu()
    return {
        "arch": arch,
        "cpu_model": model,
        "cpu_flags": list(flags),
        "cpu_count": count,
        "runtimes": {b: runtime_version(b) for b in sorted(set(backends))},
        "edgekit": __version__,
        "profile": profile,
    }


@dataclass(frozen=True)
class CachedChoice:
    """One measurement of a bundle's candidates on one host.

    ``p90_ms`` (paced) and ``p50_ms`` per candidate timed; ``estimated_ms``: p90 estimated from
    the build's figures for those the time left no room for.  ``load_per_core``: the host's
    load average when it began.  ``busy``: why the host was too busy for a final ranking;
    ``provisional``: measured again on the next load (``attempt`` counts the measurements in a
    row).  ``stale``: why a running pipeline contradicted it (measured again on the next load).
    """

    bundle_sha256: str
    host: Mapping[str, Any]
    fps: float
    measured_at: datetime
    p90_ms: Mapping[str, float] = field(default_factory=dict)
    p50_ms: Mapping[str, float] = field(default_factory=dict)
    estimated_ms: Mapping[str, float] = field(default_factory=dict)
    load_per_core: float | None = None
    busy: str = ""
    provisional: bool = False
    attempt: int = 1
    stale: str = ""

    @property
    def chosen(self) -> str | None:
        """The fastest candidate measured (ties: the first listed, which is profile order)."""
        return min(self.p90_ms, key=lambda k: self.p90_ms[k]) if self.p90_ms else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "bundle_sha256": self.bundle_sha256,
            "host": dict(self.host),
            "fps": self.fps,
            "measured_at": self.measured_at.isoformat(),
            "p90_ms": dict(self.p90_ms),
            "p50_ms": dict(self.p50_ms),
            "estimated_ms": dict(self.estimated_ms),
            "load_per_core": self.load_per_core,
            "busy": self.busy,
            "provisional": self.provisional,
            "attempt": self.attempt,
            "stale": self.stale,
        }


def choices_dir() -> Path:
    return state_root() / "choices"


def manifest_sha256(bundle: Path) -> str:
    """SHA-256 of the bundle's ``manifest.json``: the bundle's identity (it hashes every other file)."""
    return hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()


def _path(bundle_sha256: str) -> Path:
    if not _SHA256.match(bundle_sha256):
        raise ValueError(f"not a SHA-256: {bundle_sha256!r}")
    return choices_dir() / f"{bundle_sha256}.json"


def _latencies(doc: Mapping[str, Any], name: str, required: bool) -> dict[str, float]:
    value = doc.get(name, {})
    if not isinstance(value, dict) or len(value) > MAX_CANDIDATES or (required and not value):
        raise ValueError(f"no {name}" if required else f"bad {name}")
    for key, ms in value.items():
        if not isinstance(ms, int | float) or isinstance(ms, bool) or not (math.isfinite(ms) and ms >= 0):
            raise ValueError(f"bad latency for {key!r}: {ms!r}")
    return {str(k): float(v) for k, v in value.items()}


def _reason(doc: Mapping[str, Any], name: str) -> str:
    value = doc.get(name, "")
    if not isinstance(value, str) or len(value) > MAX_REASON:
        raise ValueError(f"bad {name}")
    return value


def _parse(doc: Any, bundle_sha256: str) -> CachedChoice:
    """The choice in ``doc``, or ValueError saying what is wrong with it."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not an {FORMAT} document")
    if doc.get("bundle_sha256") != bundle_sha256:
        raise ValueError("written for another bundle")
    host, fps = doc.get("host"), doc.get("fps")
    if not isinstance(host, dict):
        raise ValueError("no host fingerprint")
    if not isinstance(fps, int | float) or isinstance(fps, bool) or not 0 < fps < 10_000:
        raise ValueError(f"bad fps {fps!r}")
    p90 = _latencies(doc, "p90_ms", required=True)
    p50 = _latencies(doc, "p50_ms", required=False)
    estimated = _latencies(doc, "estimated_ms", required=False)
    if not set(p50) <= set(p90) or set(estimated) & set(p90):
        raise ValueError("p50_ms or estimated_ms do not fit p90_ms")
    load = doc.get("load_per_core")
    if load is not None and (
        not isinstance(load, int | float) or isinstance(load, bool) or not (math.isfinite(load) and load >= 0)
    ):
        raise ValueError(f"bad load_per_core {load!r}")
    provisional, attempt = doc.get("provisional", False), doc.get("attempt", 1)
    if not isinstance(provisional, bool):
        raise ValueError(f"bad provisional {provisional!r}")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or not 1 <= attempt <= MAX_ATTEMPTS:
        raise ValueError(f"bad attempt {attempt!r}")
    when = datetime.fromisoformat(str(doc.get("measured_at")))
    if when.tzinfo is None:
        raise ValueError("measured_at has no time zone")
    return CachedChoice(
        bundle_sha256,
        host,
        float(fps),
        when,
        p90,
        p50,
        estimated,
        None if load is None else float(load),
        _reason(doc, "busy"),
        provisional,
        attempt,
        _reason(doc, "stale"),
    )


def read_record(bundle_sha256: str) -> CachedChoice | None:
    """This bundle's choice as kept, whatever host measured it; None (with a log line) when there is none to trust.

    A record of an older format is stale: None, with an info line (measured again, never a crash).
    """
    path = _path(bundle_sha256)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as err:
        log.warning("cannot read the cached candidate choice %s (%s): measuring again", path, err)
        return None
    try:
        if len(raw) > MAX_BYTES:
            raise ValueError(f"larger than {MAX_BYTES} bytes")
        doc = json.loads(raw)
        older = doc.get("format") if isinstance(doc, dict) else None
        if isinstance(older, str) and older.startswith("edgekit-choice/") and older != FORMAT:
            log.info(
                "the cached candidate choice %s is of an older format (%.40s): measuring again", path, older
            )
            return None
        return _parse(doc, bundle_sha256)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        log.warning("ignoring the cached candidate choice %s: %s; measuring again", path, err)
        return None


def read_choice(bundle_sha256: str, host: Mapping[str, Any]) -> CachedChoice | None:
    """This bundle's choice measured on a host like ``host``; None (with a log line) otherwise."""
    choice = read_record(bundle_sha256)
    if choice is None:
        return None
    if dict(choice.host) != dict(host):
        changed = sorted(k for k in set(host) | set(choice.host) if host.get(k) != choice.host.get(k))
        log.info(
            "the cached candidate choice was measured with another %s: measuring again", ", ".join(changed)
        )
        return None
    return choice


def mark_stale(bundle_sha256: str, reason: str) -> Path | None:
    """Mark this bundle's kept choice stale (the next load measures again); None when there is none."""
    choice = read_record(bundle_sha256)
    if choice is None:
        return None
    return write_choice(replace(choice, stale=reason[:MAX_REASON]))


def forget(bundle_sha256: str) -> bool:
    """Drop this bundle's kept choice; whether there was one."""
    path = _path(bundle_sha256)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as err:
        raise EdgekitError(
            f"cannot drop the kept candidate choice {path}: {err.strerror}",
            "run it as the user that runs edgekit on this device, or set EDGEKIT_STATE",
        ) from err
    return True


def write_choice(choice: CachedChoice) -> Path | None:
    """Keep ``choice`` (atomically); a state folder that cannot be written costs a log line, not the load."""
    path = _path(choice.bundle_sha256)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, (json.dumps(choice.to_dict(), indent=1) + "\n").encode())
        _prune(path.parent)
    except OSError as err:
        log.warning(
            "cannot keep the measured candidate choice in %s (%s): the next load measures again", path, err
        )
        return None
    return path


def _prune(folder: Path) -> None:
    # Bounded: one file per bundle ever loaded would grow without end on a device that
    # receives a new bundle every week.
    files = [p for p in folder.glob("*.json") if TMP_MARK not in p.name]
    if len(files) <= MAX_FILES:
        return
    files.sort(key=lambda p: p.stat().st_mtime)
    for old in files[: len(files) - MAX_FILES]:
        old.unlink(missing_ok=True)


def now() -> datetime:
    return datetime.now(timezone.utc)
