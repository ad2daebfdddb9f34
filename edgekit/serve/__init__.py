"""``edgekit serve BUNDLE``: a bundle's model behind the Open Inference Protocol (KServe v2), HTTP/REST and gRPC.

The protocol Triton and OpenVINO Model Server speak, so their clients (``tritonclient``,
KServe's) work unchanged.  ``start(model, ServeOptions(...))`` serves a loaded
``edgekit.load(...)`` model and returns the running server; the CLI command wraps it.
Layout: ``endpoints`` (what is served: raw tensors and images), ``queue`` (one bounded
batch queue to one inference worker), ``runner`` (requests alone or as one batch on the
model's session), ``frames`` (a ``Pipeline``'s camera frames on the same worker and
batches), ``service`` (the one infer path both protocols take),
``rest_wire`` and ``datatypes`` (the wire codecs), ``http_app`` and ``grpc_service`` (the
front ends), ``metrics`` (``/metrics``), ``server`` (starting and stopping it all).
"""

from __future__ import annotations

from edgekit.serve.limits import Limits
from edgekit.serve.runner import Batching
from edgekit.serve.server import Running, ServeOptions, start

__all__ = ["Batching", "Limits", "Running", "ServeOptions", "start"]
