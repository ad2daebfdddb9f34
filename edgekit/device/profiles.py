"""Device profiles: what a kind of device is and which backends to try on it, as data.

Profiles live in ``devices/*.toml`` (one file per device; the wheel carries them as
``edgekit/_data/devices``).  Extra directories in ``EDGEKIT_DEVICES_PATH`` (separated by
``os.pathsep``) are read first, so a user can add a device or override one without
touching the package.  Every field is checked when a file is read: a typo or a wrong type
fails with the file and the field named, never later at deploy time.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from edgekit.core.cpu import CAPABILITIES, CpuFeatures
from edgekit.errors import ProfileError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ARCHES = ("x86_64", "aarch64", "armv7l")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
EDGETPU_KINDS = ("usb", "pci", "any")
#: Video decode paths (``edgekit.device.video_decode`` says what each uses and needs).
DECODER_PATHS = ("software", "nvv4l2", "v4l2", "vaapi")
_HINT = "see devices/README.md for the profile format"


@dataclass(frozen=True)
class Candidate:
    """One way to run a model on a device: a backend, the precision of the artifact it loads, and options.

    ``precision`` names the artifact (an fp32 ONNX run by the TensorRT execution provider
    in fp16 is still ``fp32``), so a bundle can be matched to candidates by backend and precision.
    """

    backend: str
    precision: str = "fp32"
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    name: str = ""
    #: Which recipe of that precision (``""`` the default; ``"full"`` for full-range int8
    #: weights): an artifact matches a candidate on backend, precision and variant.
    variant: str = ""
    #: CPU capabilities (``edgekit.core.cpu.CAPABILITIES``) the candidate needs to run as it should.
    requires: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """A stable name for this candidate, used in logs, errors and bench results."""
        return self.name or "-".join(x for x in (self.backend, self.precision, self.variant) if x)

    def missing(self, cpu: CpuFeatures) -> str:
        """Why ``cpu`` cannot run this candidate as it should (``""`` when it can)."""
        lacking = [c for c in self.requires if not cpu.has(c)]
        if not lacking:
            return ""
        return "needs " + "; ".join(f"{c} ({cpu.why(c)} on this CPU)" for c in lacking)

    def __hash__(self) -> int:  # options are a read-only mapping, which does not hash
        return hash((self.key, self.backend, self.precision, self.variant))


@dataclass(frozen=True)
class HostMatch:
    """What a host must show for ``detect()`` to pick this profile (every given field must hold)."""

    device_tree_model: tuple[str, ...] = ()  # any of these substrings of /proc/device-tree/model
    nv_tegra_release: tuple[str, ...] = ()  # any of these L4T majors, e.g. "R36"
    edgetpu: str | None = None  # "usb", "pci" or "any"
    openvino_device: str | None = None  # e.g. "NPU"

    @property
    def specificity(self) -> int:
        """How many facts this match needs: a more specific profile wins over a generic one."""
        return sum(
            bool(x)
            for x in (self.device_tree_model, self.nv_tegra_release, self.edgetpu, self.openvino_device)
        )


@dataclass(frozen=True, eq=False)
class DeviceProfile:
    """A kind of device: its CPU, compiler target, default budget and camera, and backend candidates."""

    name: str
    description: str
    arch: str
    cpu: str
    tvm_target: Mapping[str, Any]
    budget_ms: float
    camera: str
    runtime_packages: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    aliases: tuple[str, ...] = ()
    match: HostMatch = HostMatch()
    source: Path | None = None
    #: How video streams are decoded: ``software``, ``nvv4l2`` (Jetson), ``v4l2`` (Raspberry Pi), ``vaapi`` (Intel).
    decoder: str = "software"

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json`` output."""
        return {
            "name": self.name,
            "description": self.description,
            "aliases": list(self.aliases),
            "arch": self.arch,
            "cpu": self.cpu,
            "tvm_target": _plain(self.tvm_target),
            "budget_ms": self.budget_ms,
            "camera": self.camera,
            "decoder": self.decoder,
            "runtime_packages": list(self.runtime_packages),
            "match": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(self.match).items()},
            "candidates": [
                {
                    "name": c.key,
                    "backend": c.backend,
                    "precision": c.precision,
                    "variant": c.variant,
                    "requires": list(c.requires),
                    "options": _plain(c.options),
                }
                for c in self.candidates
            ],
            "source": str(self.source) if self.source else None,
        }


