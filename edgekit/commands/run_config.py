"""The run file of ``edgekit run BUNDLE --config run.toml``: the cameras and settings of a run, kept in one place.

A small TOML file; every key is optional::

    # run.toml
    sources = ["rtsp://cam-door.local/stream", "/dev/video0"]   # named cam0, cam1, ...
    budget_ms = 33            # the frame budget (default: the bundle's device budget)
    policy = "drop-oldest"    # drop-oldest, block or degrade
    batch = "auto"            # auto, off, or at most N frames per inference
    warm = "auto"             # auto, on or off
    fps = 30                  # a folder's frame rate (or override a file's)
    realtime = false          # replay files and folders at their frame rate
    duration_s = 600          # stop after S seconds
    frames = 10000            # stop after N frames
    top = 5                   # labels per frame (a classifier's)
    proof_dir = "proofs"      # a snapshot and a clip of each zone or line event, kept here
    clips = true              # the clips (false: snapshots only)

A detector's zones and lines, for the one camera of the run::

    [zones.bay]               # a polygon in frame pixels, or fractions of the frame
    polygon = [[0.1, 0.5], [0.9, 0.5], [0.9, 1.0], [0.1, 1.0]]
    dwell_s = 30

    [lines.gate]              # crossing it left to right of a->b is "in"
    a = [0, 400]
    b = [1280, 400]

or per camera by name (``[cameras.door.zones.bay]``, ``[cameras.door.lines.gate]``,
``[cameras.door] count_interval_s = 60``); ``edgekit.events.zones`` documents their keys.

or the cameras by name, as a table, where a camera may have a budget and policy of its own::

    [sources]
    door = "rtsp://cam-door.local/stream"
    yard = { source = "/dev/video0", budget_ms = 66, policy = "block" }

Options given on the command line win over the file; ``--source`` on the command line replaces
the file's sources (all of them).  Paths in sources are read from the working directory, as on
the command line.  A source with a password belongs in this file (readable by its owner only),
not on the command line where ``ps`` shows it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    from edgekit.events.zones import CameraRegions
    from edgekit.pipeline.cameras import Camera

#: A run file is a few lines; anything larger is not one (a video or a model given by mistake).
MAX_BYTES = 64 * 1024


class RunConfigError(EdgekitError):
    """A run file (``edgekit run --config``) is missing, not TOML, or has a key it should not."""


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_table(v: Any) -> bool:
    return isinstance(v, dict)


def _is_tables(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, dict) for x in v.values())


def _is_batch(v: Any) -> bool:
    return isinstance(v, str) or _is_int(v)


#: What a camera of the ``[sources]`` table may set for itself (``door = { source = "...", budget_ms = 66 }``).
CAMERA_KEYS: dict[str, Callable[[Any], bool]] = {
    "source": lambda v: isinstance(v, str) and bool(v),
    "budget_ms": _is_number,
    "policy": _is_str,
}


def _is_camera(v: Any) -> bool:
    if isinstance(v, str):
        return bool(v)
    return (
        isinstance(v, dict)
        and "source" in v
        and all(k in CAMERA_KEYS and CAMERA_KEYS[k](x) for k, x in v.items())
    )


def _is_sources(v: Any) -> bool:
    if isinstance(v, list):
        return bool(v) and all(isinstance(s, str) and s for s in v)
    if isinstance(v, dict):
        return bool(v) and all(_is_camera(s) for s in v.values())
    return False


#: Each key of the file: what its value must be (the check, and the words for the error).
KEYS: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "sources": (
        _is_sources,
        "a list of source strings or a table of camera name = source string, or name = "
        "{ source = ..., budget_ms = ..., policy = ... } for a camera with its own budget or policy",
        '[sources] door = "0" or door = { source = "rtsp://door/s1", budget_ms = 66 }',
    ),
    "budget_ms": (_is_number, "a number of milliseconds", "budget_ms = 33"),
    "policy": (_is_str, "a string: drop-oldest, block or degrade", 'policy = "drop-oldest"'),
    "fps": (_is_number, "a number of frames per second", "fps = 30"),
    "realtime": (_is_bool, "true or false", "realtime = true"),
    "batch": (_is_batch, 'a string ("auto" or "off") or a whole number', 'batch = "auto" or batch = 4'),
    "warm": (_is_str, "a string: auto, on or off", 'warm = "auto"'),
    "duration_s": (_is_number, "a number of seconds", "duration_s = 60"),
    "frames": (_is_int, "a whole number", "frames = 1000"),
    "top": (_is_int, "a whole number", "top = 5"),
    "zones": (_is_tables, "a table of named zones", "[zones.bay] polygon = [[0, 0], [1, 0], [1, 1]]"),
    "lines": (_is_tables, "a table of named lines", "[lines.gate] a = [0, 400] and b = [1280, 400]"),
    "count_interval_s": (_is_number, "a number of seconds", "count_interval_s = 60"),
    "cameras": (
        _is_tables,
        "a table of cameras by name, each with its zones and lines",
        "[cameras.door.zones.bay] polygon = [[0, 0], [1, 0], [1, 1]]",
    ),
    "proof_dir": (_is_str, "a folder", 'proof_dir = "proofs"'),
    "clips": (_is_bool, "true or false", "clips = false"),
}

#: The keys that say where events come from: the run's one camera's, or per camera.
REGION_KEYS = ("zones", "lines", "count_interval_s")


@dataclass(frozen=True)
class RunConfig:
    """What a run file sets: ``values`` holds only the keys it has (their names as in the file)."""

    path: Path
    values: Mapping[str, Any] = field(default_factory=dict)

    @property
    def sources(self) -> list[str] | dict[str, str | Camera] | None:
        s = self.values.get("sources")
        if s is None:
            return None
        if isinstance(s, list):
            return list(s)
        from edgekit.pipeline.cameras import Camera

        return {n: v if isinstance(v, str) else Camera(**v) for n, v in s.items()}

    def _region_tables(self) -> dict[str | None, dict[str, Any]]:
        """Each camera's table of zones and lines by name; ``None``: the top level's (the one camera's)."""
        out: dict[str | None, dict[str, Any]] = {}
        top = {k: self.values[k] for k in REGION_KEYS if k in self.values}
        if "zones" in top or "lines" in top:
            out[None] = top
        for name, table in self.values.get("cameras", {}).items():
            out[name] = dict(table)
        return out

    def check_regions(self) -> None:
        """Every zone and line of the file, checked (``RunConfigError`` naming the camera and the file)."""
        for name, table in self._region_tables().items():
            self._regions_of(name, table)

    def _regions_of(self, name: str | None, table: dict[str, Any]) -> CameraRegions:
        from edgekit.events.zones import regions_from_dict

        where = f"camera {name!r} of the run file" if name is not None else "the run file"
        extra = sorted(set(table) - set(REGION_KEYS))
        if extra:
            raise RunConfigError(
                f"unknown key {extra[0]!r} for {where} {self.path}",
                f"a camera's table has {', '.join(REGION_KEYS)}",
            )
        try:
            return regions_from_dict(table)
        except EdgekitError as err:
            raise RunConfigError(f"{err.message} ({where} {self.path})", err.hint) from None

    def regions(self, cameras: list[str]) -> dict[str, CameraRegions]:
        """Each camera's zones and lines (only cameras that have some), checked against ``cameras``."""
        tables = self._region_tables()
        top = tables.pop(None, None)
        if top is not None:
            if len(cameras) != 1:
                raise RunConfigError(
                    f"the run file {self.path} has zones or lines but the run has {len(cameras)} cameras",
                    "say whose they are: [cameras.<name>.zones.<zone>] (names: "
                    + ", ".join(repr(c) for c in cameras)
                    + ")",
                )
            tables[cameras[0]] = top | tables.get(cameras[0], {})
        unknown = sorted(str(n) for n in set(tables) - set(cameras))
        if unknown:
            raise RunConfigError(
                f"the run file {self.path} has zones for camera {unknown[0]!r}, which the run does not have",
                "its cameras: " + ", ".join(repr(c) for c in cameras),
            )
        out: dict[str, CameraRegions] = {}
        for name, table in tables.items():
            assert name is not None
            regions = self._regions_of(name, table)
            if regions.zones or regions.lines:
                out[name] = regions
        return out


def load_run_config(path: Path) -> RunConfig:
    """Read and check the run file at ``path`` (raises ``RunConfigError`` saying which key and file)."""
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise RunConfigError(f"the run file {path} is not a file", "give a TOML file: --config run.toml")
        if size > MAX_BYTES:
            raise RunConfigError(
                f"the run file {path} is {size} bytes; a run file is at most {MAX_BYTES}",
                "check that --config names the TOML run file (not a video or a bundle)",
            )
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise RunConfigError(
            f"no run file at {path}", "check the path given to --config (see edgekit run --help)"
        ) from None
    except UnicodeDecodeError as err:
        raise RunConfigError(
            f"the run file {path} is not UTF-8 text ({err.reason} at byte {err.start})",
            "a run file is TOML text: see edgekit run --help",
        ) from None
    except OSError as err:
        raise RunConfigError(
            f"cannot read the run file {path}: {err.strerror}", "check its permissions"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise RunConfigError(
            f"the run file {path} is not valid TOML: {err}",
            'keys are written key = value, strings in quotes: e.g. policy = "drop-oldest"',
        ) from None
    config = RunConfig(path, check(data, path))
    config.check_regions()  # a zone's mistake is told now, before any camera opens
    return config


def check(data: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """The keys of a parsed run file, each of the right type (else ``RunConfigError``)."""
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise RunConfigError(
            f"unknown key {unknown[0]!r} in the run file {path}",
            f"the keys of a run file are {', '.join(KEYS)} (see edgekit run --help)",
        )
    for key, value in data.items():
        ok, what, example = KEYS[key]
        if not ok(value):
            raise RunConfigError(
                f"{key} in the run file {path} must be {what}, got {_shown(value)}",
                f"for example {example}",
            )
    return dict(data)


def _shown(value: Any) -> str:
    kind = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list"}
    if isinstance(value, dict):
        return "a table"
    text = repr(value)
    return f"{kind.get(type(value), type(value).__name__)} ({text[:60]})"
