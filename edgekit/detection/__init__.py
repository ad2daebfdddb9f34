"""Boxes: the detector's decoders, NMS, the ``Detection``/``Detector`` types, and the detection
gate's one rule (build and device alike).
"""
