"""``edgekit build --onnx FILE``'s card: inferred from the file (:mod:`edgekit.convert.file_card`), or
written out as an editable ``model.toml`` (``--write-card``) with where each value came from."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgekit.convert.file_card import (
    Fact,
    Inferred,
    check_not_a_detector,
    guess_detector,
    infer,
    mark_guesses,
)
from edgekit.convert.modelcard import CARD_FILE, ModelCard, card_for_file, card_from_data, read_labels
from edgekit.core.io import sha256_file
from edgekit.errors import BuildError


def _inferred(
    model: Path,
    *,
    input_size: tuple[int, int] | None,
    mean: tuple[float, float, float] | None,
    std: tuple[float, float, float] | None,
    layout: str | None,
    labels: Path | None,
    guess: bool = False,
) -> Inferred | None:
    """The card the file and flags say, or None when the file has no ``task`` metadata (nor a detector's head).

    ``guess``: a file without ``task`` whose output looks like a YOLO head gets a card guessed
    from that shape (for ``--write-card``, to be checked), rather than an error.
    """
    from edgekit.convert.file_facts import read_facts
    from edgekit.convert.onnx_export import check_onnx

    check_onnx(model)
    facts = read_facts(model)
    guessed = guess_detector(facts) if guess else None
    if guessed is not None:
        facts = guessed
    if "task" not in facts.metadata:
        check_not_a_detector(facts)
        return None
    inferred = infer(
        facts,
        input_size=input_size,
        mean=mean,
        std=std,
        layout=layout,
        labels=read_labels(labels) if labels else None,
    )
    if guessed is not None:
        mark_guesses(inferred)
    inferred.data = {
        "name": model.stem,
        "version": "0",
        **inferred.data,
        "source": {"kind": "file", "file": model.name},
    }
    return inferred


def card_for_onnx(
    model: Path,
    *,
    input_size: tuple[int, int] | None = None,
    mean: tuple[float, float, float] | None = None,
    std: tuple[float, float, float] | None = None,
    layout: str | None = None,
    labels: Path | None = None,
) -> ModelCard:
    """A user's ``.onnx`` file's card: what its metadata says (an Ultralytics detector needs no flags),
    else ``card_for_file``'s from the flags.  ``card.extra["inferred"]`` lists the facts and their origins."""
    if not model.is_file():
        raise BuildError(f"model file {model} does not exist", "check the path")
    inferred = _inferred(model, input_size=input_size, mean=mean, std=std, layout=layout, labels=labels)
    if inferred is None:
        return card_for_file(model, input_size=input_size, mean=mean, std=std, layout=layout, labels=labels)
    card = card_from_data(model, inferred.data, {"inferred": inferred.facts})
    return replace(card, path=None)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Sequence):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML for {type(value).__name__}")


def card_text(data: Mapping[str, Any], facts: Sequence[Fact], model: str) -> str:
    """``data`` as ``model.toml`` text, each inferred value under a comment saying where it came from."""
    why: dict[str, list[str]] = {}
    for f in facts:
        why.setdefault(f.key or "", []).append(f"{f.what}: {f.origin}")
    lines = [
        f"# Inferred by edgekit from {model}: check it, edit what is wrong, then",
        "# edgekit build --model THIS_FOLDER --device DEVICE",
    ]

    def table(prefix: str, items: Mapping[str, Any]) -> None:
        for key, value in items.items():
            if isinstance(value, Mapping):
                continue
            for comment in why.get(prefix + key, []):
                lines.append(f"# {comment}")
            lines.append(f"{key} = {_toml(value)}")
        for key, value in items.items():
            if isinstance(value, Mapping):
                lines.extend(["", f"[{prefix}{key}]"])
                table(f"{prefix}{key}.", value)

    table("", data)
    rest = [f for f in facts if not f.key]
    if rest:
        lines.extend(["", "# Also inferred:", *(f"# {f.line()}" for f in rest)])
    return "\n".join(lines) + "\n"


def _relative(model: Path, folder: Path) -> str:
    """``model`` relative to the card's folder when it is inside it, else its absolute path."""
    rel = os.path.relpath(model, folder)
    return str(model) if rel.startswith("..") else rel


def write_card(
    model: Path,
    dest: Path,
    *,
    input_size: tuple[int, int] | None = None,
    mean: tuple[float, float, float] | None = None,
    std: tuple[float, float, float] | None = None,
    layout: str | None = None,
    labels: Path | None = None,
) -> tuple[Path, list[Fact]]:
    """Write ``model``'s inferred card to ``dest`` (a folder, or a ``.toml`` path), the file named
    relative to it and pinned by SHA-256; returns the card's path and the facts."""
    inferred = _inferred(
        model, input_size=input_size, mean=mean, std=std, layout=layout, labels=labels, guess=True
    )
    if inferred is None:
        raise BuildError(
            f"{model.name} does not say what it is (no ONNX metadata 'task'): there is no card to infer",
            "build it with --mean/--std (and --input-size, --labels) instead, or write a card by hand "
            "(see models/efficientnet-lite0/model.toml)",
        )
    path = dest / CARD_FILE if dest.suffix != ".toml" else dest
    path.parent.mkdir(parents=True, exist_ok=True)
    data = dict(inferred.data)
    data["source"] = {
        "kind": "file",
        "file": _relative(model.resolve(), path.parent.resolve()),
        "sha256": sha256_file(model),
    }
    path.write_text(card_text(data, inferred.facts, model.name), encoding="utf-8")
    return path, inferred.facts
