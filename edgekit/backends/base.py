"""The Backend protocol every runtime implements, and the session it returns.

A backend is small: ``available(options)`` says whether it can run here (and why not),
``load(artifact, options)`` returns a :class:`Session`.  A session knows its input and
output specs, checks what it is given against them, runs, and closes.  Nothing in this
module imports a runtime.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from edgekit.errors import InputError, ModelLoadError, first_line

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

Options = Mapping[str, Any]


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here; when it cannot, ``reason`` says why and ``hint`` what to do."""

    ok: bool
    reason: str = ""
    version: str | None = None
    devices: tuple[str, ...] = ()
    hint: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class Quantization:
    """Affine quantization of a tensor: ``real = scale * (q - zero_point)``."""

    scale: float
    zero_point: int


@dataclass(frozen=True)
class TensorSpec:
    """What a model expects or returns: name, shape (``None`` for a free dimension), numpy dtype."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str
    quantization: Quantization | None = None

    def describe(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        q = (
            f" q(scale={self.quantization.scale:g}, zp={self.quantization.zero_point})"
            if self.quantization
            else ""
        )
        return f"{self.name}: {self.dtype}[{dims}]{q}"

    def accepts(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == len(self.shape) and all(
            e is None or e == g for e, g in zip(self.shape, shape, strict=True)
        )

    @property
    def layout(self) -> str | None:
        """``NCHW`` or ``NHWC`` for a 4-d image tensor whose channel axis is unambiguous."""
        if len(self.shape) != 4:
            return None
        if self.shape[1] in (1, 3) and self.shape[3] not in (1, 3):
            return "NCHW"
        if self.shape[3] in (1, 3) and self.shape[1] not in (1, 3):
            return "NHWC"
        return None


@runtime_checkable
class Backend(Protocol):
    """A runtime edgekit can run models on."""

    name: str
    suffixes: tuple[str, ...]
    options: frozenset[str]

    def available(self, options: Options | None = None) -> Availability:
        """Can this backend run here, with these options (a device, an execution provider)?"""
        ...

    def load(self, artifact: Path, options: Options | None = None) -> Session:
        """Load ``artifact`` and return a ready session; raise :class:`ModelLoadError` if it can't."""
        ...


