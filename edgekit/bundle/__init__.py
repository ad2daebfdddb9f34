"""Bundles: the artifacts built for one device, their manifest, its signature, as a folder or ``.tar.gz``.

Layout of a bundle folder (and, at the top level, of its archive)::

    manifest.json              the Manifest: model, preprocessing, labels, device, artifacts
                               (each file's path, SHA-256 and size), build facts, signer's key id
    manifest.sig               base64 Ed25519 signature over the exact bytes of manifest.json
    artifacts/<name>/<file>    each artifact's files, under its name (``onnxruntime-int8``...)

The build writes one (``edgekit.convert.bundle_writer.write_bundle``); check one with ``verify`` (hashes, no missing or extra
file, signature against keys the caller trusts); open an archive only through ``unpack``
or ``open_bundle``, which refuse links, ``..``, absolute names, devices and tar bombs.
Those rules live in ``edgekit.bundle.integrity``, applied alike by ``verify`` and by the
streamed check of a received archive (``edgekit.bundle.streamed``).
Needs ``pydantic`` (and ``cryptography`` to sign or check a signature).
"""

from __future__ import annotations

from edgekit.bundle.archive import is_archive_name, open_bundle, pack, unpack
from edgekit.bundle.integrity import MAX_UNPACKED_BYTES
from edgekit.bundle.keys import default_key_stem, generate_keypair, key_id, load_private_key, load_public_key
from edgekit.bundle.manifest import (
    MANIFEST_FILE,
    SCHEMA_VERSION,
    SIGNATURE_FILE,
    Accuracy,
    ArtifactEntry,
    BuildHost,
    BuildInfo,
    DeviceInfo,
    FileEntry,
    Latency,
    Manifest,
    ModelInfo,
    Preprocess,
    SignatureInfo,
    parse_manifest,
    read_manifest,
)
from edgekit.bundle.verify import Check, VerifyReport, verify
from edgekit.errors import BundleError, KeyFileError, UnsafeArchiveError, VerificationError

__all__ = [
    "MANIFEST_FILE",
    "MAX_UNPACKED_BYTES",
    "SCHEMA_VERSION",
    "SIGNATURE_FILE",
    "Accuracy",
    "ArtifactEntry",
    "BuildHost",
    "BuildInfo",
    "BundleError",
    "Check",
    "DeviceInfo",
    "FileEntry",
    "KeyFileError",
    "Latency",
    "Manifest",
    "ModelInfo",
    "Preprocess",
    "SignatureInfo",
    "UnsafeArchiveError",
    "VerificationError",
    "VerifyReport",
    "default_key_stem",
    "generate_keypair",
    "is_archive_name",
    "key_id",
    "load_private_key",
    "load_public_key",
    "open_bundle",
    "pack",
    "parse_manifest",
    "read_manifest",
    "unpack",
    "verify",
]
