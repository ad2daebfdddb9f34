"""ONNX Runtime: the backend that runs everywhere.

CPU always; the TensorRT, CUDA and OpenVINO execution providers (with their options)
when the installed build has them.  A candidate that asks for providers this build lacks
is reported unavailable, so selection falls back instead of silently running on CPU.

Batch: a file whose inputs' and outputs' dim 0 is a free ``dim_param`` (what edgekit build
exports) loads pinned to batch 1, and ``batched(n)`` makes a session pinned to n from the bytes
read at load.  A file with a fixed batch loads from its path as it always has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.backends.base import (
    Availability,
    Options,
    Session,
    TensorSpec,
    check_artifact,
    known_options,
    load_failed,
)
from edgekit.backends.onnx_batch import batch_dim_params
from edgekit.errors import RunError

if TYPE_CHECKING:
    import numpy as np

NAME = "onnxruntime"
OPTIONS = frozenset(
    {"providers", "intra_op_threads", "inter_op_threads", "optimization", "optimized_model_path", "spin"}
)
# ONNX tensor element types as ORT names them -> numpy dtype names.
_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(uint8)": "uint8",
    "tensor(int8)": "int8",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(bool)": "bool",
}
_LEVELS = ("disable", "basic", "extended", "all")


def _providers(opts: Options) -> list[tuple[str, dict[str, Any]]]:
    """Normalise ``providers`` (names, or ``[name, {options}]`` pairs) to (name, options) pairs."""
    out: list[tuple[str, dict[str, Any]]] = []
    for p in opts.get("providers") or ["CPUExecutionProvider"]:
        if isinstance(p, str):
            out.append((p, {}))
        else:
            name, popts = p
            out.append((str(name), {k: str(v) for k, v in dict(popts).items()}))
    return out


class OnnxRuntimeBackend:
    """Runs ``.onnx`` files with ONNX Runtime."""

    name = NAME
    suffixes = (".onnx",)
    options = OPTIONS

    def available(self, options: Options | None = None) -> Availability:
        try:
            import onnxruntime as ort
        except ImportError as err:
            return Availability(
                False, f"onnxruntime is not installed ({err})", hint='pip install "edgekit[device]"'
            )
        have = tuple(ort.get_available_providers())
        wanted = [name for name, _ in _providers(options or {})]
        missing = [p for p in wanted if p not in have]
        if missing:
            return Availability(
                False,
                f"this onnxruntime build has no {', '.join(missing)} (it has {', '.join(have)})",
                ort.__version__,
                have,
                "install onnxruntime-gpu (NVIDIA) or onnxruntime-openvino for those execution providers",
            )
        return Availability(True, "", ort.__version__, have)

    def load(self, artifact: Path, options: Options | None = None) -> Session:
        opts = known_options(NAME, options, OPTIONS)
        artifact = check_artifact(NAME, artifact, self.suffixes)
        # Read once: the session is made from these bytes (external data resolves beside the file).
        model = artifact.read_bytes()
        free = batch_dim_params(model)
        if free is None:
            return _open(artifact, model, opts, None)
        # A free batch is pinned to 1, so that a plain session runs as fast as a static one; the
        # bytes are kept, so that batched(n) makes its sessions without reading the file again.
        return _open(artifact, model, opts, _FreeBatch(model, free, 1))


@dataclass(frozen=True)
class _FreeBatch:
    """What a session of a free-batch model keeps to make its batched twins: the file's bytes, the
    dim_param names of its batch dimension, and the batch this session is pinned to."""

    model: bytes
    names: tuple[str, ...]
    n: int


def _session_options(opts: Options, batch: _FreeBatch | None) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    # Logs below ERROR are noise on a device; errors are turned into EdgekitErrors below.
    so.log_severity_level = 3
    if "intra_op_threads" in opts:
        so.intra_op_num_threads = int(opts["intra_op_threads"])
    if "inter_op_threads" in opts:
        so.inter_op_num_threads = int(opts["inter_op_threads"])
    # ORT's worker threads spin-wait after every parallel section by default.  A camera
    # pipeline is idle between frames and shares its cores (capture, the app, another
    # process): there the spinning thread steals the time its partner needs.  Measured with
    # a CPU hog on one of two cores: p99 53 ms spinning vs 30 ms not; quiet, spinning saves
    # ~0.3 ms of 13.  Off unless the profile says ``spin = true``.
    spin = bool(opts.get("spin", False))
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "1" if spin else "0")
    # ORT can run fp32 GEMMs in bf16 on Arm cores that have it ("fast math"); it is off by
    # default, and said here so that no build of ORT that flips the default runs fp32 in bf16.
    so.add_session_config_entry("mlas.enable_gemm_fastmath_arm64_bfloat16", "0")
    level = opts.get("optimization", "all")
    so.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    # The optimized graph is written by the pinned session only: a batched twin would overwrite
    # it with its own batch.
    if "optimized_model_path" in opts and (batch is None or batch.n == 1):
        so.optimized_model_filepath = str(opts["optimized_model_path"])
    if batch is not None:
        # Every dimension named like the batch becomes n: shapes are then static, as in a
        # fixed-batch file, and ORT plans its memory and kernels once.
        for name in batch.names:
            so.add_free_dimension_override_by_name(name, batch.n)
    return so


def _open(artifact: Path, model: bytes, opts: Options, batch: _FreeBatch | None) -> OnnxRuntimeSession:
    """An ORT session of ``model`` (the file's bytes, read once at load) with ``opts``."""
    import onnxruntime as ort

    so = _session_options(opts, batch)
    # Made from bytes, a model with external data still finds it beside the file.
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(artifact.parent))
    providers = _providers(opts)
    try:
        sess = ort.InferenceSession(
            model,
            sess_options=so,
            providers=[name for name, _ in providers],
            provider_options=[popts for _, popts in providers],
        )
    except Exception as err:
        expected = (
            f"a model that runs at batch {batch.n}"
            if batch is not None and batch.n != 1
            else "an ONNX model (opset >= 7) readable by onnxruntime"
        )
        raise load_failed(NAME, artifact, err, expected) from err
    return OnnxRuntimeSession(artifact, sess, opts, batch)


