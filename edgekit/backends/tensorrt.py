"""TensorRT: NVIDIA GPUs and Jetson boards (GPU and DLA cores).

Loads a serialized engine (``.engine``/``.plan``) directly, or builds one from an ``.onnx``
file with TensorRT's ONNX parser (FP32, FP16, INT8 from a calibration cache, optionally on
a Jetson DLA core) and runs it through cuda-python's runtime bindings.

Building an engine takes seconds to minutes, so the serialized engine is cached in
``cache_dir``.  An engine only runs on the TensorRT version and the GPU it was built for
(TensorRT refuses a plan from another version; tactics are picked for one GPU), and its
numerics depend on the precision flags and DLA core, so the cache file is keyed by all of
them: ``<sha256(onnx)[:16]>-trt<version>-<gpu>-<flags>.engine``.  A new JetPack, another
board or other flags therefore get a fresh build instead of a plan that fails to load.

Both TensorRT APIs are supported: the tensor API of TensorRT >= 8.5 (the only one in 10.x)
and the bindings API of TensorRT 8.0-8.4 (JetPack 4 ships 8.2).
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit._core.io import write_atomic
from edgekit._core.paths import cache_root
from edgekit.backends.base import (
    Availability,
    Options,
    Session,
    TensorSpec,
    check_artifact,
    known_options,
    load_failed,
)
from edgekit.errors import BackendError, EdgekitError, ModelLoadError, RunError

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

NAME = "tensorrt"
OPTIONS = frozenset(
    {"fp16", "int8", "int8_calibration_cache", "workspace_mb", "cache_dir", "device_id", "dla_core"}
)
INSTALL_HINT = (
    "TensorRT comes with JetPack on a Jetson; elsewhere pip install tensorrt cuda-python (NVIDIA GPU)"
)
CUDA_HINT = "pip install cuda-python (its major version must match the CUDA the driver supports)"
ENGINE_SUFFIXES = (".engine", ".plan")


# -- options -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Settings:
    """The backend's options, validated and with their defaults filled in."""

    fp16: bool
    int8: bool
    calibration_cache: Path | None
    workspace_mb: int
    cache_dir: Path
    device_id: int
    dla_core: int | None


def _as_bool(key: str, value: Any) -> bool:
    # Options may come from YAML, a CLI flag or Python; accept the usual spellings, refuse the rest.
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in {
        "1",
        "true",
        "yes",
        "on",
        "0",
        "false",
        "no",
        "off",
    }:
        return value.strip().lower() in {"1", "true", "yes", "on"}
    raise BackendError(f"{NAME}: option {key}={value!r} is not a boolean", f"pass {key}=true or {key}=false")


