"""Which backends exist, found lazily by dotted path (fsspec's ``known_implementations``).

Importing this module imports no runtime: a backend's module is imported the first time
it is asked for, and its runtime only when it is probed or loads a model.  Third-party
backends register through the ``edgekit.backends`` entry-point group; a plugin that fails
to import raises an error carrying its own name (pluggy's rule: fail loudly).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points

from edgekit.backends.base import Backend
from edgekit.errors import BackendError

ENTRY_POINT_GROUP = "edgekit.backends"


@dataclass(frozen=True)
class BackendEntry:
    """Where a backend's class lives, and the sentence to print when its runtime is missing."""

    name: str
    target: str  # "package.module:Class"
    install_hint: str
    plugin: bool = False


BUILTIN: dict[str, BackendEntry] = {
    e.name: e
    for e in (
        BackendEntry(
            "tensorrt",
            "edgekit.backends.tensorrt:TensorRTBackend",
            "TensorRT comes with JetPack on a Jetson; elsewhere pip install tensorrt cuda-python (NVIDIA GPU)",
        ),
        BackendEntry(
            "onnxruntime",
            "edgekit.backends.onnxruntime:OnnxRuntimeBackend",
            'pip install "edgekit[device]" (onnxruntime-gpu on NVIDIA machines)',
        ),
        BackendEntry(
            "openvino", "edgekit.backends.openvino:OpenVINOBackend", 'pip install "edgekit[openvino]"'
        ),
        BackendEntry("litert", "edgekit.backends.litert:LiteRTBackend", 'pip install "edgekit[litert]"'),
        BackendEntry("tvm", "edgekit.backends.tvm:TVMBackend", 'pip install "edgekit[tvm]"'),
    )
}


@cache
def entries() -> dict[str, BackendEntry]:
    """Built-in backends plus those registered by installed plugins (built-ins win a name clash)."""
    found = dict(BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in found:
            found[ep.name] = BackendEntry(
                ep.name, ep.value, f"see the documentation of the plugin providing '{ep.name}'", plugin=True
            )
    return found


def names() -> list[str]:
    """Every backend name, built-ins first in a fixed order, then plugins sorted by name."""
    all_entries = entries()
    return [n for n in BUILTIN] + sorted(n for n in all_entries if n not in BUILTIN)


@cache
def get(name: str) -> Backend:
    """The backend called ``name``; its module is imported now, its runtime is not."""
    entry = entries().get(name)
    if entry is None:
        raise BackendError(f"unknown backend '{name}'", f"known backends: {', '.join(names())}")
    module_name, _, attr = entry.target.partition(":")
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, attr)
    except (ImportError, AttributeError) as err:
        what = f"plugin '{name}' ({entry.target})" if entry.plugin else f"backend '{name}' ({entry.target})"
        raise BackendError(f"{what} failed to import: {err}", entry.install_hint) from err
    backend = cls()
    if not isinstance(backend, Backend):
        raise BackendError(
            f"{entry.target} does not implement the edgekit Backend protocol",
            "see edgekit.backends.base.Backend",
        )
    return backend


def install_hint(name: str) -> str:
    """The sentence telling a user how to get backend ``name``'s runtime."""
    entry = entries().get(name)
    return entry.install_hint if entry else ""