# The option through which a backend is told what precision to compute in, and its value for
# each artifact precision.  OpenVINO's CPU plugin otherwise runs an fp32 (or int8, for its
# float layers) model in bf16 on CPUs with AVX512-BF16/AMX and in f16 on Armv8.2 cores: an
# artifact must compute in the precision it is named for, so the candidate pins it.
PRECISION_OPTIONS: Mapping[str, tuple[str, Mapping[str, str]]] = {
    "openvino": ("inference_precision", {"fp32": "f32", "int8": "f32", "bf16": "bf16", "fp16": "f16"}),
}


def pin_precision(
    backend: str, precision: str, options: Mapping[str, Any], fail: Any = None
) -> dict[str, Any]:
    """``options`` with the backend's compute precision set to what ``precision`` names.

    A candidate that sets it to something else is refused (``fail(key, problem)`` makes the
    error): an fp32 candidate computing in bf16 is the silent change this rule exists to stop.
    """
    out = dict(options)
    if backend not in PRECISION_OPTIONS:
        return out
    key, values = PRECISION_OPTIONS[backend]
    want = values.get(precision)
    if want is None:
        return out
    given = out.setdefault(key, want)
    if given != want and fail is not None:
        raise fail(
            f"options.{key}",
            f"is {given!r}, but a {precision} candidate computes in {want!r}: "
            f"name the candidate's precision after what it computes in",
        )
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


class _Reader:
    """Reads typed fields from one TOML table, naming the file and field in every error."""

    def __init__(self, path: Path, table: Mapping[str, Any], prefix: str = "") -> None:
        self.path, self.table, self.prefix = path, table, prefix
        self.seen: set[str] = set()

    def fail(self, key: str, problem: str) -> ProfileError:
        return ProfileError(f"{self.path}: field '{self.prefix}{key}': {problem}", _HINT)

    def get(
        self, key: str, kind: type | tuple[type, ...], default: Any = ..., choices: tuple[str, ...] = ()
    ) -> Any:
        self.seen.add(key)
        if key not in self.table:
            if default is ...:
                raise self.fail(key, "is missing")
            return default
        value = self.table[key]
        # bool is an int in Python; a budget of `true` is a mistake, not 1 ms.
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
            names = " or ".join(k.__name__ for k in _as_tuple(kind))
            raise self.fail(key, f"must be {names}, got {type(value).__name__} {value!r}")
        if choices and value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        items = self.get(key, list, [])
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise self.fail(f"{key}[{i}]", f"must be a string, got {type(item).__name__} {item!r}")
        return tuple(items)

    def no_extras(self) -> None:
        extra = sorted(set(self.table) - self.seen)
        if extra:
            raise self.fail(extra[0], f"is not a known field (known: {', '.join(sorted(self.seen))})")


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def parse_profile(
    path: Path, data: Mapping[str, Any], backends: Mapping[str, frozenset[str]] | None = None
) -> DeviceProfile:
    """Validate one profile's TOML data.

    ``backends`` maps each known backend to the options it accepts; when given, a candidate
    naming another backend or an option its backend does not know is refused here, before
    any model is loaded.
    """
    r = _Reader(path, data)
    name = r.get("name", str)
    if path.stem != name:
        raise r.fail("name", f"is {name!r} but the file is {path.name}: name the file {name}.toml")
    arch = r.get("arch", str, choices=ARCHES)
    budget = r.get("budget_ms", (int, float))
    if not 0 < budget <= 10_000:
        raise r.fail("budget_ms", f"must be between 0 and 10000 ms, got {budget}")
    tvm_target = r.get("tvm_target", dict)
    if "kind" not in tvm_target:
        raise r.fail("tvm_target.kind", 'is missing (for example kind = "llvm")')

    m = _Reader(path, r.get("match", dict, {}), "match.")
    match = HostMatch(
        device_tree_model=m.strings("device_tree_model"),
        nv_tegra_release=m.strings("nv_tegra_release"),
        edgetpu=m.get("edgetpu", str, None, EDGETPU_KINDS),
        openvino_device=m.get("openvino_device", str, None),
    )
    m.no_extras()

    raw_candidates = r.get("candidates", list)
    if not raw_candidates:
        raise r.fail("candidates", "is empty: list at least one [[candidates]] entry")
    candidates: list[Candidate] = []
    for i, raw in enumerate(raw_candidates):
        if not isinstance(raw, dict):
            raise r.fail(f"candidates[{i}]", "must be a table ([[candidates]])")
        c = _Reader(path, raw, f"candidates[{i}].")
        backend = c.get("backend", str)
        if backends is not None and backend not in backends:
            close = difflib.get_close_matches(backend, backends, 1)
            raise c.fail(
                "backend",
                f"unknown backend {backend!r}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + f"; known: {', '.join(backends)}",
            )
        options = c.get("options", dict, {})
        if backends is not None:
            unknown = sorted(set(options) - backends[backend])
            if unknown:
                raise c.fail(
                    f"options.{unknown[0]}",
                    f"is not an option of {backend} (known: {', '.join(sorted(backends[backend]))})",
                )
        precision = c.get("precision", str, "fp32", PRECISIONS)
        variant = c.get("variant", str, "")
        if variant and not variant.replace("-", "").isalnum():
            raise c.fail("variant", f"must be letters, digits and '-', got {variant!r}")
        requires = c.strings("requires")
        for i, need in enumerate(requires):
            if need not in CAPABILITIES:
                raise c.fail(f"requires[{i}]", f"must be one of {', '.join(CAPABILITIES)}, got {need!r}")
        cand = Candidate(
            backend=backend,
            precision=precision,
            options=_freeze(pin_precision(backend, precision, options, c.fail)),
            name=c.get("name", str, ""),
            variant=variant,
            requires=requires,
        )
        c.no_extras()
        if any(prev.key == cand.key for prev in candidates):
            raise c.fail("name", f"candidate {cand.key!r} appears twice: give one a distinct name")
        candidates.append(cand)

    profile = DeviceProfile(
        name=name,
        description=r.get("description", str),
        arch=arch,
        cpu=r.get("cpu", str),
        tvm_target=_freeze(tvm_target),
        budget_ms=float(budget),
        camera=r.get("camera", str),
        decoder=r.get("decoder", str, "software", DECODER_PATHS),
        runtime_packages=r.strings("runtime_packages"),
        candidates=tuple(candidates),
        aliases=r.strings("aliases"),
        match=match,
        source=path,
    )
    r.no_extras()
    return profile


