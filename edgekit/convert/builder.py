"""``edgekit build``: a model and a device profile in, a checked and signed bundle out.

The steps, each cached by the hash of what decides it:

1. the clean fp32 ONNX (exported from the model card's PyTorch weights, or the user's file:
   ``--onnx``, or a card whose ``[source] kind = "file"`` names one);
2. one artifact per recipe the device profile's candidates need (ONNX int8, OpenVINO IR,
   LiteRT, TVM, TensorRT config: :mod:`edgekit.convert.recipes`);
3. every artifact that can run here is evaluated against the fp32 reference (the accuracy
   gate) and timed;
4. the bundle is written (and signed) only when every artifact passed the gate, or the
   user allowed the drop — so a failed build leaves nothing that looks like a bundle.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from edgekit.convert.accuracy import run_batch, run_outputs
from edgekit.convert.accuracy_detection import detection_head
from edgekit.convert.artifact import Artifact
from edgekit.convert.build_cache import step_key
from edgekit.convert.build_records import ArtifactReport, BuildRequest, BuildResult
from edgekit.convert.build_steps import BuildSteps, Progress, no_progress
from edgekit.convert.bundling import write
from edgekit.convert.gate import Judge, classifier_judge, detection_judge, evaluate, failure_row
from edgekit.convert.images import ImageSet
from edgekit.convert.latency import measure
from edgekit.convert.recipes import (
    litert_artifacts,
    litert_left_out,
    plan_recipes,
    recipe_artifacts,
    recipe_of,
    untuned_tvm,
)
from edgekit.core.io import sha256_file
from edgekit.errors import BuildError, EdgekitError

if TYPE_CHECKING:
    import numpy as np

    from edgekit.backends.base import Session
    from edgekit.bundle.manifest import DetectionHead
    from edgekit.convert.modelcard import ModelCard

log = logging.getLogger(__name__)


def build(req: BuildRequest, progress: Progress = no_progress) -> BuildResult:
    """Run a build; returns what it made.  Raises :class:`BuildError` and leaves no bundle on failure."""
    if req.sign_key is not None:
        from edgekit.bundle.keys import load_private_key

        # Before any step: a missing, unreadable or public key would otherwise fail only at the
        # very end, when the bundle is signed, after minutes of converting.
        load_private_key(req.sign_key)
    b = BuildSteps(req, progress)
    try:
        return _build(b)
    finally:
        shutil.rmtree(b.stage, ignore_errors=True)


def _use_card_file(b: BuildSteps) -> None:
    """A card whose source is a model file builds as ``--onnx``/``--tflite`` would, with the card's
    task, head, labels and preprocessing.

    The file (and an ONNX's external-data files) is copied into the build's stage and the copy
    checked against the card's pinned SHA-256, so what is built is what was checked.  A request that already names a file or a
    module (``--onnx``/``--tflite`` make a card of their own) is left as it is.
    """
    from edgekit.convert.modelcard import check_pinned, model_files, source_file, with_file_input

    req = b.req
    if req.onnx is not None or req.tflite is not None or req.pytorch_module is not None:
        return
    src = source_file(req.card)
    if src is None:
        return
    # A folder of its own: the .tflite route writes <name>.tflite into the stage itself.
    folder = b.stage / "source"
    for rel in model_files(src):  # an ONNX's external weights travel with it
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(src.parent / rel, folder / rel)
        except OSError as err:
            raise BuildError(
                f"{req.card.path}: {src.parent / rel} cannot be read ({err.strerror})",
                "an ONNX model's external data files must be beside it, as it was saved",
            ) from err
    copy = folder / src.name
    check_pinned(req.card, copy)
    card = with_file_input(req.card, copy)
    onnx, tflite = (copy, None) if copy.suffix == ".onnx" else (None, copy)
    b.req = replace(req, card=card, onnx=onnx, tflite=tflite)


def _build_tflite(b: BuildSteps) -> BuildResult:
    """A user's .tflite goes into the bundle as it is: checked to load and run, and timed.

    A detector's .tflite (a card with a ``[detection]`` head; Coral's models end in
    ``TFLite_Detection_PostProcess``) is its own reference: its head must decode what it gives
    on the evaluation images, and the bundle's eval frames carry its detections.
    """
    from edgekit.backends import open_session

    req = b.req
    assert req.tflite is not None
    if req.coco is not None:
        raise BuildError(
            "--eval-coco gates artifacts against the fp32 ONNX, and a .tflite is bundled as its own reference",
            "leave --eval-coco out, and measure the bundle with edgekit eval BUNDLE --coco ... instead",
        )
    src_hash = sha256_file(req.tflite)
    dest = b.stage / f"{b.stem}{req.tflite.suffix}"
    shutil.copyfile(req.tflite, dest)
    _, evals = b.images()
    batch = evals.batch(req.card.preprocess)
    with open_session(dest, "litert") as s:
        dtype = s.inputs[0].dtype
        precision = "fp32" if dtype == "float32" else "fp16" if dtype == "float16" else "int8"
        run_batch(s, batch[:2])  # it must run on the preprocessing it was given
        head = detection_head(req.card)
        if head is not None:
            _check_head_fits(s, head, req.card, evals, batch)
        latency = measure(s, batch) if req.measure_latency else None
    recipe = f"litert-{precision}"
    if req.backends and "litert" not in req.backends:
        raise BuildError(
            "a .tflite model builds only the litert artifact",
            "drop --backends, or build from ONNX for other backends",
        )
    report = ArtifactReport(
        recipe,
        Artifact(dest, "litert", precision, kind="tflite", notes={"source": req.tflite.name}),
        latency=latency,
        not_measured="the given .tflite is its own reference",
    )
    others = [
        ArtifactReport(r, None, skipped="no converter starts from .tflite: build from ONNX or a model card")
        for r in plan_recipes(b.profile)
        if not r.startswith("litert-")
    ]
    with b.timed("bundle"):
        bundle = write(req, b.profile, dest, src_hash, [report], evals)
    return BuildResult(bundle, b.profile.name, [report, *others], [], evals.smoke, len(evals.names), b.stages)


def _left_out_by_card(b: BuildSteps, recipes: Sequence[str]) -> list[ArtifactReport]:
    """A report for each artifact a default build leaves out because the card's ``precisions`` do."""
    req = b.req
    if req.precisions or not req.card.precisions:
        return []
    precision = {recipe_of(c): c.precision for c in b.profile.candidates}
    # Short: it is a cell of the build's table.  The card says why (its comment, in numbers).
    return [
        ArtifactReport(
            r,
            None,
            skipped=f"the card's precisions leave {precision[r]} out; add it to --precisions to build it",
        )
        for r in plan_recipes(b.profile, req.backends)
        if r not in recipes
    ]


