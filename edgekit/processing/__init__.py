"""Frames in, tensors out, and back: preprocessing (resize, letterbox, normalize), the
classifier's postprocessing, and the tensors' layouts.
"""