def _as_int(key: str, value: Any, minimum: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = minimum - 1
    if isinstance(value, bool) or number < minimum:
        raise BackendError(
            f"{NAME}: option {key}={value!r} is not an integer >= {minimum}", f"pass {key}=<integer>"
        )
    return number


def default_cache_dir() -> Path:
    """Where built engines are cached: ``$EDGEKIT_CACHE/tensorrt``, else ``~/.cache/edgekit/tensorrt``."""
    return cache_root() / "tensorrt"


def _settings(options: Options | None) -> _Settings:
    opts = known_options(NAME, options, OPTIONS)
    int8 = _as_bool("int8", opts.get("int8", False))
    calibration: Path | None = None
    if opts.get("int8_calibration_cache") is not None:
        calibration = Path(opts["int8_calibration_cache"]).expanduser()
    if int8 and calibration is None:
        # TensorRT calibrates from sample data; edgekit does that offline, at build time.
        raise BackendError(
            f"{NAME}: int8=true needs a calibration cache produced by edgekit build",
            "run edgekit build with int8 calibration data, then pass int8_calibration_cache=<path to the .cache file>",
        )
    if int8 and calibration is not None and not calibration.is_file():
        raise BackendError(
            f"{NAME}: int8 calibration cache {calibration} does not exist",
            "produce it with edgekit build (int8 calibration), or fix the path",
        )
    dla = opts.get("dla_core")
    return _Settings(
        fp16=_as_bool("fp16", opts.get("fp16", False)),
        int8=int8,
        calibration_cache=calibration if int8 else None,
        workspace_mb=_as_int("workspace_mb", opts.get("workspace_mb", 1024), 1),
        cache_dir=Path(opts["cache_dir"]).expanduser() if opts.get("cache_dir") else default_cache_dir(),
        device_id=_as_int("device_id", opts.get("device_id", 0), 0),
        dla_core=None if dla is None else _as_int("dla_core", dla, 0),
    )


# -- lazy runtime imports ----------------------------------------------------------------


def _import_tensorrt() -> Any:
    import tensorrt

    return tensorrt


def _import_cudart() -> Any:
    # cuda-python >= 12.6 moved the runtime bindings to cuda.bindings; older releases only have cuda.cudart.
    try:
        from cuda.bindings import runtime

        return runtime
    except ImportError:
        from cuda import cudart

        return cudart


class _CudaError(RuntimeError):
    """A CUDA runtime call failed; converted to RunError / ModelLoadError at the boundary."""


def _cuda_error_name(cudart: Any, err: Any) -> str:
    result = cudart.cudaGetErrorName(err)
    name = result[1] if isinstance(result, tuple) and len(result) == 2 else getattr(err, "name", err)
    return name.decode() if isinstance(name, bytes) else str(name)


def _cuda(cudart: Any, result: Any, call: str) -> Any:
    """Unpack cuda-python's ``(err, *values)`` result, raising if ``err`` is not cudaSuccess."""
    err, values = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if err != cudart.cudaError_t.cudaSuccess:
        raise _CudaError(f"{call} failed: {_cuda_error_name(cudart, err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _gpu_name(cudart: Any, device_id: int) -> str:
    props = _cuda(cudart, cudart.cudaGetDeviceProperties(device_id), "cudaGetDeviceProperties")
    name = props.name
    if isinstance(name, bytes):
        name = name.split(b"\0", 1)[0].decode(errors="replace")
    return str(name).strip() or f"cuda device {device_id}"


# -- TensorRT logger ---------------------------------------------------------------------


class _Capture:
    """Forwards TensorRT's log to Python logging and keeps recent errors to put in our messages.

    TensorRT reports most failures (a plan from another version, an unsupported layer) only
    through its logger, returning None; the errors are kept so the exception can say why.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: list[tuple[int, str]] = []
        self._seq = 0

    def add(self, message: str) -> None:
        with self._lock:
            self._seq += 1
            self._errors = [*self._errors[-19:], (self._seq, message)]

    def mark(self) -> int:
        with self._lock:
            return self._seq

    def since(self, mark: int) -> list[str]:
        with self._lock:
            return [m for seq, m in self._errors if seq > mark]


_CAPTURE = _Capture()
_TRT_LOGGER: Any = None
_TRT_LOGGER_LOCK = threading.Lock()


def _trt_logger(trt: Any) -> Any:
    # TensorRT treats the logger as a process-wide singleton: every Builder and Runtime must get the same one.
    global _TRT_LOGGER
    with _TRT_LOGGER_LOCK:
        if _TRT_LOGGER is None:
            # trt.ILogger is the documented base for Python loggers from 8.x on; TensorRT 7/8.0
            # only expose trt.Logger, whose log() subclasses override.
            base = getattr(trt, "ILogger", None) or trt.Logger
            severity = base.Severity

            class _Logger(base):  # type: ignore[misc,valid-type]
                def __init__(self) -> None:
                    base.__init__(self)

                def log(self, level: Any, msg: str) -> None:
                    if level in (severity.INTERNAL_ERROR, severity.ERROR):
                        _CAPTURE.add(msg)
                        log.error("TensorRT: %s", msg)
                    elif level == severity.WARNING:
                        log.warning("TensorRT: %s", msg)
                    else:
                        log.debug("TensorRT: %s", msg)

            _TRT_LOGGER = _Logger()
        return _TRT_LOGGER


def _why(mark: int, fallback: str) -> str:
    errors = _CAPTURE.since(mark)
    return "; ".join(errors[-3:]) if errors else fallback


# -- engine building and caching ---------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def _cache_path(s: _Settings, onnx: bytes, trt_version: str, gpu: str) -> Path:
    flags = []
    if s.fp16:
        flags.append("fp16")
    if s.int8 and s.calibration_cache is not None:
        # The calibration scales are baked into the engine: another cache means another engine.
        flags.append("int8c" + hashlib.sha256(s.calibration_cache.read_bytes()).hexdigest()[:8])
    if s.dla_core is not None:
        flags.append(f"dla{s.dla_core}")
    digest = hashlib.sha256(onnx).hexdigest()[:16]
    return s.cache_dir / f"{digest}-trt{trt_version}-{_slug(gpu)}-{'-'.join(flags) or 'fp32'}.engine"


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a crash never leaves a half-written engine under the final name."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        log.warning("tensorrt: not caching the engine: cannot write to %s (%s)", path.parent, err)
        return
    try:
        write_atomic(path, data, mode=0o600)  # private, as the mkstemp it used to be
    except OSError as err:
        log.warning("tensorrt: not caching the engine at %s (%s)", path, err)


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


def _calibrator(trt: Any, cache: bytes) -> Any:
    """An INT8 calibrator that only replays a calibration cache (edgekit build made it from real data)."""
    # TensorRT ignores a cache whose header names another algorithm and would then try to calibrate
    # with no data, so the calibrator class must match the one that wrote the cache.
    header = cache.split(b"\n", 1)[0].decode(errors="replace")
    base = trt.IInt8EntropyCalibrator2
    if header.endswith("MinMaxCalibration"):
        base = trt.IInt8MinMaxCalibrator
    elif header.endswith("-EntropyCalibration"):
        base = trt.IInt8EntropyCalibrator

    class _CacheCalibrator(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            base.__init__(self)

        def get_batch_size(self) -> int:
            return 1

        def get_batch(self, names: Any, *args: Any) -> None:
            return None  # no data: everything comes from the cache

        def read_calibration_cache(self, *args: Any) -> bytes:
            return cache

        def write_calibration_cache(self, *args: Any) -> None:
            return None

    return _CacheCalibrator()


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


# -- backend -----------------------------------------------------------------------------


class TensorRTBackend:
    """Runs ``.onnx`` (built into a cached engine) and ``.engine``/``.plan`` files with TensorRT."""

    name = NAME
    suffixes = (".onnx", *ENGINE_SUFFIXES)
    options = OPTIONS

    def available(self, options: Options | None = None) -> Availability:
        """Whether TensorRT, cuda-python and a CUDA device (and the DLA core asked for) are here."""
        s = _settings(options)
        try:
            trt = _import_tensorrt()
        except (ImportError, OSError) as err:  # OSError: the package is there but libnvinfer is not
            return Availability(False, f"tensorrt is not installed ({err})", hint=INSTALL_HINT)
        version = str(trt.__version__)
        try:
            cudart = _import_cudart()
        except (ImportError, OSError) as err:
            return Availability(False, f"cuda-python is not installed ({err})", version, hint=CUDA_HINT)
        try:
            count = _cuda(cudart, cudart.cudaGetDeviceCount(), "cudaGetDeviceCount")
        except Exception as err:  # noqa: BLE001 - runtime boundary: a missing driver must read as "unavailable"
            return Availability(
                False,
                f"no CUDA device found ({err})",
                version,
                hint="TensorRT needs an NVIDIA GPU and its driver; on a Jetson, install JetPack",
            )
        if not count or s.device_id >= int(count):
            return Availability(
                False,
                f"no CUDA device {s.device_id} (found {count or 0})",
                version,
                hint="pick an existing device with device_id=<n>"
                if count
                else "TensorRT needs an NVIDIA GPU",
            )
        try:
            gpu = _gpu_name(cudart, s.device_id)
            if s.dla_core is not None:
                _cuda(cudart, cudart.cudaSetDevice(s.device_id), "cudaSetDevice")
                cores = int(trt.Runtime(_trt_logger(trt)).num_DLA_cores)
                if s.dla_core >= cores:
                    return Availability(
                        False,
                        f"dla_core={s.dla_core} but {gpu} has {cores} DLA core(s)",
                        version,
                        (gpu,),
                        "DLA cores exist on Jetson AGX Xavier/Orin and Xavier NX/Orin NX; drop dla_core elsewhere",
                    )
        except Exception as err:  # noqa: BLE001 - runtime boundary
            return Availability(
                False, f"could not query CUDA device {s.device_id} ({err})", version, hint=INSTALL_HINT
            )
        return Availability(True, "", version, (gpu,))

    def load(self, artifact: Path, options: Options | None = None) -> Session:
        """Deserialize an engine, or build (and cache) one from an ONNX file; return a ready session."""
        s = _settings(options)
        artifact = check_artifact(NAME, artifact, self.suffixes)
        try:
            trt = _import_tensorrt()
            cudart = _import_cudart()
        except (ImportError, OSError) as err:
            raise BackendError(f"{NAME}: the runtime is not installed ({err})", INSTALL_HINT) from err
        prebuilt = artifact.name.endswith(ENGINE_SUFFIXES)
        version = str(trt.__version__)
        try:
            _cuda(cudart, cudart.cudaSetDevice(s.device_id), "cudaSetDevice")
            gpu = _gpu_name(cudart, s.device_id)
            logger = _trt_logger(trt)
            runtime = trt.Runtime(logger)
            if s.dla_core is not None:
                # The runtime must know the DLA core before deserializing a DLA engine.
                runtime.DLA_core = s.dla_core
            if prebuilt:
                if s.fp16 or s.int8:
                    log.warning(
                        "tensorrt: fp16/int8 are fixed when an engine is built; ignored for %s", artifact.name
                    )
                engine = _deserialize(runtime, artifact.read_bytes(), artifact)
            else:
                engine = self._engine_from_onnx(trt, logger, runtime, artifact, s, gpu)
            return TensorRTSession(
                artifact,
                trt=trt,
                cudart=cudart,
                runtime=runtime,
                engine=engine,
                device_id=s.device_id,
                gpu=gpu,
            )
        except EdgekitError:
            raise
        except _CudaError as err:
            raise ModelLoadError(
                f"{NAME} could not load {artifact} on cuda:{s.device_id}: {err}",
                "the GPU may be out of memory (close other sessions or processes using it), "
                "or the CUDA driver failed: restart the process",
            ) from err
        except Exception as err:  # runtime boundary: every failure becomes one error
            expected = (
                f"a TensorRT engine built by TensorRT {version} for this GPU"
                if prebuilt
                else "an ONNX model TensorRT can parse and build"
            )
            raise load_failed(NAME, artifact, err, expected) from err

    def _engine_from_onnx(
        self, trt: Any, logger: Any, runtime: Any, artifact: Path, s: _Settings, gpu: str
    ) -> Any:
        onnx = artifact.read_bytes()
        cached = _cache_path(s, onnx, str(trt.__version__), gpu)
        if cached.is_file():
            try:
                engine = _deserialize(runtime, cached.read_bytes(), cached)
                log.info("tensorrt: using cached engine %s", cached)
                return engine
            except ModelLoadError as err:
                # A cache entry that won't load (disk corruption, a driver update) is rebuilt, once.
                log.warning("tensorrt: cached engine %s is unusable, rebuilding (%s)", cached, err.message)
                cached.unlink(missing_ok=True)
        plan = _build_engine(trt, logger, onnx, artifact, s)
        _write_atomically(cached, plan)
        return _deserialize(runtime, plan, artifact)


# -- session -----------------------------------------------------------------------------


@dataclass
class _Tensor:
    """One engine input or output, with its device buffer."""

    name: str
    index: int
    is_input: bool
    dtype: str
    shape: tuple[int, ...]  # as the engine reports it: -1 for a free dimension
    min_shape: tuple[int, ...] = ()
    max_shape: tuple[int, ...] = ()
    ptr: int = 0
    nbytes: int = 0


def _numpy_dtype(trt: Any, trt_dtype: Any, name: str) -> str:
    import numpy as np

    try:
        return str(np.dtype(trt.nptype(trt_dtype)).name)
    except TypeError as err:
        # BF16, FP8 and INT4 have no numpy equivalent.
        raise ModelLoadError(
            f"{NAME}: tensor '{name}' has type {trt_dtype}, which numpy cannot hold ({err})",
            "export the model with float32/float16/int8 inputs and outputs",
        ) from err


class TensorRTSession(Session):
    """A TensorRT engine on one CUDA device, with its execution context, stream and device buffers."""

    backend = NAME

    def __init__(
        self, artifact: Path, *, trt: Any, cudart: Any, runtime: Any, engine: Any, device_id: int, gpu: str
    ) -> None:
        self._trt = trt
        self._cudart = cudart
        # The runtime is kept because an engine must not outlive the runtime that deserialized it.
        self._runtime: Any = runtime
        self._engine: Any = engine
        self._context: Any = None
        self._stream: Any = None
        self._device_id = device_id
        self._tensor_api = hasattr(engine, "num_io_tensors")  # TensorRT >= 8.5
        self._tensors: list[_Tensor] = []
        self._bindings: list[int] = []
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()  # one set of device buffers: one run at a time
        self._released = False
        try:
            inputs, outputs = self._setup()
        except BaseException:
            self._release()
            raise
        super().__init__(artifact, inputs, outputs, device=f"cuda:{device_id} ({gpu})")

    # ----- setup

    def _describe(self) -> list[_Tensor]:
        trt, engine = self._trt, self._engine
        tensors = []
        if self._tensor_api:
            for i in range(engine.num_io_tensors):
                name = engine.get_tensor_name(i)
                t = _Tensor(
                    name,
                    i,
                    engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT,
                    _numpy_dtype(trt, engine.get_tensor_dtype(name), name),
                    tuple(int(d) for d in engine.get_tensor_shape(name)),
                )
                if t.is_input and -1 in t.shape:
                    lo, _, hi = engine.get_tensor_profile_shape(name, 0)
                    t.min_shape, t.max_shape = tuple(int(d) for d in lo), tuple(int(d) for d in hi)
                tensors.append(t)
        else:
            for i in range(engine.num_bindings):
                name = engine.get_binding_name(i)
                t = _Tensor(
                    name,
                    i,
                    bool(engine.binding_is_input(i)),
                    _numpy_dtype(trt, engine.get_binding_dtype(i), name),
                    tuple(int(d) for d in engine.get_binding_shape(i)),
                )
                if t.is_input and -1 in t.shape:
                    lo, _, hi = engine.get_profile_shape(0, i)
                    t.min_shape, t.max_shape = tuple(int(d) for d in lo), tuple(int(d) for d in hi)
                tensors.append(t)
        for t in tensors:
            if t.is_input and not t.max_shape:
                t.min_shape = t.max_shape = t.shape
        return tensors

    def _set_shape(self, t: _Tensor, shape: tuple[int, ...]) -> bool:
        if -1 not in t.shape:
            return shape == t.shape  # a static input: nothing to tell TensorRT
        if self._shapes.get(t.name) == shape:
            return True
        if self._tensor_api:
            ok = self._context.set_input_shape(t.name, shape)
        else:
            ok = self._context.set_binding_shape(t.index, shape)
        # TensorRT 8.x returns a bool; some 10.x builds return None and log instead.
        if ok is False:
            return False
        self._shapes[t.name] = shape
        return True

    def _output_shape(self, t: _Tensor) -> tuple[int, ...]:
        dims = (
            self._context.get_tensor_shape(t.name)
            if self._tensor_api
            else self._context.get_binding_shape(t.index)
        )
        return tuple(int(d) for d in dims)

    def _setup(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        cudart = self._cudart
        if getattr(self._engine, "has_implicit_batch_dimension", False):
            raise ModelLoadError(
                f"{NAME}: the engine was built with an implicit batch dimension (UFF/Caffe era)",
                "rebuild it from an ONNX model (explicit batch)",
            )
        self._context = self._engine.create_execution_context()
        if self._context is None:
            raise ModelLoadError(
                f"{NAME}: could not create an execution context (out of GPU memory?)",
                "close other sessions or processes using the GPU",
            )
        self._tensors = self._describe()
        inputs = [t for t in self._tensors if t.is_input]
        outputs = [t for t in self._tensors if not t.is_input]

        # Output sizes at the smallest and largest input shapes: equal dimensions are fixed, the
        # largest sizes the buffers so they are allocated once for every shape the profile allows.
        out_shapes: list[dict[str, tuple[int, ...]]] = []
        for pick in ("min_shape", "max_shape"):
            for t in inputs:
                if not self._set_shape(t, getattr(t, pick)):
                    raise ModelLoadError(
                        f"{NAME}: the engine refused input '{t.name}' shape {getattr(t, pick)}",
                        "rebuild the engine",
                    )
            out_shapes.append({t.name: self._output_shape(t) for t in outputs})
        small, large = out_shapes
        for t in outputs:
            if any(d < 0 for d in large[t.name]):
                raise ModelLoadError(
                    f"{NAME}: output '{t.name}' has a data-dependent shape {large[t.name]}, which edgekit does not support",
                    "export the model with fixed-size outputs (e.g. pad NonZero/NMS results)",
                )

        def dims(lo: tuple[int, ...], hi: tuple[int, ...]) -> tuple[int | None, ...]:
            return tuple(a if a == b and a >= 0 else None for a, b in zip(lo, hi, strict=True))

        import numpy as np

        for t in self._tensors:
            shape = t.max_shape if t.is_input else large[t.name]
            t.nbytes = math.prod(shape) * np.dtype(t.dtype).itemsize
            # cudaMalloc(0) gives a null pointer TensorRT rejects; an empty tensor still gets a byte.
            t.ptr = int(_cuda(cudart, cudart.cudaMalloc(max(t.nbytes, 1)), "cudaMalloc"))
        self._stream = _cuda(cudart, cudart.cudaStreamCreate(), "cudaStreamCreate")
        # The buffers never move, so the addresses are bound once.
        self._bindings = [t.ptr for t in sorted(self._tensors, key=lambda t: t.index)]
        if self._tensor_api:
            for t in self._tensors:
                if not self._context.set_tensor_address(t.name, t.ptr):
                    raise ModelLoadError(f"{NAME}: could not bind tensor '{t.name}'", "rebuild the engine")
        return (
            [TensorSpec(t.name, dims(t.min_shape, t.max_shape), t.dtype) for t in inputs],
            [TensorSpec(t.name, dims(small[t.name], large[t.name]), t.dtype) for t in outputs],
        )

    # ----- run

    def _run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        try:
            with self._lock:
                return self._execute(arrays)
        except EdgekitError:
            raise
        except Exception as err:  # runtime boundary: every failure becomes one RunError
            raise RunError(
                f"{NAME} failed running {self.artifact} on {self.device}: {err}",
                "check the input against session.inputs; a CUDA error may need the process restarted",
            ) from err

    def _execute(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        import numpy as np

        cudart, context, stream = self._cudart, self._context, self._stream
        # The current device is per thread in CUDA; a session may run on another thread than it loaded on.
        _cuda(cudart, cudart.cudaSetDevice(self._device_id), "cudaSetDevice")
        inputs = [t for t in self._tensors if t.is_input]
        outputs = [t for t in self._tensors if not t.is_input]
        # Host arrays must stay alive (and contiguous) until the stream is synchronized.
        hosts = [np.ascontiguousarray(a) for a in arrays]
        mark = _CAPTURE.mark()
        for t, host in zip(inputs, hosts, strict=True):
            if not self._set_shape(t, tuple(host.shape)) or host.nbytes > t.nbytes:
                raise RunError(
                    f"{NAME}: input '{t.name}' shape {tuple(host.shape)} is outside the engine's range "
                    f"{t.min_shape}..{t.max_shape}: {_why(mark, 'refused by the engine')}",
                    "resize the input to the model's shape",
                )
        h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        for t, host in zip(inputs, hosts, strict=True):
            _cuda(
                cudart,
                cudart.cudaMemcpyAsync(t.ptr, host.ctypes.data, host.nbytes, h2d, stream),
                "cudaMemcpyAsync",
            )
        if self._tensor_api:
            ok = context.execute_async_v3(int(stream))
        else:
            # execute_v2 is synchronous and not ordered with our stream: the inputs must have landed.
            _cuda(cudart, cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
            ok = context.execute_v2(self._bindings)
        if ok is False:
            raise RunError(
                f"{NAME}: inference failed on {self.artifact}: {_why(mark, 'the engine returned false')}",
                "see the TensorRT errors logged above",
            )
        results = [np.empty(self._output_shape(t), dtype=t.dtype) for t in outputs]
        d2h = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for t, out in zip(outputs, results, strict=True):
            _cuda(
                cudart,
                cudart.cudaMemcpyAsync(out.ctypes.data, t.ptr, out.nbytes, d2h, stream),
                "cudaMemcpyAsync",
            )
        _cuda(cudart, cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        return results

    # ----- close

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        cudart = self._cudart
        for t in self._tensors:
            if t.ptr:
                try:
                    _cuda(cudart, cudart.cudaFree(t.ptr), "cudaFree")
                except _CudaError as err:
                    # close() runs in __exit__ and finally blocks: it must not hide the error being handled.
                    log.warning("tensorrt: %s", err)
                t.ptr = 0
        if self._stream is not None:
            try:
                _cuda(cudart, cudart.cudaStreamDestroy(self._stream), "cudaStreamDestroy")
            except _CudaError as err:
                log.warning("tensorrt: %s", err)
            self._stream = None
        self._bindings = []
        # Destruction order matters to TensorRT: context, then engine, then runtime.
        self._context = None
        self._engine = None
        self._runtime = None

    def close(self) -> None:
        """Free the device buffers, stream, context and engine; calling it again does nothing."""
        with self._lock:
            self._release()
        super().close()
