"""What the server serves: the bundle's model twice, as raw tensors and as images.

- ``<name>`` (the bundle's model name, its version): the loaded artifact's own inputs and
  outputs, names, shapes (-1 for a free dimension) and datatypes as the runtime reports them.
  The tensors go to ``model.session.run`` as they are: the client does the preprocessing.
- ``<name>-image``: one input ``IMAGE``, either ``BYTES`` ``[1]`` (a JPEG or PNG file) or
  ``UINT8`` ``[H, W, 3]`` (or ``[1, H, W, 3]``), BGR, in any size.  It goes through the bundle's
  own preprocessing and decoding, as ``edgekit.load(bundle).classify`` / ``.detect`` do, and
  comes back as a classifier's labels (``LABEL_IDS`` INT64 ``[k]``, ``LABEL_NAMES`` BYTES
  ``[k]``, ``SCORES`` FP32 ``[k]``, best first; request parameter ``top_k``, default 5) or a
  detector's objects (``BOXES`` FP32 ``[N, 4]`` x0, y0, x1, y1 in the frame's pixels,
  ``SCORES`` FP32 ``[N]``, ``CLASS_IDS`` INT64 ``[N]``, ``CLASS_NAMES`` BYTES ``[N]``).

A second model name rather than a request parameter: a client's model metadata then tells
the truth about each kind of request, and tritonclient's generated calls need nothing extra.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgekit.serve.datatypes import oip_datatype
from edgekit.serve.images import check_pixels, decode
from edgekit.serve.limits import Limits
from edgekit.serve.outcomes import ProtocolError
from edgekit.serve.timing import Timing

if TYPE_CHECKING:
    import numpy as np

    from edgekit.model import Model

IMAGE_SUFFIX = "-image"
IMAGE_INPUT = "IMAGE"
#: The queue's lane of camera frames that share the model (``edgekit.serve.frames``).
FRAMES = "frames"


@dataclass(frozen=True)
class TensorMeta:
    """A tensor as model metadata describes it: name, OIP datatype, shape (-1: any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class Tensor:
    """One output: its name, OIP datatype and data."""

    name: str
    datatype: str
    data: np.ndarray


@dataclass
class InferRequest:
    """One inference, decoded from either protocol; what the queue takes (``InferenceQueue.submit``)."""

    endpoint: Endpoint
    inputs: dict[str, np.ndarray]
    #: The outputs asked for, by name; None: all of them.
    outputs: tuple[str, ...] | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    id: str = ""
    #: ``time.monotonic()`` after which the request is answered with an error, not computed.
    deadline: float = float("inf")
    #: Its times for its trace; None when the server traces nothing.
    timing: Timing | None = None
    #: Made ready for the session on the thread that received it (``Service.infer``), so the
    #: inference worker only infers; None: the worker prepares it.
    prepared: Prepared | None = None


@dataclass
class Prepared:
    """A request made ready for the session: its arrays (one per model input, first dimension one
    row each) and what ``finish`` needs back (the decoded frame's size)."""

    arrays: list[np.ndarray]
    stages: dict[str, float] = field(default_factory=dict)
    context: Any = None


@dataclass
class InferResult:
    outputs: list[Tensor]
    #: Seconds spent in each stage (``decode``, ``preprocess``, ``infer``, ``postprocess``).
    stages: dict[str, float] = field(default_factory=dict)
    #: Rows of the inference that answered it (1: alone).
    batch: int = 1


class Endpoint:
    """A served model name: its metadata, the checks of its inputs, and how it runs on the model."""

    #: False: not a model name clients call (a camera frame's), not in the request metrics.
    served = True
    #: The queue's bound it counts against (``BatchQueue`` lanes); None: the requests'.
    lane: str | None = None
    #: False: computed even past its deadline (a camera frame: late, counted as a miss).
    expires = True

    def __init__(
        self,
        model: Model,
        limits: Limits,
        name: str,
        inputs: tuple[TensorMeta, ...],
        outputs: tuple[TensorMeta, ...],
    ) -> None:
        self.model = model
        self.limits = limits
        self.name = name
        self.version = model.manifest.model.version
        self.inputs = inputs
        self.outputs = outputs

    @property
    def platform(self) -> str:
        return f"edgekit_{self.model.backend}"

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": self.platform,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
        }

    def check(self, request: InferRequest) -> None:
        """Refuse a request this endpoint cannot answer (ProtocolError), before it is queued."""
        known = {t.name for t in self.inputs}
        for name in request.inputs:
            if name not in known:
                raise ProtocolError(
                    f"{self.name} has no input '{name}': its inputs are {', '.join(sorted(known))}"
                )
        missing = known - set(request.inputs)
        if missing:
            raise ProtocolError(f"{self.name}: input(s) {', '.join(sorted(missing))} missing")
        if request.outputs is not None:
            names = {t.name for t in self.outputs}
            for name in request.outputs:
                if name not in names:
                    raise ProtocolError(
                        f"{self.name} has no output '{name}': its outputs are {', '.join(sorted(names))}"
                    )
        self._check(request)

    def _check(self, request: InferRequest) -> None:
        raise NotImplementedError

    def batch_key(self, request: InferRequest) -> Hashable | None:
        """Requests with equal keys can be inferred as one batch (same inputs' shapes); None: alone."""
        return None

    def prepare(self, request: InferRequest) -> Prepared:
        raise NotImplementedError

    def finish(self, request: InferRequest, prepared: Prepared, raw: list[np.ndarray]) -> InferResult:
        """The request's answer from the session's outputs for its rows."""
        raise NotImplementedError

    def ready(self, request: InferRequest) -> Prepared:
        """``request`` prepared, kept on it, its arrays its own: made once, by the first to ask.

        ``Service.infer`` asks on the thread that received it; the worker for a request queued
        unprepared.  A preprocessor returns its thread's one buffer, reused for the next
        picture, so the arrays are copied here, once, for the queued request to keep.
        """
        if request.prepared is None:
            import numpy as np

            prepared = self.prepare(request)
            prepared.arrays = [np.array(x) for x in prepared.arrays]
            request.prepared = prepared
        return request.prepared

    def run(self, request: InferRequest) -> InferResult:
        """``request`` alone on the model's session."""
        prepared = self.ready(request)
        t = time.perf_counter()
        raw = self.model.session.run(*prepared.arrays)
        prepared.stages["infer"] = _lap(t)
        return self.finish(request, prepared, raw)

    def _select(self, outputs: list[Tensor], wanted: tuple[str, ...] | None) -> list[Tensor]:
        if wanted is None:
            return outputs
        by_name = {t.name: t for t in outputs}
        return [by_name[n] for n in wanted]


