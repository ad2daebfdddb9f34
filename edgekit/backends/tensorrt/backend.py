"""The TensorRT backend: whether it can run here, and loading an engine or an ONNX file into a session.

An ``.engine``/``.plan`` is deserialized as it is; an ``.onnx`` is built into an engine
once and cached (:mod:`edgekit.backends.tensorrt.cache`).  tensorrt and cuda-python are
imported only when the backend is used, so edgekit imports without them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from edgekit.backends.base import Availability, Options, Session, check_artifact, load_failed
from edgekit.backends.tensorrt.cache import _cache_path, _read_cached, _sidecar, _write_atomically
from edgekit.backends.tensorrt.cuda import _cuda, _CudaError, _gpu_name, _import_cudart
from edgekit.backends.tensorrt.engine import _build_engine, _deserialize
from edgekit.backends.tensorrt.logger import _trt_logger
from edgekit.backends.tensorrt.options import (
    CUDA_HINT,
    ENGINE_SUFFIXES,
    INSTALL_HINT,
    NAME,
    OPTIONS,
    _Settings,
    _settings,
)
from edgekit.backends.tensorrt.session import TensorRTSession
from edgekit.errors import BackendError, EdgekitError, ModelLoadError

log = logging.getLogger(__name__)


def _import_tensorrt() -> Any:
    import tensorrt

    return tensorrt


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
        plan = _read_cached(cached) if cached.is_file() else None  # None: damaged, or not ours
        if plan is not None:
            try:
                engine = _deserialize(runtime, plan, cached)
                log.info("tensorrt: using cached engine %s", cached)
                return engine
            except ModelLoadError as err:
                # A cache entry that won't load (disk corruption, a driver update) is rebuilt, once.
                log.warning("tensorrt: cached engine %s is unusable, rebuilding (%s)", cached, err.message)
                cached.unlink(missing_ok=True)
                _sidecar(cached).unlink(missing_ok=True)
        plan = _build_engine(trt, logger, onnx, artifact, s)
        _write_atomically(cached, plan)
        return _deserialize(runtime, plan, artifact)
