"""The build's accuracy gate: which artifacts run here, how each is judged against fp32, on which images.

An artifact is gated here only when this host computes it as the device will
(:func:`host_gap` is the rule, shared with the tests); otherwise its record says why and the
device gates it (``edgekit bench``, the health gate).  An artifact whose images take long
here (an untuned TVM library: seconds a frame) is judged on an even sample of the images
that fits ``BuildRequest.gate_budget_s`` (at least ``MIN_SAMPLE``), and the record says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from edgekit.convert.accuracy import compare, run_batch, run_outputs
from edgekit.convert.latency import measure
from edgekit.core.cpu import CpuFeatures, this_cpu
from edgekit.core.elf import host_arch
from edgekit.device.profiles import pin_precision
from edgekit.errors import BuildError, EdgekitError
from edgekit.processing.tensors import from_output, to_input

if TYPE_CHECKING:
    import numpy as np

    from edgekit.backends.base import Session
    from edgekit.bundle.manifest import DetectionHead
    from edgekit.convert.accuracy import GateAccuracy
    from edgekit.convert.build_records import ArtifactReport, BuildRequest
    from edgekit.convert.images import ImageSet

# (session, its outputs on the chosen images stacked per output, the chosen images' indices) -> result
Judge = Callable[["Session", "list[np.ndarray]", "list[int]"], "GateAccuracy"]
Tick = Callable[[int, int], None]  # (images done, images to do)

#: A slow artifact is still judged on at least this many images (evenly spread over the set).
MIN_SAMPLE = 8


class Gated(Protocol):
    """What :func:`host_gap` reads of an artifact: a build's ``Artifact`` or a manifest's entry."""

    @property
    def backend(self) -> str: ...
    @property
    def precision(self) -> str: ...
    @property
    def variant(self) -> str: ...
    @property
    def arch(self) -> str: ...
    @property
    def requires(self) -> tuple[str, ...]: ...


def lacking(a: Gated, cpu: CpuFeatures) -> list[str]:
    """The CPU capabilities ``a`` computes with that ``cpu`` does not have.

    An OpenVINO bf16/fp16 IR needs its precision even where the profile did not say so: on a
    CPU without it, the plugin would quietly compute in f32 and the gate would judge that.
    """
    need = [c for c in a.requires if not cpu.has(c)]
    half = a.backend == "openvino" and a.precision in ("bf16", "fp16")
    if half and a.precision not in need and not cpu.has(a.precision):
        need.append(a.precision)
    return need


def saturates(a: Gated, cpu: CpuFeatures) -> bool:
    """A full-range int8 artifact on an x86 CPU without int8-dot: its int16 pair sums saturate."""
    return a.variant == "full" and cpu.arch == "x86_64" and not cpu.has("int8-dot")


def host_gap(a: Gated, cpu: CpuFeatures | None = None, arch: str | None = None) -> str | None:
    """Why the gate cannot run ``a`` here as the device will (None: it can).

    ONNX Runtime's full-range int8 on a saturating CPU is no gap, though it lacks int8-dot: it
    is gated as the unfused QDQ graph, which computes what a CPU with int8-dot does.
    """
    cpu, arch = cpu or this_cpu(), arch or host_arch()
    if a.arch not in ("any", arch):
        return f"built for {a.arch}, this host is {arch}"
    if saturates(a, cpu) and a.backend == "onnxruntime":
        return None
    need = lacking(a, cpu)
    if not need and not saturates(a, cpu):
        return None
    listed = ", ".join(f"{c} ({cpu.why(c)})" for c in (need or ["int8-dot"]))
    return f"this host lacks {listed}: gate it on the device (edgekit bench)"


def sample(first_s: float, n: int, budget_s: float) -> list[int]:
    """The images (indices of ``n``) to judge an artifact on, its first having taken ``first_s``.

    All of them when they fit ``budget_s``; else as many as fit, at least ``MIN_SAMPLE``,
    evenly spread (the smoke set keeps a photograph's crops and mirrors together).
    """
    if n <= MIN_SAMPLE or first_s * n <= budget_s:
        return list(range(n))
    k = max(MIN_SAMPLE, int(budget_s / first_s) if first_s > 0 else n)
    if k >= n:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def evaluate(
    req: BuildRequest, report: ArtifactReport, eval_batch: np.ndarray, judge: Judge, tick: Tick
) -> None:
    """Gate ``report``'s artifact here and time it, or record why it is not."""
    from edgekit.backends import registry

    a = report.artifact
    assert a is not None
    cpu = this_cpu()
    gap = host_gap(a, cpu)
    if gap is not None and a.arch not in ("any", host_arch()):
        report.not_measured = gap
        return
    backend = registry.get(a.backend)
    # Load it computing in the precision it is named for, as a device does (pinned, never the default).
    options: dict[str, Any] = pin_precision(a.backend, a.precision, {})
    avail = backend.available(options)
    if not avail.ok:
        report.not_measured = f"{a.backend} cannot run here: {avail.reason}"
        return
    if gap is not None:
        report.not_measured = gap
        return
    if saturates(a, cpu):  # ONNX Runtime's (host_gap let no other through)
        # The QDQ graph run unfused computes in float what a CPU with int8-dot computes in int32:
        # the numbers the device will see, which this host's saturating kernels cannot give.
        options["optimization"] = "disable"
        report.evaluated_as = (
            "the QDQ graph unfused (this host's int8 kernels saturate on full-range weights)"
        )
        report.artifact = a = replace(a, notes={**a.notes, "gate_ran": report.evaluated_as})
    path = a.path
    if a.kind == "tflite-edgetpu":  # compiled for the TPU: check its CPU source model instead
        src = a.notes.get("source_model")
        if not src:
            report.not_measured = "an Edge TPU model runs only on an Edge TPU"
            return
        path = a.path.with_name(str(src))
    try:
        with backend.load(path, options) as session:
            outputs, chosen, first_s = _run(session, eval_batch, req.gate_budget_s, tick)
            report.accuracy = judge(session, outputs, chosen)
            if len(chosen) < len(eval_batch):
                report.gate_sample = (
                    f"judged on {len(chosen)} of {len(eval_batch)} images: one took {first_s * 1e3:.0f} ms "
                    f"here, all would take over the {req.gate_budget_s:g} s a gate is given"
                )
                report.artifact = replace(a, notes={**a.notes, "gate_sample": report.gate_sample})
            # An unfused stand-in's speed says nothing of the device's.
            if req.measure_latency and not report.evaluated_as:
                slow = len(chosen) < len(eval_batch)
                report.latency = (
                    measure(session, eval_batch, runs=3, warmup=1) if slow else measure(session, eval_batch)
                )
    except EdgekitError as err:
        raise BuildError(
            f"the {report.recipe} artifact {path.name} was built but does not run: {err.message}",
            "this is a converter problem: report it with the model and the build log",
        ) from err


def _run(
    session: Session, batch: np.ndarray, budget_s: float, tick: Tick
) -> tuple[list[np.ndarray], list[int], float]:
    """Every output of ``session`` on the images it is judged on (one at a time: batch-1 models).

    The first image is timed to choose them (:func:`sample`); returns the outputs stacked per
    output, the images' indices and the first image's seconds.
    """
    import numpy as np

    spec = session.inputs[0]

    def one(i: int) -> list[np.ndarray]:
        ys = session.run(to_input(batch[i : i + 1], spec))
        return [from_output(y, o) for y, o in zip(ys, session.outputs, strict=True)]

    t0 = time.perf_counter()
    per_image = [one(0)]
    first_s = time.perf_counter() - t0
    chosen = sample(first_s, len(batch), budget_s)
    tick(1, len(chosen))
    for done, i in enumerate(chosen[1:], start=2):
        per_image.append(one(i))
        tick(done, len(chosen))
    outputs = [np.concatenate([ys[k] for ys in per_image]) for k in range(len(session.outputs))]
    return outputs, chosen, first_s


def classifier_judge(
    req: BuildRequest, ref_session: Session, evals: ImageSet, eval_batch: np.ndarray
) -> Judge:
    """The top-1 gate against the fp32 ONNX's logits (``ref_session``) on ``evals``."""
    reference = run_batch(ref_session, eval_batch)

    def judge(session: Session, outputs: list[np.ndarray], chosen: list[int]) -> GateAccuracy:
        logits = outputs[0].reshape(len(chosen), -1)
        names = [evals.names[i] for i in chosen]
        return compare(logits, reference[chosen], names, evals.smoke, req.threshold)

    return judge


def detection_judge(
    req: BuildRequest, head: DetectionHead, ref_session: Session, evals: ImageSet, eval_batch: np.ndarray
) -> Judge:
    """The detection gate against the fp32 ONNX's detections (``ref_session``) on ``evals``."""
    from edgekit.convert.accuracy_detection import DetectionReference, align_outputs

    ref_specs = ref_session.outputs
    ref_outputs = run_outputs(ref_session, eval_batch)
    sizes = [(int(img.shape[0]), int(img.shape[1])) for img in evals.images]
    names = [o.name for o in ref_specs]
    spec, labels = req.card.preprocess, req.card.labels
    full = DetectionReference(head, spec, labels, ref_outputs, names, sizes)

    def judge(session: Session, outputs: list[np.ndarray], chosen: list[int]) -> GateAccuracy:
        try:
            order = align_outputs(ref_specs, session.outputs)
        except ValueError as err:
            raise BuildError(
                f"{session.artifact.name}: {err}",
                "this is a converter problem: report it with the model and the build log",
            ) from err
        reference = full
        if len(chosen) < len(sizes):  # a sample: the reference on the same images
            picked = [o[chosen] for o in ref_outputs]
            reference = DetectionReference(head, spec, labels, picked, names, [sizes[i] for i in chosen])
        return reference.compare(
            [outputs[k] for k in order], [evals.names[i] for i in chosen], evals.smoke, req.threshold
        )

    return judge


def failure_row(recipe: str, acc: GateAccuracy, threshold: float) -> str:
    """One line of the failed-gate error: the numbers and the images they come from."""
    det = acc.detection
    if acc.map_gate is not None:
        return acc.map_gate.failure_row(recipe)
    if det is None:
        return (
            f"  {recipe:18} top-1 agreement {acc.top1_agreement:.1%} < {threshold:.0%}"
            f" (flipped: {', '.join(acc.flipped) or '-'}; max logit diff {acc.max_abs_logit_diff:.3f})"
        )
    return (
        f"  {recipe:18} matched {det.matched} of {det.decisive} decisive fp32 detections "
        f"({acc.top1_agreement:.1%}, needs {threshold:.0%}), missed {det.missed}, extra {det.extra} (needs 0)"
        f"; mean IoU {det.mean_iou:.3f}, max score drift {det.max_score_drift:.3f}"
        f" (images: {', '.join(acc.flipped) or '-'})"
    )
