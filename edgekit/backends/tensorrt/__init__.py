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

The modules: :mod:`.options` (the backend's options), :mod:`.backend` (availability and
loading), :mod:`.engine` (building and deserializing), :mod:`.cache` (the engine cache),
:mod:`.calibrator` (INT8 from a calibration cache), :mod:`.session` (running an engine),
:mod:`.cuda` and :mod:`.logger` (cuda-python and TensorRT's logger).
"""

from edgekit.backends.tensorrt.backend import TensorRTBackend
from edgekit.backends.tensorrt.session import TensorRTSession

__all__ = ["TensorRTBackend", "TensorRTSession"]