def read_profile(path: Path, backends: Mapping[str, frozenset[str]] | None = None) -> DeviceProfile:
    """Read and validate one profile file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ProfileError(f"{path}: not valid TOML: {err}", _HINT) from err
    except OSError as err:
        raise ProfileError(
            f"{path}: cannot be read: {err.strerror}", "check the path and its permissions"
        ) from err
    return parse_profile(path, data, backends)


def profile_dirs() -> tuple[Path, ...]:
    """Where profiles are read from, first match wins: EDGEKIT_DEVICES_PATH, then the built-in ones."""
    dirs = [Path(p) for p in os.environ.get("EDGEKIT_DEVICES_PATH", "").split(os.pathsep) if p]
    here = Path(__file__).resolve().parents[1]  # the edgekit package
    packaged = here / "_data" / "devices"  # installed wheel
    dirs.append(packaged if packaged.is_dir() else here.parent / "devices")  # editable checkout
    return tuple(dirs)


@cache
def _load(dirs: tuple[Path, ...]) -> MappingProxyType[str, DeviceProfile]:
    from edgekit.backends import registry

    # Backend modules are cheap to import (their runtimes are imported only when used).
    backends = {name: registry.get(name).options for name in registry.names()}
    found: dict[str, DeviceProfile] = {}
    for d in dirs:
        for path in sorted(d.glob("*.toml")) if d.is_dir() else ():
            profile = read_profile(path, backends)
            found.setdefault(profile.name, profile)
    owners: dict[str, str] = {}
    for p in found.values():
        for alias in p.aliases:
            if alias in found or owners.get(alias, p.name) != p.name:
                other = alias if alias in found else owners[alias]
                raise ProfileError(
                    f"{p.source}: field 'aliases': {alias!r} already names {other}", "pick another alias"
                )
            owners[alias] = p.name
    return MappingProxyType(dict(sorted(found.items())))


def all_profiles() -> MappingProxyType[str, DeviceProfile]:
    """Every known profile by name, sorted."""
    return _load(profile_dirs())


def get_profile(name: str) -> DeviceProfile:
    """The profile called ``name`` or having it as an alias (``jetson``, ``pi``, ``coral``)."""
    profiles = all_profiles()
    if name in profiles:
        return profiles[name]
    for p in profiles.values():
        if name in p.aliases:
            return p
    known = list(profiles) + [a for p in profiles.values() for a in p.aliases]
    close = difflib.get_close_matches(name, known, 1)
    raise ProfileError(
        f"unknown device {name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
        f"known devices: {', '.join(profiles)}; list them with `edgekit devices list`, "
        "or add a profile file to a directory in EDGEKIT_DEVICES_PATH",
    )
