"""The TensorRT artifact: the fp32 ONNX plus a build config; the engine is built on the device.

A TensorRT engine only runs on the TensorRT version and GPU it was built for, so the build
host cannot make it.  The bundle carries the ONNX and the options the device's first load
uses (``edgekit.backends.tensorrt`` builds the engine then and caches it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgekit.convert.artifact import Artifact
from edgekit.core.io import write_atomic

CONFIG_SUFFIX = ".trt.json"


def tensorrt_artifact(
    fp32_onnx: Path, out_dir: Path, precision: str, options: Mapping[str, Any], stem: str
) -> Artifact:
    """Copy the ONNX for TensorRT and write its build config (precision, workspace, DLA core)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_out = out_dir / f"{stem}-tensorrt-{precision}.onnx"
    config = out_dir / f"{stem}-tensorrt-{precision}{CONFIG_SUFFIX}"
    build_options = {k: v for k, v in options.items() if k not in ("cache_dir", "device_id")}
    build_options.setdefault("fp16", precision == "fp16")
    doc = {
        "format": "edgekit-tensorrt-build/1",
        "onnx": onnx_out.name,
        "precision": precision,
        "options": build_options,
        "note": "the engine is built on the device at first load and cached by ONNX hash, TensorRT version and GPU",
    }
    # The engine is built for one frame (no optimization profiles yet): the free batch pinned to 1.
    import onnx

    from edgekit.convert.onnx_export import pin_batch

    write_atomic(onnx_out, pin_batch(onnx.load(str(fp32_onnx))).SerializeToString())
    write_atomic(config, json.dumps(doc, indent=2).encode("utf-8"))
    return Artifact(
        path=onnx_out,
        backend="tensorrt",
        precision=precision,
        arch="any",
        files=(onnx_out, config),
        options=build_options,
        notes={"engine": "built on the device at first load"},
        kind="tensorrt-onnx",
    )
