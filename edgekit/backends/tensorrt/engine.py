"""Building a serialized TensorRT engine from ONNX, and deserializing one.

The builder covers the TensorRT generations the backend supports: the explicit-batch flag
TensorRT < 10 needs, the memory-pool API of >= 8.4 against ``max_workspace_size`` before
it, and ``build_serialized_network`` (>= 8.0) against TensorRT 7's ``build_engine``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from edgekit.backends.tensorrt.calibrator import _calibrator
from edgekit.backends.tensorrt.logger import _CAPTURE, _why
from edgekit.backends.tensorrt.options import NAME, _Settings
from edgekit.errors import BackendError, ModelLoadError

log = logging.getLogger(__name__)


def _describe_parser_error(error: Any) -> str:
    desc = str(error.desc())
    where = []
    node = error.node() if hasattr(error, "node") else -1
    if isinstance(node, int) and node >= 0:
        where.append(f"node #{node}")
    # node_name()/node_operator() exist from TensorRT 8.6 on.
    for attr in ("node_name", "node_operator"):
        getter = getattr(error, attr, None)
        value = str(getter()) if callable(getter) else ""
        if value:
            where.append(f"'{value}'" if attr == "node_name" else f"({value})")
    return f"{' '.join(where)}: {desc}" if where else desc


def _build_engine(trt: Any, logger: Any, onnx: bytes, artifact: Path, s: _Settings) -> bytes:
    """Parse ``onnx`` and build a serialized engine with the requested precision and device."""
    major = int(str(trt.__version__).split(".", 1)[0])
    builder = trt.Builder(logger)
    # Explicit batch is required for ONNX on TensorRT < 10, and the flag is deprecated (always on) in 10.
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH) if major < 10 else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    # path= lets the parser find weights stored next to the model (ONNX external data).
    if not parser.parse(onnx, path=str(artifact)):
        errors = [_describe_parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
        raise ModelLoadError(
            f"{NAME} could not parse {artifact}:\n"
            + "\n".join(f"  - {e}" for e in errors or ["unknown parser error"]),
            "the model uses an operator or opset this TensorRT does not support: re-export it with "
            "another opset, simplify it (onnxsim), or use the onnxruntime backend",
        )

    config = builder.create_builder_config()
    profile = _fixed_batch_profile(trt, builder, network, artifact)
    if profile is not None:
        config.add_optimization_profile(profile)
    workspace = s.workspace_mb << 20
    if hasattr(config, "set_memory_pool_limit"):  # TensorRT >= 8.4
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
    else:  # TensorRT 8.0/8.2 (JetPack 4)
        config.max_workspace_size = workspace
    if s.fp16:
        if not getattr(builder, "platform_has_fast_fp16", True):
            log.warning("tensorrt: this GPU has no fast FP16; building with fp16 anyway")
        config.set_flag(trt.BuilderFlag.FP16)
    calibrator = None
    if s.int8 and s.calibration_cache is not None:
        if not getattr(builder, "platform_has_fast_int8", True):
            log.warning(
                "tensorrt: this GPU has no fast INT8 (e.g. Jetson Nano/TX2); building with int8 anyway"
            )
        config.set_flag(trt.BuilderFlag.INT8)
        # Keep a reference for the whole build: the config does not own the Python object.
        calibrator = _calibrator(trt, s.calibration_cache.read_bytes())
        config.int8_calibrator = calibrator
    if s.dla_core is not None:
        if not (s.fp16 or s.int8):
            raise BackendError(
                f"{NAME}: dla_core={s.dla_core} needs fp16=true or int8=true (DLA runs only FP16 and INT8)",
                "add fp16=true, or drop dla_core to run on the GPU",
            )
        cores = int(getattr(builder, "num_DLA_cores", 0))
        if s.dla_core >= cores:
            raise BackendError(
                f"{NAME}: dla_core={s.dla_core} but this device has {cores} DLA core(s)",
                "DLA cores exist on Jetson AGX Xavier/Orin and Xavier NX/Orin NX; drop dla_core elsewhere",
            )
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = s.dla_core
        # Layers DLA can't run go to the GPU instead of failing the build.
        config.set_flag(trt.BuilderFlag.GPU_FALLBACK)

    mark = _CAPTURE.mark()
    log.info("tensorrt: building an engine for %s (this can take minutes on a Jetson)", artifact.name)
    if hasattr(builder, "build_serialized_network"):  # TensorRT >= 8.0
        plan = builder.build_serialized_network(network, config)
    else:  # TensorRT 7 (JetPack 4.4/4.5)
        engine = builder.build_engine(network, config)
        plan = engine.serialize() if engine is not None else None
    del calibrator
    if plan is None:
        raise ModelLoadError(
            f"{NAME} could not build an engine from {artifact}: {_why(mark, 'the builder returned nothing')}",
            "see the TensorRT errors above; try without fp16/int8/dla_core, a larger workspace_mb, "
            "or the onnxruntime backend",
        )
    return bytes(plan)


def _fixed_batch_profile(trt: Any, builder: Any, network: Any, artifact: Path) -> Any:
    """A profile fixing a free batch axis to 1; TensorRT can't build dynamic inputs without one."""
    profile = None
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        shape = tuple(tensor.shape)
        if all(d >= 0 for d in shape):
            continue
        if any(d < 0 for d in shape[1:]):
            raise ModelLoadError(
                f"{NAME}: input '{tensor.name}' of {artifact} has free dimensions {shape} beyond the batch axis",
                "export the ONNX model with fixed input sizes, or build an engine with trtexec "
                "--minShapes/--optShapes/--maxShapes and load the .engine",
            )
        # Edge inference runs one frame at a time; a fixed batch of 1 lets TensorRT pick the best kernels.
        fixed = (1, *shape[1:])
        log.info("tensorrt: input '%s' has a free batch axis; building for batch 1", tensor.name)
        profile = profile or builder.create_optimization_profile()
        profile.set_shape(tensor.name, fixed, fixed, fixed)
    return profile


def _deserialize(runtime: Any, plan: bytes, source: Path) -> Any:
    mark = _CAPTURE.mark()
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise ModelLoadError(
            f"{NAME} could not load the engine {source}: {_why(mark, 'deserialize_cuda_engine returned nothing')}",
            "an engine only runs on the TensorRT version and GPU it was built for: rebuild it from the .onnx",
        )
    return engine