def _check_head_fits(
    session: Session, head: DetectionHead, card: ModelCard, evals: ImageSet, batch: np.ndarray
) -> None:
    """The card's detection head decodes what the model gives (its outputs, their shapes), or a BuildError.

    Without a converted artifact there is no gate to catch a head that does not fit the model
    (wrong decoder, class count or layout); the device would find it at load.  Found here.
    """
    from edgekit.detection.detector import Detector

    detector = Detector(head, card.preprocess, card.labels)
    names = [o.name for o in session.outputs]
    outputs = run_outputs(session, batch[:1])
    try:
        detector(outputs, (int(evals.images[0].shape[0]), int(evals.images[0].shape[1])), names)
    except EdgekitError as err:
        raise BuildError(
            f"the card's [detection] head does not fit {session.artifact.name}: {err.message}",
            err.hint or "fix the card's [detection] table (decoder, num_classes, outputs)",
        ) from err


def _build(b: BuildSteps) -> BuildResult:
    _use_card_file(b)
    req = b.req
    if req.tflite is not None:
        return _build_tflite(b)
    if req.coco is not None and detection_head(req.card) is None:
        raise BuildError(
            f"--eval-coco measures a detector's mAP, and {req.card.name} is a classifier",
            "leave --eval-coco out: a classifier's gate is top-1 agreement with fp32 (--eval DIR)",
        )
    recipes = plan_recipes(b.profile, req.backends, req.precisions or req.card.precisions)
    left_out = _left_out_by_card(b, recipes)
    fp32 = b.fp32_onnx()
    fp32_hash = sha256_file(fp32)
    calib_set, evals = b.images()
    spec = req.card.preprocess
    calib = calib_set.batch(spec)
    calib_hash = step_key("images", [], {"names": list(calib_set.names), "sum": float(calib.sum())})
    eval_batch = calib if evals is calib_set else evals.batch(spec)

    reports: dict[str, ArtifactReport] = {}
    litert_recipes = [r for r in recipes if r.startswith("litert-")]
    if litert_recipes:
        if why := litert_left_out(b):
            for r in litert_recipes:
                reports[r] = ArtifactReport(r, None, skipped=why)
                b.progress(f"compile {r}", f"skipped: {why}")
        else:
            for r, a in litert_artifacts(b, litert_recipes, fp32, calib, calib_hash).items():
                reports[r] = ArtifactReport(r, a)
    for r in recipes:
        if r not in reports and (why := untuned_tvm(b, r, fp32_hash)):
            reports[r] = ArtifactReport(r, None, skipped=why)
            b.progress(f"compile {r}", f"skipped: {why}")
        elif r not in reports:
            reports[r] = ArtifactReport(r, recipe_artifacts(b, r, fp32, fp32_hash, calib, calib_hash)[0])
    if all(rep.artifact is None for rep in reports.values()):
        raise BuildError(
            "no artifact to bundle: " + "; ".join(f"{r}: {rep.skipped}" for r, rep in reports.items()),
            "build other backends too (leave out --backends), or follow the hint of the one left out",
        )
    for r, rep in reports.items():
        # What the profile's candidates for this recipe need of a CPU travels with the artifact.
        needs = tuple(dict.fromkeys(x for c in b.profile.candidates if recipe_of(c) == r for x in c.requires))
        if rep.artifact is not None and needs:
            rep.artifact = replace(rep.artifact, requires=needs)

    from edgekit.backends import open_session

    head = detection_head(req.card)
    judge: Judge
    shipped = None  # the frames the bundle ships, made before the gate when it is labelled
    with b.timed("reference", "fp32-onnx"), open_session(fp32, "onnxruntime") as ref_session:
        if head is None:
            judge = classifier_judge(req, ref_session, evals, eval_batch)
        else:
            judge = detection_judge(req, head, ref_session, evals, eval_batch)
            if req.coco is not None:
                from edgekit.convert.bundling import detection_eval_samples
                from edgekit.convert.coco_gate import map_judge

                shipped = detection_eval_samples(fp32, req.card, head, evals)
                judge = map_judge(req.coco, req.card, head, ref_session, judge, shipped)
    ordered = [reports[r] for r in recipes] + left_out
    for rep in ordered:
        if rep.artifact is None:
            continue
        with b.timed("gate", rep.recipe) as end:
            evaluate(req, rep, eval_batch, judge, b.tick)
            end["status"] = "" if rep.accuracy else f"skipped: {rep.not_measured}"

    failed = [r for r in ordered if r.accuracy and not r.accuracy.passed]
    if failed and not req.allow_accuracy_drop:
        rows = "\n".join(failure_row(r.recipe, r.accuracy, req.threshold) for r in failed if r.accuracy)
        raise BuildError(
            f"accuracy gate failed for {len(failed)} artifact(s) on {evals.names and len(evals.names)} "
            f"{'smoke-set' if evals.smoke else 'evaluation'} images:\n{rows}",
            "give more representative --calibration images, leave that precision out with --precisions, "
            "or accept the drop with --allow-accuracy-drop (it is recorded in the manifest)",
        )
    with b.timed("bundle"):
        bundle = write(req, b.profile, fp32, fp32_hash, ordered, evals, shipped)
    return BuildResult(
        bundle, b.profile.name, ordered, list(b.cache.hits), evals.smoke, len(evals.names), b.stages
    )
