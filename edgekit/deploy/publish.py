"""The rollout's artifact: a bundle archive placed in the folder the fleet's artifact server serves.

Placing it also names it (``edgekit.fleet.artifacts.name_artifact``): the server serves only
what a rollout named, never the folder's other files.  Its URL, SHA-256, size and signature
go into each deploy command; ``check_served`` asks the server whether devices will find it
there (with the download token, when the artifact port has one).
"""

from __future__ import annotations

import re
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import DeployError
from edgekit.fleet.artifacts import name_artifact, safe_artifact_name


@dataclass(frozen=True)
class Artifact:
    """A bundle archive placed where the artifact server serves it."""

    name: str
    path: Path
    url: str
    sha256: str
    size: int
    model: str
    version: str
    signature: str | None


def publish_artifact(bundle: Path, directory: Path, base_url: str) -> Artifact:
    """Put ``bundle`` (folder or .tar.gz) into ``directory`` as ``<model>-<version>-<sha12>.tar.gz``."""
    from edgekit.bundle.archive import is_archive_name, open_bundle, pack
    from edgekit.bundle.manifest import SIGNATURE_FILE, read_manifest
    from edgekit.core.io import sha256_file

    if not directory.is_dir():
        raise DeployError(
            f"--artifacts {directory} is not a folder",
            "give the folder `edgekit fleet serve --artifacts DIR` serves",
        )
    if not base_url.lower().startswith(("http://", "https://")):
        raise DeployError(
            f"--artifact-url {base_url!r} is not an http(s) URL",
            "the URL devices reach the artifact folder at, e.g. http://server:8765/artifacts",
        )
    with open_bundle(bundle) as folder:
        manifest = read_manifest(folder)
        sig_file = folder / SIGNATURE_FILE
        # manifest.sig is base64 text already; the agent verifies the bundle itself, this is for the record.
        signature = sig_file.read_bytes().strip().decode("ascii", "replace") if sig_file.is_file() else None
        if signature is not None and not re.fullmatch(r"[A-Za-z0-9+/=_-]{1,4096}", signature):
            signature = (
                None  # not what edgekit writes: leave it out rather than have agents refuse the command
            )
    with tempfile.TemporaryDirectory(prefix=".edgekit-artifact-", dir=directory) as tmp:
        staged = Path(tmp) / "bundle.tar.gz"
        if bundle.is_dir():
            pack(bundle, staged)
        elif is_archive_name(bundle):
            shutil.copyfile(bundle, staged)
        else:
            raise DeployError(f"{bundle} is not a bundle folder or .tar.gz", "pass what edgekit build wrote")
        sha = sha256_file(staged)
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{manifest.model.name}-{manifest.model.version}").strip(".-")
        name = f"{stem[:80] or 'bundle'}-{sha[:12]}.tar.gz"
        assert safe_artifact_name(name), name
        target = directory / name
        size = staged.stat().st_size
        staged.replace(target)  # same folder: atomic, so the server never serves half a file
    name_artifact(directory, name, sha, size)  # only now does the server serve it
    url = f"{base_url.rstrip('/')}/{name}"
    return Artifact(name, target, url, sha, size, manifest.model.name, manifest.model.version, signature)


def check_served(artifact: Artifact, timeout_s: float = 10.0, token: str | None = None) -> str | None:
    """HEAD the artifact's URL from here (with ``token``, the download token): None when it is served right, else why not."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(artifact.url, method="HEAD", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            length = response.headers.get("Content-Length")
    except urllib.error.HTTPError as err:
        return f"{artifact.url} answered HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        return f"{artifact.url} is not reachable from here: {getattr(err, 'reason', err)}"
    if length is not None and length.isdigit() and int(length) != artifact.size:
        return f"{artifact.url} is {length} bytes, the archive {artifact.size}"
    return None
