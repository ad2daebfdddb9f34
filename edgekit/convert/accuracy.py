"""The accuracy gate: does a derived artifact still give the fp32 model's answers?

For every evaluation image we compare the artifact's top-1 with the fp32 reference's.
An image on which the reference itself is undecided (its two best classes within
``TIE_MARGIN`` = 10 points of softmax probability) has no single right answer — chelsea,
the smoke set's cat, is 0.08 between "Egyptian cat" and "tiger cat" — so a flip there is
counted and reported but does not fail the gate; on every other image the top-1 must
agree (the one rule, ``edgekit.core.stats.agreement``: if no image were decisive, every
image would count).  Measured on the smoke set: every int8 flip (ORT, OpenVINO, LiteRT) is on an image
with a margin under 0.10, and 18 of its 36 images are decisive.  The threshold defaults to 98% — MLPerf's rule for quantized models (99% of fp32
accuracy for its classification tasks is stricter on labelled data; on an unlabelled
smoke set agreement is what we can measure).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from edgekit.backends.base import Session
from edgekit.core.stats import agreement
from edgekit.processing.tensors import from_output, to_input

if TYPE_CHECKING:
    import numpy as np

    from edgekit.convert.map_gate import MapGateResult
    from edgekit.detection.agreement import DetectionAgreement

DEFAULT_THRESHOLD = 0.98


@dataclass(frozen=True)
class GateAccuracy:
    """How an artifact's answers compare with the fp32 reference on the evaluation images."""

    top1_agreement: float  # on decisive images (on every image if none is decisive)
    top1_agreement_all: float  # on every image, near-ties included
    decisive_images: int
    eval_images: int
    max_abs_logit_diff: float
    flipped: tuple[str, ...]  # images whose top-1 changed (near-ties marked "~")
    smoke_set: bool
    threshold: float
    passed: bool
    #: A detector's gate (``edgekit.convert.accuracy_detection``): then ``top1_agreement`` is the
    #: share of decisive reference detections matched, ``decisive_images`` the images holding
    #: one, ``flipped`` the images with a miss or an extra, ``max_abs_logit_diff`` over every raw output.
    detection: DetectionAgreement | None = None
    #: With labelled images (``--eval-coco``): the mAP50 gate that decided ``passed`` (``coco_gate``).
    map_gate: MapGateResult | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {**asdict(self), "flipped": list(self.flipped)}
        if self.map_gate is None:
            del d["map_gate"]
        else:
            d["map_gate"] = self.map_gate.to_dict()
        if self.detection is None:
            del d["detection"]  # a classifier's report reads as it did before detection existed
        else:
            d["detection"] = self.detection.to_dict()
        return d


def run_batch(session: Session, batch_nchw: np.ndarray) -> np.ndarray:
    """Run every image of a float32 NCHW batch through ``session`` (one at a time: batch 1 models).

    A classifier's answer: its first output, one row per image (N x classes).
    """
    import numpy as np

    spec, out_spec = session.inputs[0], session.outputs[0]
    rows = [
        from_output(session.run(to_input(batch_nchw[i : i + 1], spec))[0], out_spec).reshape(-1)
        for i in range(len(batch_nchw))
    ]
    return np.stack(rows)


def run_outputs(session: Session, batch_nchw: np.ndarray) -> list[np.ndarray]:
    """Every output of ``session`` on each image of the batch: one float32 array per output.

    Output ``k`` is ``(N, *shape_k[1:])``, the per-image results of batch-1 runs stacked, in
    the session's output order (a detector's boxes and scores both matter, not just the first).
    """
    import numpy as np

    spec = session.inputs[0]
    per_image = [session.run(to_input(batch_nchw[i : i + 1], spec)) for i in range(len(batch_nchw))]
    return [
        np.concatenate([from_output(ys[k], out_spec) for ys in per_image])
        for k, out_spec in enumerate(session.outputs)
    ]


def _softmax(z: np.ndarray) -> np.ndarray:
    import numpy as np

    e = np.exp(z - z.max(axis=1, keepdims=True))
    out: np.ndarray = e / e.sum(axis=1, keepdims=True)
    return out


def compare(
    logits: np.ndarray,
    reference: np.ndarray,
    names: Sequence[str],
    smoke_set: bool,
    threshold: float = DEFAULT_THRESHOLD,
) -> GateAccuracy:
    """Compare ``logits`` with the fp32 ``reference`` (both N x classes)."""
    import numpy as np

    probs = np.sort(_softmax(reference.astype(np.float64)), axis=1)
    agreed = agreement(
        logits.argmax(axis=1).tolist(),
        reference.argmax(axis=1).tolist(),
        (probs[:, -1] - probs[:, -2]).tolist(),
    )
    rate = agreed.rate if agreed.rate is not None else 1.0  # no images: nothing disagrees
    return GateAccuracy(
        top1_agreement=rate,
        top1_agreement_all=agreed.all_rate if agreed.all_rate is not None else 1.0,
        decisive_images=agreed.decisive,
        eval_images=len(names),
        max_abs_logit_diff=float(np.abs(logits - reference).max()),
        flipped=agreed.flipped_names(names),
        smoke_set=smoke_set,
        threshold=threshold,
        passed=rate >= threshold,
    )
