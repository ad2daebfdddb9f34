"""Compile an ONNX model to a TVM Relax library for a device profile's target.

The library is written with its ``.io.json`` beside it (the VM does not keep input
shapes).  Both are written to temporary names and renamed into place, so a failed or
interrupted compile never leaves a file that looks valid.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgekit.backends.tvm import io_path
from edgekit.errors import BuildError

# A cross compiler per target triple; the host compiler handles the host's own triple.
CROSS_COMPILERS = {
    "aarch64-linux-gnu": "aarch64-linux-gnu-gcc",
    "arm-linux-gnueabihf": "arm-linux-gnueabihf-gcc",
}
_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 10: "float16", 11: "float64"}


def _compiler(target: Mapping[str, Any]) -> str | None:
    """The C compiler to link with, or ``None`` for the host's default."""
    import platform

    triple = str(target.get("mtriple", ""))
    if not triple or triple.startswith(platform.machine()):
        return None
    cc = CROSS_COMPILERS.get(triple)
    if cc is None or shutil.which(cc) is None:
        raise BuildError(
            f"no cross compiler for {triple}" + (f" ({cc} is not on PATH)" if cc else ""),
            "on Debian/Ubuntu: apt-get install gcc-aarch64-linux-gnu"
            if "aarch64" in triple
            else "install a cross gcc for that triple",
        )
    return cc


def _io(model: Any) -> dict[str, list[dict[str, Any]]]:
    init = {i.name for i in model.graph.initializer}

    def spec(v: Any) -> dict[str, Any]:
        t = v.type.tensor_type
        return {
            "name": v.name,
            "shape": [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim],
            "dtype": _ONNX_DTYPES.get(t.elem_type, "float32"),
        }

    return {
        "inputs": [spec(v) for v in model.graph.input if v.name not in init],
        "outputs": [spec(v) for v in model.graph.output],
    }


def compile_onnx(onnx_path: Path, out: Path, target: Mapping[str, Any]) -> Path:
    """Compile ``onnx_path`` for ``target`` (a TVM target dict) into the library ``out``."""
    import onnx
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    model = onnx.load(str(onnx_path))
    for spec in _io(model)["inputs"]:
        if None in spec["shape"]:
            raise BuildError(
                f"{onnx_path}: input {spec['name']} has a dynamic shape {spec['shape']}",
                "TVM needs static shapes: export the model with a fixed input size",
            )
    cc = _compiler(target)
    try:
        mod = from_onnx(model, keep_params_in_input=False)
        executable = relax.build(mod, tvm.target.Target(dict(target)))
    except Exception as err:
        raise BuildError(
            f"TVM could not compile {onnx_path} for {dict(target)}: {err}",
            "check that every operator is supported by TVM's ONNX importer",
        ) from err
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}.so")
    try:
        executable.export_library(str(tmp), **({"cc": cc} if cc else {}))
        io_tmp = tmp.with_suffix(".json")
        io_tmp.write_text(json.dumps(_io(model), indent=2), encoding="utf-8")
        os.replace(io_tmp, io_path(out))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_suffix(".json").unlink(missing_ok=True)
    return out