def _meta_of(specs: Any) -> tuple[TensorMeta, ...]:
    return tuple(
        TensorMeta(s.name, oip_datatype(s.dtype), tuple(-1 if d is None else d for d in s.shape))
        for s in specs
    )


class RawEndpoint(Endpoint):
    """The artifact's own tensors in and out (``<name>``)."""

    def __init__(self, model: Model, limits: Limits) -> None:
        session = model.session
        super().__init__(model, limits, model.name, _meta_of(session.inputs), _meta_of(session.outputs))

    def _check(self, request: InferRequest) -> None:
        for meta in self.inputs:
            array = request.inputs[meta.name]
            got = oip_datatype(array.dtype)
            if got != meta.datatype:
                raise ProtocolError(f"input '{meta.name}': datatype {got}, the model takes {meta.datatype}")
            ok = len(array.shape) == len(meta.shape) and all(
                e in (-1, g) for e, g in zip(meta.shape, array.shape, strict=True)
            )
            if not ok:
                raise ProtocolError(
                    f"input '{meta.name}': shape {list(array.shape)}, the model takes {list(meta.shape)} "
                    "(-1: any size)"
                )

    def batch_key(self, request: InferRequest) -> Hashable | None:
        arrays = [request.inputs[m.name] for m in self.inputs]
        if not all(a.ndim >= 1 and a.shape[0] == 1 for a in arrays):
            return None  # a request that is itself a batch runs as it came
        return (self.name, *((a.shape, a.dtype.str) for a in arrays))

    def prepare(self, request: InferRequest) -> Prepared:
        return Prepared([request.inputs[m.name] for m in self.inputs])

    def finish(self, request: InferRequest, prepared: Prepared, raw: list[np.ndarray]) -> InferResult:
        outputs = [Tensor(m.name, m.datatype, y) for m, y in zip(self.outputs, raw, strict=True)]
        return InferResult(self._select(outputs, request.outputs), prepared.stages)


_CLASSIFIER_OUT = (
    TensorMeta("LABEL_IDS", "INT64", (-1,)),
    TensorMeta("LABEL_NAMES", "BYTES", (-1,)),
    TensorMeta("SCORES", "FP32", (-1,)),
)
_DETECTOR_OUT = (
    TensorMeta("BOXES", "FP32", (-1, 4)),
    TensorMeta("SCORES", "FP32", (-1,)),
    TensorMeta("CLASS_IDS", "INT64", (-1,)),
    TensorMeta("CLASS_NAMES", "BYTES", (-1,)),
)