class OnnxRuntimeSession(Session):
    backend = NAME

    def __init__(
        self, artifact: Path, sess: Any, opts: Options | None = None, batch: _FreeBatch | None = None
    ) -> None:
        def spec(arg: Any) -> TensorSpec:
            shape = tuple(d if isinstance(d, int) else None for d in arg.shape)
            if batch is not None:  # pinned: report the batch it runs, whatever ORT says of dim 0
                shape = (batch.n, *shape[1:])
            return TensorSpec(arg.name, shape, _DTYPES.get(arg.type, arg.type))

        super().__init__(
            artifact,
            [spec(i) for i in sess.get_inputs()],
            [spec(o) for o in sess.get_outputs()],
            device=sess.get_providers()[0],
        )
        self._sess = sess
        #: Every provider the session really uses, in priority order.
        self.providers: tuple[str, ...] = tuple(sess.get_providers())
        self._names = [i.name for i in self.inputs]
        self._opts = dict(opts or {})
        self._batch = batch

    @property
    def batchable(self) -> bool:
        return self._batch is not None

    def _batched(self, n: int) -> Session:
        assert self._batch is not None  # Session.batched asked batchable first
        return _open(self.artifact, self._batch.model, self._opts, replace(self._batch, n=n))

    def _run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        try:
            return list(self._sess.run(None, dict(zip(self._names, arrays, strict=True))))
        except Exception as err:
            raise RunError(
                f"{NAME} failed running {self.artifact}: {err}", "check the input against session.inputs"
            ) from err

    def close(self) -> None:
        self._sess = None
        super().close()
