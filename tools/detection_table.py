#!/usr/bin/env python3
"""Each artifact of a detector bundle against its fp32 reference, on photographs no one tuned to.

    .venv/bin/python tools/detection_table.py BUNDLE --key builder.pub.pem [--json] [--images DIR]

For every photograph: the faces the fp32 ONNX artifact finds (the reference), and for every
other artifact that runs on this host, how many it finds, the IoU of each with the
reference's match (same class, IoU >= 0.5, greedy: ``edgekit.detection.detector.match``) and
its score; missed and extra faces are counted.  A photograph without a face reads "no face"
where an artifact found none.  The detections are the device's: the bundle's own detection
head, threshold and NMS.  Prints a Markdown table (``--json``: every detection).

The photographs are none of those the build calibrates or gates on (scikit-image's smoke set:
chelsea, coffee, astronaut, rocket, hubble_deep_field, immunohistochemistry, retina, camera,
coins, moon, brick, grass), and all come from packages installed with edgekit (no download):

- ``grace-hopper``: matplotlib's sample photograph (``mpl-data/sample_data/grace_hopper.jpg``),
  a studio portrait: one face, large.
- ``hopper-small-on-china``: that portrait shrunk to a third and pasted onto scikit-learn's
  ``china.jpg``: one face, small, on a busy background.
- ``lfw-faces``: the first four images of scikit-image's ``lfw_subset`` (Labeled Faces in the
  Wild: press photographs, 25x25 grey, cropped to the face), each upscaled to 144 px on a
  grey margin, in a 2x2 grid: four faces.
- ``lfw-non-faces``: images 100-103 of the same subset, which its README calls non-faces
  (random crops of the same photographs): no face.
- ``china``, ``flower``: scikit-learn's two sample photographs (a temple, a flower): no face.
- ``motorcycle``: scikit-image's ``motorcycle_left`` (a stereo pair's left view): no face.

They need the ``plot`` extra (matplotlib) and scikit-learn (which the ``build`` extra's NNCF
brings).  ``--images DIR`` adds every image in DIR (its name says nothing about faces: the table shows
what the reference finds).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

# Photographs without a face: a face an artifact finds there is a false positive, and the
# reference's own finding is reported, not hidden.
NO_FACE = ("lfw-non-faces", "china", "flower", "motorcycle")


def _grace_hopper() -> np.ndarray:
    import matplotlib

    path = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        sys.exit(f"cannot read {path}")
    return image


def _sklearn(name: str) -> np.ndarray:
    from sklearn.datasets import load_sample_image

    return np.ascontiguousarray(load_sample_image(name)[..., ::-1])


def _lfw_grid(first: int) -> np.ndarray:
    from skimage import data

    faces = data.lfw_subset()[first : first + 4]
    tiles = []
    for face in faces:
        tile = cv2.resize((face * 255).astype(np.uint8), (144, 144), interpolation=cv2.INTER_CUBIC)
        tiles.append(cv2.copyMakeBorder(tile, 48, 48, 48, 48, cv2.BORDER_CONSTANT, value=128))
    grid = np.vstack([np.hstack(tiles[:2]), np.hstack(tiles[2:])])
    return np.repeat(grid[..., None], 3, axis=2)


def _hopper_on_china() -> np.ndarray:
    china = _sklearn("china.jpg").copy()
    small = cv2.resize(_grace_hopper(), None, fx=1 / 3, fy=1 / 3, interpolation=cv2.INTER_AREA)
    h, w = small.shape[:2]
    china[60 : 60 + h, 380 : 380 + w] = small
    return china


def _motorcycle() -> np.ndarray:
    from skimage import data

    return np.ascontiguousarray(data.stereo_motorcycle()[0][..., ::-1])


PHOTOGRAPHS: dict[str, Callable[[], np.ndarray]] = {
    "grace-hopper": _grace_hopper,
    "hopper-small-on-china": _hopper_on_china,
    "lfw-faces": lambda: _lfw_grid(0),
    "lfw-non-faces": lambda: _lfw_grid(100),
    "china": lambda: _sklearn("china.jpg"),
    "flower": lambda: _sklearn("flower.jpg"),
    "motorcycle": _motorcycle,
}


@dataclass
class Runner:
    """One artifact on its backend, decoding with the bundle's detection head."""

    name: str
    run: Callable[[np.ndarray], tuple[Any, ...]]
    close: Callable[[], None]


