"""Fetch a bundle archive over HTTP(S) into the state root's ``incoming/``, resuming with Range requests.

A device on a flaky link must not start a 30 MB download over after every drop: bytes
land in ``incoming/<sha256>.part`` and each retry asks for ``Range: bytes=<have>-``.
A server that ignores the range (200) restarts the file; a 206 must start exactly where
the part ends.  The size is checked against the command's size and the agent's limit
before and during the transfer (a server that sends more is cut off), and the SHA-256
of the whole file against the command's before the file is renamed to
``<sha256>.tar.gz``; a mismatch deletes the part so the next try starts clean.

Only http and https are fetched, redirects included (urllib alone would follow a
redirect to ftp://).
"""

from __future__ import annotations

import http.client
import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgekit._core.io import fsync_dir, sha256_file
from edgekit._version import __version__
from edgekit.errors import DeployError

log = logging.getLogger(__name__)

CHUNK = 256 * 1024
DEFAULT_MAX_BYTES = 2 << 30  # the unpack cap (edgekit.bundle.archive) bounds a bundle anyway
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")

Progress = Callable[[int, int], None]


class DownloadError(DeployError):
    """A bundle could not be fetched, or what arrived is not what the command described."""


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        if not newurl.lower().startswith(("http://", "https://")):
            raise DownloadError(
                f"{req.full_url} redirects to {newurl[:200]!r}, which is not http(s)",
                "host bundles on an http(s) server (edgekit fleet serve --artifacts DIR)",
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_opener = urllib.request.build_opener(_HttpOnlyRedirects())


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class _Retry(Exception):
    """A transfer that may work when tried again (a drop, a timeout, a 5xx)."""


def download(
    url: str,
    incoming: Path,
    *,
    sha256: str,
    size: int,
    max_bytes: int = DEFAULT_MAX_BYTES,
    attempts: int = 5,
    timeout_s: float = 30.0,
    backoff_s: float = 1.0,
    progress: Progress | None = None,
) -> Path:
    """Download ``url`` to ``incoming/<sha256>.tar.gz`` and return it; raises ``DownloadError``.

    ``attempts`` transfers at most (each resuming where the last stopped), waiting
    ``backoff_s``, then twice that ... between them.  ``progress(have, size)`` is called
    as bytes arrive.  A permanent answer (404, 403, a wrong size) ends it at once.
    """
    if size > max_bytes:
        raise DownloadError(
            f"the bundle is {size} bytes, more than this agent's limit of {max_bytes}",
            "raise the agent's --max-bundle-mb, or ship a smaller bundle",
        )
    incoming.mkdir(parents=True, exist_ok=True)
    done = incoming / f"{sha256}.tar.gz"
    part = incoming / f"{sha256}.part"
    if done.is_file() and _size(done) == size and sha256_file(done) == sha256:
        return done  # fetched before an interruption of the install: no need to fetch again
    _clear_others(incoming, keep=(part.name, done.name))
    last = "no attempt made"
    for attempt in range(1, attempts + 1):
        try:
            _transfer(url, part, size, timeout_s, progress)
            break
        except _Retry as why:
            last = str(why)
            if attempt < attempts:
                delay = backoff_s * 2 ** (attempt - 1)
                log.warning(
                    "agent: download of %s: %s (%d of %d bytes here); retry %d/%d in %g s",
                    url, last, _size(part), size, attempt, attempts - 1, delay,
                )  # fmt: skip
                time.sleep(delay)
    else:
        raise DownloadError(
            f"could not download {url} in {attempts} attempts: {last} ({_size(part)} of {size} bytes here; "
            "the next deploy of this bundle resumes from there)",
            "check that the artifact server is up and reachable from the device",
        )
    actual = sha256_file(part)
    if actual != sha256:
        part.unlink(missing_ok=True)
        raise DownloadError(
            f"the download from {url} has SHA-256 {actual}, the command said {sha256}",
            "the artifact on the server is not the one the deploy was made for: deploy it again",
        )
    os.replace(part, done)  # the .part was fsynced as it was written
    fsync_dir(done.parent)
    return done


def _clear_others(incoming: Path, keep: tuple[str, ...]) -> None:
    """Downloads of other bundles: one agent fetches one bundle at a time, so they are abandoned."""
    for entry in incoming.iterdir():
        if entry.name not in keep and entry.name.endswith((".part", ".tar.gz")) and entry.is_file():
            entry.unlink(missing_ok=True)


def _transfer(url: str, part: Path, size: int, timeout_s: float, progress: Progress | None) -> None:
    """One HTTP request appending to ``part``; returns when it holds ``size`` bytes, else raises."""
    have = _size(part)
    if have > size:  # left by a different, longer file under the same name: start over
        part.unlink()
        have = 0
    if have == size:
        return
    headers = {"User-Agent": f"edgekit-agent/{__version__}", "Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = _opener.open(request, timeout=timeout_s)
    except urllib.error.HTTPError as err:
        err.close()
        if err.code == 416 and have:  # our part does not fit the file on the server: start over
            part.unlink(missing_ok=True)
            raise _Retry(f"the server refused the range {have}- (416)") from None
        if err.code in (408, 429) or err.code >= 500:
            raise _Retry(f"HTTP {err.code} {err.reason}") from None
        raise DownloadError(
            f"{url} answered HTTP {err.code} {err.reason}",
            "check the artifact URL (edgekit fleet serve --artifacts DIR serves /artifacts/<name>)",
        ) from None
    except urllib.error.URLError as err:
        if isinstance(err.reason, DownloadError):
            raise err.reason from None
        raise _Retry(f"cannot connect: {err.reason}") from None
    except (OSError, http.client.HTTPException) as err:
        raise _Retry(f"cannot connect: {err}") from None
    with response:
        status = response.status
        if status == 206 and have:
            match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", ""))
            if not match or int(match[1]) != have:
                part.unlink(missing_ok=True)
                raise _Retry(f"the server sent the range {response.headers.get('Content-Range')!r}")
            total = match[3]
            if total != "*" and int(total) != size:
                raise _size_error(url, int(total), size)
            mode = "ab"
        elif status == 200:
            have, mode = 0, "wb"  # the whole file, whatever we asked for
            length = response.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) != size:
                raise _size_error(url, int(length), size)
        else:
            raise _Retry(f"unexpected HTTP status {status}")
        try:
            with part.open(mode) as out:
                while have < size:
                    block = response.read(min(CHUNK, size - have))
                    if not block:
                        break
                    out.write(block)
                    have += len(block)
                    if progress is not None:
                        progress(have, size)
                out.flush()
                os.fsync(out.fileno())
            if have == size and response.read(1):
                part.unlink(missing_ok=True)
                raise DownloadError(
                    f"{url} sends more than the {size} bytes the command said",
                    "the artifact on the server is not the one the deploy was made for: deploy it again",
                )
        except (OSError, http.client.HTTPException) as err:
            raise _Retry(f"the transfer broke off: {err}") from None
    if have < size:
        raise _Retry("the transfer broke off early")


def _size_error(url: str, actual: int, expected: int) -> DownloadError:
    return DownloadError(
        f"{url} is {actual} bytes, the command said {expected}",
        "the artifact on the server is not the one the deploy was made for: deploy it again",
    )
