"""ONNX Runtime: the backend that runs everywhere.

CPU always; the TensorRT, CUDA and OpenVINO execution providers (with their options)
when the installed build has them.  A candidate that asks for providers this build lacks
is reported unavailable, so selection falls back instead of silently running on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
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
        import onnxruntime as ort

        opts = known_options(NAME, options, OPTIONS)
        artifact = check_artifact(NAME, artifact, self.suffixes)
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
        if "optimized_model_path" in opts:
            so.optimized_model_filepath = str(opts["optimized_model_path"])
        providers = _providers(opts)
        try:
            sess = ort.InferenceSession(
                str(artifact),
                sess_options=so,
                providers=[name for name, _ in providers],
                provider_options=[popts for _, popts in providers],
            )
        except Exception as err:
            raise load_failed(
                NAME, artifact, err, "an ONNX model (opset >= 7) readable by onnxruntime"
            ) from err
        return OnnxRuntimeSession(artifact, sess)


class OnnxRuntimeSession(Session):
    backend = NAME

    def __init__(self, artifact: Path, sess: Any) -> None:
        def spec(arg: Any) -> TensorSpec:
            shape = tuple(d if isinstance(d, int) else None for d in arg.shape)
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
