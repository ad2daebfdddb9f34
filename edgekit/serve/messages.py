"""The Open Inference Protocol's gRPC messages, built at run time from the spec's own descriptor.

``proto/open_inference_grpc.proto`` is the protocol's ``.proto`` as KServe publishes it
(github.com/kserve/open-inference-protocol, ``specification/protocol/open_inference_grpc.proto``,
Apache-2.0, its licence header kept), and ``proto/open_inference_grpc.binpb`` its compiled
descriptor (``python -m grpc_tools.protoc --descriptor_set_out``; ``tools/oip_descriptor.py``
makes it again and a test checks the two agree).

Why a descriptor and not generated ``_pb2`` modules: generated code pins the protobuf runtime
to the generator's version (or newer), and registers ``inference.*`` in protobuf's default pool,
where ``tritonclient.grpc`` registers its own ``inference.*`` messages: both in one process (a
test, a benchmark, an application that also calls Triton) would refuse to load.  The classes
here live in a pool of their own, and the descriptor's bytes read the same on every protobuf
release (as ``edgekit.protocol.sparkplug`` builds its messages).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DESCRIPTOR = Path(__file__).with_name("proto") / "open_inference_grpc.binpb"
SERVICE = "inference.GRPCInferenceService"
#: Each method of the service: (request message, response message).
METHODS = {
    "ServerLive": ("ServerLiveRequest", "ServerLiveResponse"),
    "ServerReady": ("ServerReadyRequest", "ServerReadyResponse"),
    "ModelReady": ("ModelReadyRequest", "ModelReadyResponse"),
    "ServerMetadata": ("ServerMetadataRequest", "ServerMetadataResponse"),
    "ModelMetadata": ("ModelMetadataRequest", "ModelMetadataResponse"),
    "ModelInfer": ("ModelInferRequest", "ModelInferResponse"),
}


@dataclass(frozen=True)
class Messages:
    """The message classes by name (``by_name["ModelInferRequest"]``)."""

    by_name: dict[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.by_name[name]


@functools.cache
def messages() -> Messages:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    files = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    names = {m for pair in METHODS.values() for m in pair} | {"InferParameter", "InferTensorContents"}
    return Messages(
        {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"inference.{n}")) for n in names}
    )
