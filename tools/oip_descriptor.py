"""Compile the Open Inference Protocol's .proto into the descriptor edgekit serve loads (edgekit/serve/proto/).

    python tools/oip_descriptor.py           # rewrite open_inference_grpc.binpb
    python tools/oip_descriptor.py --check   # exit 1 when the committed one differs

Needs grpcio-tools (the dev extra).  The .proto is KServe's, unchanged (see its header).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent.parent / "edgekit" / "serve" / "proto"
PROTO = "open_inference_grpc.proto"
DESCRIPTOR = PROTO_DIR / "open_inference_grpc.binpb"


def compile_descriptor() -> bytes:
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "d.binpb"
        rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={out}", PROTO])
        if rc != 0:
            raise SystemExit(f"protoc failed on {PROTO_DIR / PROTO} ({rc})")
        return out.read_bytes()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed descriptor")
    args = parser.parse_args()
    data = compile_descriptor()
    if args.check:
        if DESCRIPTOR.read_bytes() != data:
            print(f"{DESCRIPTOR} is stale: run python tools/oip_descriptor.py", file=sys.stderr)
            return 1
        return 0
    DESCRIPTOR.write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