class Session(ABC):
    """A loaded model on one backend.

    Subclasses fill in ``inputs``/``outputs`` and implement ``_run``; the base class checks
    inputs (count, shape, dtype) before they reach the runtime, so every backend reports a
    mistake the same way, naming the backend, the file and what was expected.
    """

    backend: ClassVar[str]

    def __init__(
        self, artifact: Path, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], device: str
    ) -> None:
        self.artifact = artifact
        self.inputs: tuple[TensorSpec, ...] = tuple(inputs)
        self.outputs: tuple[TensorSpec, ...] = tuple(outputs)
        #: What the runtime really runs on (``CPU``, ``CUDAExecutionProvider``, ``usb:0``, ...).
        self.device = device
        #: The arithmetic the runtime really uses for the float parts of the model, where it
        #: can say (OpenVINO reports its inference precision); ``""`` where it cannot.
        self.compute_precision = ""
        #: Kernels the backend chose beyond its runtime's own choice, one line each
        #: (``layer: kernel (why)``); empty where it left the runtime to choose.
        self.kernels: tuple[str, ...] = ()
        self.closed = False
        #: Set by selection: the candidate this session runs, and those that failed before it.
        self.candidate: str = self.backend
        self.fallbacks: tuple[tuple[str, str], ...] = ()

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """Run the model on one array per input (in ``inputs`` order); returns one array per output."""
        if self.closed:
            raise InputError(f"{self.backend}: session for {self.artifact} is closed", "load the model again")
        self._check(arrays)
        return self._run(arrays)

    def _check(self, arrays: Sequence[np.ndarray]) -> None:
        import numpy as np

        where = f"{self.backend} ({self.artifact.name})"
        if len(arrays) != len(self.inputs):
            raise InputError(
                f"{where}: got {len(arrays)} input(s), the model takes {len(self.inputs)}: "
                + "; ".join(s.describe() for s in self.inputs),
                "pass one array per model input, in order",
            )
        for spec, arr in zip(self.inputs, arrays, strict=True):
            if not isinstance(arr, np.ndarray):
                raise InputError(
                    f"{where}: input '{spec.name}' is a {type(arr).__name__}, expected a numpy array",
                    "convert it with numpy.asarray(...)",
                )
            if arr.dtype != np.dtype(spec.dtype):
                raise InputError(
                    f"{where}: input '{spec.name}' has dtype {arr.dtype}, expected {spec.describe()}",
                    f"convert it with array.astype(numpy.{spec.dtype})"
                    + (
                        " after quantizing with the input's scale and zero point" if spec.quantization else ""
                    ),
                )
            if not spec.accepts(arr.shape):
                raise InputError(
                    f"{where}: input '{spec.name}' has shape {tuple(arr.shape)}, expected {spec.describe()}",
                    "resize or transpose the input to the model's shape (layout "
                    f"{spec.layout or 'as listed'})",
                )

    @abstractmethod
    def _run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]: ...

    @property
    def batchable(self) -> bool:
        """Whether ``batched(n)`` can make a session of this artifact that takes n frames at once."""
        return False  # a backend whose artifacts may have a free batch dimension says when they do

    def batched(self, n: int) -> Session:
        """A new session of the same model, loaded with the same options, whose inputs and outputs have
        first dimension ``n`` (n >= 1).  ModelLoadError (message, hint) when the model's batch is fixed.

        The model is not read from its file again (it was checked against its signed hash when this
        session loaded it); closing the new session leaves this one open.
        """
        where = f"{self.backend} ({self.artifact.name})"
        if not self.batchable:
            batch = self.inputs[0].shape[0] if self.inputs and self.inputs[0].shape else None
            raise ModelLoadError(
                f"{where}: the model's batch is fixed"
                + (f" at {batch}" if batch is not None else "")
                + f", it cannot run {n} frames at once",
                "run one frame at a time, or rebuild the artifact with a free batch dimension "
                "(edgekit build exports dim 0 as 'batch' for ONNX Runtime and OpenVINO)",
            )
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ModelLoadError(f"{where}: batch {n!r} is not a whole number >= 1", "ask for n >= 1 frames")
        if self.closed:
            raise ModelLoadError(f"{where}: session is closed", "batch from an open session")
        session = self._batched(n)
        # What selection recorded about this session holds for the same model at another batch.
        session.candidate = self.candidate
        session.fallbacks = self.fallbacks
        return session

    def _batched(self, n: int) -> Session:
        """The session for ``batched(n)``, once the base class has checked ``n``; batchable backends override it."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the runtime's resources; the session can't run afterwards."""
        self.closed = True

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.artifact.name} on {self.backend}/{self.device}>"


def check_artifact(backend: str, artifact: Path, suffixes: Sequence[str]) -> Path:
    """Refuse a missing file or a file of the wrong kind before the runtime sees it."""
    artifact = Path(artifact)
    if not artifact.is_file():
        raise ModelLoadError(
            f"{backend}: model file {artifact} does not exist",
            "check the path, or build the artifact first (edgekit build)",
        )
    if suffixes and not any(artifact.name.endswith(s) for s in suffixes):
        raise ModelLoadError(
            f"{backend}: {artifact} is not a model this backend reads (expected {', '.join(suffixes)})",
            "pick the backend that matches the file, or convert the model with edgekit build",
        )
    return artifact


def load_failed(backend: str, artifact: Path, err: BaseException, expected: str) -> ModelLoadError:
    """Turn a runtime's own exception into one error that names the backend, the file and what was expected."""
    return ModelLoadError(
        f"{backend} could not load {artifact}: {first_line(err)}",
        f"expected {expected}; the file may be corrupt or truncated: rebuild or re-download it",
    )


def known_options(backend: str, options: Options | None, allowed: frozenset[str]) -> dict[str, Any]:
    """Return the options as a dict, refusing any this backend does not know (typos fail loudly)."""
    opts = dict(options or {})
    unknown = sorted(set(opts) - allowed)
    if unknown:
        from edgekit.errors import BackendError

        raise BackendError(
            f"{backend}: unknown option(s) {', '.join(unknown)}",
            f"known options: {', '.join(sorted(allowed))}",
        )
    return opts
