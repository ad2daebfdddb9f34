"""From detections to events: objects tracked per camera, zones and lines they enter, leave and cross.

``tracking`` gives each object a stable id per camera; ``zones`` turns tracks into events
(enter, leave, dwell, line crossed, counts per interval); ``proof`` keeps a snapshot and a clip
of each event on the device's disk.  Nothing here talks to a broker: the pipeline hands it
detections (and frames, for proofs), and its events go out through telemetry.
"""
