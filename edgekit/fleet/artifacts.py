"""HTTP hosting of bundle archives for fleet deploys: ``GET``/``HEAD /artifacts/<name>`` with Range requests.

``edgekit fleet serve --artifacts DIR`` mounts ``artifacts_app(DIR)`` at ``/artifacts``;
``edgekit deploy --fleet ... --artifacts DIR`` writes the archive there and tells the
agents its URL, SHA-256 and size.  Agents download with ``Range: bytes=N-`` after an
interruption, so a device on a bad link resumes instead of starting over; Starlette's
``FileResponse`` answers single and multiple ranges with 206 (and 416 for a range past
the end) and ``HEAD`` with the headers alone.

Only plain files directly in ``DIR`` are served, by a name of ``A-Z a-z 0-9 . _ -``:
no sub-folders, no ``..``, no links leading out of the folder.  What is served is not
secret (bundles are verified by signature on the device, not by who may download them);
put the server behind TLS or a VPN when the network is not trusted.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

ARTIFACT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def safe_artifact_name(name: str) -> bool:
    """1-128 of ``A-Z a-z 0-9 . _ -``, starting with a letter or digit, without ``..``."""
    return bool(ARTIFACT_NAME.fullmatch(name)) and ".." not in name


def artifact_path(directory: Path, name: str) -> Path | None:
    """The plain file ``directory/name`` when ``name`` is safe and it is one, else None."""
    if not safe_artifact_name(name):
        return None
    path = directory / name
    try:
        st = path.lstat()
    except OSError:
        return None
    # A link could point anywhere on the server (its keys, /etc): only plain files are served.
    return path if stat.S_ISREG(st.st_mode) else None


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
        items = []
        for entry in sorted(folder.iterdir()):
            if artifact_path(folder, entry.name) is not None:
                items.append({"name": entry.name, "size": entry.stat().st_size})
        return JSONResponse({"artifacts": items})

    return Starlette(
        routes=[
            Route("/", index, methods=["GET", "HEAD"]),
            Route("/{name}", artifact, methods=["GET", "HEAD"]),
        ]
    )