class ImageEndpoint(Endpoint):
    """A picture in, labels or objects out (``<name>-image``), through the bundle's own pre/postprocessing."""

    def __init__(self, model: Model, limits: Limits) -> None:
        outputs = _DETECTOR_OUT if model.detector is not None else _CLASSIFIER_OUT
        image = (TensorMeta(IMAGE_INPUT, "BYTES", (1,)),)
        super().__init__(model, limits, model.name + IMAGE_SUFFIX, image, outputs)

    def _check(self, request: InferRequest) -> None:
        array = request.inputs[IMAGE_INPUT]
        if array.dtype == object:
            if array.size != 1 or not isinstance(array.reshape(-1)[0], bytes):
                raise ProtocolError(
                    f"input 'IMAGE': one JPEG or PNG file, shape [1]; got {list(array.shape)}"
                )
        elif array.dtype.name == "uint8":
            shape = array.shape[1:] if array.ndim == 4 and array.shape[0] == 1 else array.shape
            if len(shape) != 3 or shape[2] != 3:
                raise ProtocolError(
                    f"input 'IMAGE': a UINT8 tensor must be [H, W, 3] (BGR), got {list(array.shape)}"
                )
            check_pixels(shape[1], shape[0], self.limits.max_image_pixels)
        else:
            raise ProtocolError(
                f"input 'IMAGE': datatype {oip_datatype(array.dtype)}; send BYTES (a JPEG or PNG file) "
                "or UINT8 [H, W, 3] (BGR)"
            )
        k, most = request.parameters.get("top_k", 5), self.limits.max_top_k
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= most:
            raise ProtocolError(f"parameter top_k must be an integer from 1 to {most}, got {k!r}")

    def batch_key(self, request: InferRequest) -> Hashable | None:
        return self.name  # every picture is preprocessed to the model's one input shape

    def prepare(self, request: InferRequest) -> Prepared:
        import numpy as np

        from edgekit.processing.preprocessing import as_bgr

        model, stages = self.model, {}
        t = time.perf_counter()
        array = request.inputs[IMAGE_INPUT]
        if array.dtype == object:
            frame = decode(array.reshape(-1)[0], self.limits.max_image_pixels)
        else:
            frame = array[0] if array.ndim == 4 else array
        image, _ = as_bgr(np.ascontiguousarray(frame))
        stages["decode"] = _lap(t)
        t = time.perf_counter()
        x = model.preprocessor()(image)
        stages["preprocess"] = _lap(t)
        return Prepared([x], stages, image.shape[:2])

    def finish(self, request: InferRequest, prepared: Prepared, raw: list[np.ndarray]) -> InferResult:
        import numpy as np

        model, stages = self.model, prepared.stages
        t = time.perf_counter()
        if model.detector is not None:
            found = model.objects(raw, prepared.context)
            outputs = [
                Tensor("BOXES", "FP32", np.array([d.box for d in found], np.float32).reshape(-1, 4)),
                Tensor("SCORES", "FP32", np.array([d.score for d in found], np.float32)),
                Tensor("CLASS_IDS", "INT64", np.array([d.class_id for d in found], np.int64)),
                Tensor("CLASS_NAMES", "BYTES", _names([d.name for d in found])),
            ]
        else:
            labels = model.top_labels(raw, int(request.parameters.get("top_k", 5)))
            outputs = [
                Tensor("LABEL_IDS", "INT64", np.array([lb.id for lb in labels], np.int64)),
                Tensor("LABEL_NAMES", "BYTES", _names([lb.name for lb in labels])),
                Tensor("SCORES", "FP32", np.array([lb.score for lb in labels], np.float32)),
            ]
        stages["postprocess"] = _lap(t)
        return InferResult(self._select(outputs, request.outputs), stages)


def _names(names: list[str]) -> np.ndarray:
    import numpy as np

    out = np.empty(len(names), dtype=object)
    out[:] = [n.encode() for n in names]
    return out


def _lap(t: float) -> float:
    return time.perf_counter() - t


def endpoints_of(model: Model, limits: Limits) -> dict[str, Endpoint]:
    """Each served name -> its endpoint."""
    served: list[Endpoint] = [RawEndpoint(model, limits), ImageEndpoint(model, limits)]
    return {e.name: e for e in served}