def open_runners(bundle: Path) -> tuple[list[Runner], list[tuple[str, str]]]:
    """A runner for each artifact that runs here (fp32 ONNX first), and ``(artifact, why)`` for the others."""
    from edgekit.backends import registry
    from edgekit.bench.runner import plan
    from edgekit.bundle import read_manifest
    from edgekit.detection.detector import Detector
    from edgekit.processing.preprocessing import Preprocessor, PreprocessSpec
    from edgekit.processing.tensors import from_output

    manifest = read_manifest(bundle)
    if manifest.model.task != "detection" or manifest.detection is None:
        sys.exit(f"{bundle} is a {manifest.model.task} bundle: this table is for detectors")
    spec = PreprocessSpec.from_manifest(manifest)
    detector = Detector(manifest.detection, spec, manifest.labels)
    candidates, skipped = plan(bundle, threads=(1,))
    candidates.sort(key=lambda c: (c.artifact != "onnxruntime-fp32", c.artifact))
    if not candidates or candidates[0].artifact != "onnxruntime-fp32":
        sys.exit(f"{bundle} has no onnxruntime-fp32 artifact that runs here: it is the reference")
    runners = []
    for cand in candidates:
        art = manifest.artifact(cand.artifact)
        session = registry.get(art.backend).load(bundle / art.path, cand.options)
        prep = Preprocessor(spec, session.inputs[0])
        names = [o.name for o in session.outputs]

        def run(frame: np.ndarray, session: Any = session, prep: Any = prep, names: Any = names) -> Any:
            raw = session.run(prep(frame))
            outputs = [from_output(y, o) for y, o in zip(raw, session.outputs, strict=True)]
            return detector(outputs, frame.shape[:2], names)

        runners.append(Runner(cand.artifact, run, session.close))
    return runners, [(s.artifact or f"{s.backend}-{s.precision}", s.reason) for s in skipped]


def compare(reference: tuple[Any, ...], found: tuple[Any, ...]) -> dict[str, Any]:
    from edgekit.detection.detector import match

    m = match(reference, found)
    pairs = sorted(m.pairs)  # in the reference's order (best score first), as its column lists them
    return {
        "faces": len(found),
        "matched": len(pairs),
        "missed": len(m.missed),
        "extra": len(m.extra),
        "iou": [round(iou, 4) for _, _, iou in pairs],
        "score": [round(found[j].score, 4) for _, j, _ in pairs],
        "score_drift": [round(found[j].score - reference[i].score, 4) for i, j, _ in pairs],
        "extra_score": [round(found[j].score, 4) for j in m.extra],
        "detections": [d.to_dict() for d in found],
    }


def cell(row: dict[str, Any]) -> str:
    if row["faces"] == 0 and row["missed"] == 0:
        return "no face"
    parts = [f"{row['faces']}"]
    if row["iou"]:
        parts.append(
            f"IoU {min(row['iou']):.3f}" + (f"–{max(row['iou']):.3f}" if len(row["iou"]) > 1 else "")
        )
        parts.append("score " + "/".join(f"{s:.3f}" for s in row["score"]))
    if row["missed"]:
        parts.append(f"**{row['missed']} missed**")
    if row["extra"]:
        scores = "/".join(f"{s:.3f}" for s in row["extra_score"])
        parts.append(f"**{row['extra']} extra** (score {scores})")
    return " · ".join(parts)


def reference_cell(found: list[dict[str, Any]], name: str) -> str:
    if not found:
        return "no face"
    scores = "/".join(f"{d['score']:.3f}" for d in found)
    mark = " (**none expected**)" if name in NO_FACE else ""
    return f"{len(found)} · score {scores}{mark}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--key", type=Path, action="append", default=[], help="trusted public key (PEM)")
    parser.add_argument("--allow-unsigned", action="store_true", help="run an unsigned bundle's artifacts")
    parser.add_argument("--images", type=Path, help="a folder of more photographs")
    parser.add_argument("--json", action="store_true", help="every detection, as JSON")
    args = parser.parse_args(argv)

    from edgekit.bundle import verify

    # The artifacts are native code (a TVM library runs as it loads): only a bundle whose
    # signature checks out against a trusted key, as edgekit run does.
    report = verify(args.bundle, args.key, require_signature=not args.allow_unsigned)
    if not report.ok:
        sys.exit(f"{args.bundle} does not verify (pass --key, or --allow-unsigned):\n{report}")

    photos = {name: load() for name, load in PHOTOGRAPHS.items()}
    if args.images:
        for path in sorted(args.images.iterdir()):
            image = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if image is not None:
                photos[path.stem] = image
    runners, skipped = open_runners(args.bundle)
    rows: dict[str, dict[str, Any]] = {}
    try:
        for name, image in photos.items():
            reference = runners[0].run(image)
            rows[name] = {
                "size": [int(image.shape[1]), int(image.shape[0])],
                "face_expected": name not in NO_FACE if name in PHOTOGRAPHS else None,
                "reference": [d.to_dict() for d in reference],
                "artifacts": {r.name: compare(reference, r.run(image)) for r in runners[1:]},
            }
    finally:
        for r in runners:
            r.close()
    result = {
        "bundle": str(args.bundle),
        "reference": runners[0].name,
        "artifacts": [r.name for r in runners[1:]],
        "not_run": dict(skipped),
        "photographs": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    names = result["artifacts"]
    print(f"| photograph | {runners[0].name} (reference) | " + " | ".join(names) + " |")
    print("|" + " --- |" * (len(names) + 2))
    for name, row in rows.items():
        cells = [cell(row["artifacts"][a]) for a in names]
        print(f"| {name} | {reference_cell(row['reference'], name)} | " + " | ".join(cells) + " |")
    print()
    print("Each cell: faces found · IoU of its matches with the reference's faces · their scores.")
    for artifact, why in skipped:
        print(f"- {artifact}: not run here ({why})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
