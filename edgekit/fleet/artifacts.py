"""HTTP hosting of bundle archives for fleet deploys: ``GET``/``HEAD /artifacts/<name>`` with Range requests.

``edgekit fleet serve --artifacts DIR`` mounts ``artifacts_app(DIR)`` at ``/artifacts``;
``edgekit deploy --fleet ... --artifacts DIR`` writes the archive there and tells the
agents its URL, SHA-256 and size.  Agents download with ``Range: bytes=N-`` after an
interruption, so a device on a bad link resumes instead of starting over; Starlette's
``FileResponse`` answers single and multiple ranges with 206 (and 416 for a range past
the end) and ``HEAD`` with the headers alone.

Only what a rollout named is served: ``edgekit deploy --fleet`` records each archive it puts
in ``DIR`` (name, SHA-256, size) in ``DIR/.edgekit-named.json`` (``name_artifact``), and
nothing else in the folder is (the operator's ``fleet.token``, a key, a database kept
alongside: a 404 like any missing file).  A named file is served only while it is a plain
file of the size named (not a link, not replaced by something else), by a name of
``A-Z a-z 0-9 . _ -``: no sub-folders, no ``..``.  Who may ask is the listener's rule
(``edgekit.fleet.access``: the token and the ``Host`` names of ``fleet serve``).  Bundles
are verified by signature on the device, not by who may download them; put the server
behind TLS or a VPN when the network is not trusted.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgekit.core.io import write_atomic

log = logging.getLogger(__name__)

ARTIFACT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Starts with '.': never an artifact name, so the record itself is never served.
NAMED_FILE = ".edgekit-named.json"
_LOCK_FILE = ".edgekit-named.lock"
_MAX_NAMED_BYTES = 16 << 20


def safe_artifact_name(name: str) -> bool:
    """1-128 of ``A-Z a-z 0-9 . _ -``, starting with a letter or digit, without ``..``."""
    return bool(ARTIFACT_NAME.fullmatch(name)) and ".." not in name


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Two rollouts naming archives at once must not lose one another's names."""
    with (directory / _LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def named_artifacts(directory: Path) -> dict[str, dict[str, Any]]:
    """What rollouts named in ``directory``: name -> {sha256, size, named_at}; {} when none (or unreadable)."""
    path = directory / NAMED_FILE
    try:
        with path.open("rb") as handle:
            data = handle.read(_MAX_NAMED_BYTES + 1)
        body = json.loads(data) if len(data) <= _MAX_NAMED_BYTES else None
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        # Serving nothing is the safe side: the next rollout writes the record again.
        log.warning(
            "artifacts: %s cannot be read (%s): serving nothing until a rollout names again", path, err
        )
        return {}
    named = body.get("artifacts") if isinstance(body, dict) else None
    if not isinstance(named, dict):
        return {}
    return {
        str(k): v
        for k, v in named.items()
        if safe_artifact_name(str(k)) and isinstance(v, dict) and isinstance(v.get("size"), int)
    }


def name_artifact(directory: Path, name: str, sha256: str, size: int) -> None:
    """Record that a rollout serves ``directory/name`` (``size`` bytes): from now on it is served.

    Names whose file is gone are forgotten at the same time, so the record stays the size
    of the folder.
    """
    if not safe_artifact_name(name):
        raise ValueError(f"{name!r} is not an artifact name")
    with _locked(directory):
        named = {k: v for k, v in named_artifacts(directory).items() if (directory / k).is_file()}
        named[name] = {"sha256": sha256, "size": int(size), "named_at": round(time.time(), 3)}
        body = json.dumps({"artifacts": named}, indent=1, sort_keys=True).encode()
        write_atomic(directory / NAMED_FILE, body, mode=0o644)


def artifact_path(directory: Path, name: str, named: dict[str, dict[str, Any]] | None = None) -> Path | None:
    """The plain file ``directory/name`` when a rollout named it and it is still what was named, else None.

    ``named``: ``named_artifacts(directory)`` when the caller has it already.
    """
    if not safe_artifact_name(name):
        return None
    entry = (named_artifacts(directory) if named is None else named).get(name)
    if entry is None:
        return None
    path = directory / name
    try:
        st = path.lstat()
    except OSError:
        return None
    # A link could point anywhere on the server (its keys, /etc): only plain files are served,
    # and only of the size the rollout named (another file put under its name is not served).
    return path if stat.S_ISREG(st.st_mode) and st.st_size == entry["size"] else None


def artifacts_app(directory: Path | str) -> Any:
    """A Starlette app serving the archives in ``directory``; mount it at ``/artifacts``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    folder = Path(directory).absolute()
    if not folder.is_dir():
        from edgekit.errors import DeployError

        raise DeployError(
            f"the artifact folder {folder} does not exist", "create it, or pass --artifacts DIR of bundles"
        )

    async def artifact(request: Request) -> Response:
        name = str(request.path_params["name"])
        if not safe_artifact_name(name):
            return PlainTextResponse("an artifact name is A-Z a-z 0-9 . _ - (no '..')", status_code=400)
        path = artifact_path(folder, name)
        if path is None:
            return PlainTextResponse(f"no artifact {name}", status_code=404)
        media = "application/gzip" if name.endswith((".tar.gz", ".tgz")) else "application/octet-stream"
        # no-cache: a proxy must ask again (ETag) rather than hand out a replaced archive.
        return FileResponse(
            path, stat_result=path.stat(), media_type=media, headers={"Cache-Control": "no-cache"}
        )

    async def index(request: Request) -> Response:
        named = named_artifacts(folder)
        items = []
        for name in sorted(named):
            if artifact_path(folder, name, named) is not None:
                items.append({"name": name, "size": named[name]["size"]})
        return JSONResponse({"artifacts": items})

    return Starlette(
        routes=[
            Route("/", index, methods=["GET", "HEAD"]),
            Route("/{name}", artifact, methods=["GET", "HEAD"]),
        ]
    )
