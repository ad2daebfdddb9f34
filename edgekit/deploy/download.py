"""Fetch a bundle archive over HTTP(S) into the state root's ``incoming/``, resuming with Range requests.

Only from the agent's artifact origins (``--artifact-origin https://fleet.local:8443``:
scheme, host and port): a URL off the list is refused before any connection, and so is a
redirect off it.  Without the list a command could make the device fetch whatever its
network reaches (loopback, link-local, the LAN) and report on it.

Within one deploy a device on a flaky link must not start a 30 MB download over after every
drop: bytes land in ``incoming/<key>.part`` (``key``: SHA-256 of the URL and the expected
SHA-256, so bytes of one URL never complete another's) and each retry asks for
``Range: bytes=<have>-``.  A server that ignores the range (200) restarts the file; a 206
must start exactly where the part ends.  The size is checked against the command's size
and the agent's limit before and during the transfer (a server that sends more is cut
off), and the SHA-256 of the whole file against the command's before the file is renamed
to ``<key>.tar.gz``.  A failed download deletes its part: nothing of it is kept.

With a ``token`` (the artifact port's download token, ``--artifact-token-file``) each request
carries ``Authorization: Bearer <token>``; it goes only to the allowed origins, as every
request does.

What a refusal says (``DownloadError.message``, sent back on ``cmd/result``) holds nothing
the server said: no status, size, hash or whether a port was open, only ``refused: origin
not allowed``, ``download failed`` or ``hash mismatch`` and what the command itself said.
The details go to the agent's own log (``DownloadError.detail``).
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from edgekit._version import __version__
from edgekit.core.backoff import Backoff
from edgekit.core.io import fsync_dir, sha256_file
from edgekit.errors import DeployError

log = logging.getLogger(__name__)

CHUNK = 256 * 1024
DEFAULT_MAX_BYTES = 512 << 20  # --max-bundle-mb: what one deploy may pull onto the device
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")

Progress = Callable[[int, int], None]


REFUSED = "refused: origin not allowed"
FAILED = "download failed"
MISMATCH = "hash mismatch"
_ORIGIN_HINT = "the agent fetches only from its --artifact-origin list (EDGEKIT_ARTIFACT_ORIGINS)"
_FAILED_HINT = "check that the artifact server is up and serves the bundle; the agent's log says more"
_MISMATCH_HINT = "the artifact on the server is not the one the deploy was made for: deploy it again"


class DownloadError(DeployError):
    """A bundle could not be fetched, or what arrived is not what the command described.

    ``message`` says nothing the server said (it goes back over MQTT); ``detail`` does, for the log.
    """

    def __init__(self, message: str, hint: str = "", detail: str = "") -> None:
        from edgekit.core.redact import redact_url

        super().__init__(message, hint)
        self.detail = redact_url(detail or message)  # a presigned URL's ?sig= / ?token= is not for the log


Origin = tuple[str, str, int]


def parse_origin(text: str) -> Origin:
    """``https://fleet.local:8443`` -> ``("https", "fleet.local", 8443)``; ``ValueError`` saying why not.

    Scheme and host only (a path, user, query or fragment is refused); the port defaults to the scheme's.
    """
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError as err:
        raise ValueError(f"{text!r} is not an origin: {err}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r} is not an http(s) origin")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"{text!r} is more than scheme://host[:port]")
    return parts.scheme, parts.hostname.lower(), port or (443 if parts.scheme == "https" else 80)


def origin_of(url: str) -> Origin | None:
    """The origin of an http(s) ``url``, or None when it has none (another scheme, no host, a bad port)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or (443 if scheme == "https" else 80)


def _allowed(url: str, origins: frozenset[Origin]) -> bool:
    origin = origin_of(url)
    return origin is not None and origin in origins


class _OriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to one of the allowed origins (http(s) by construction)."""

    def __init__(self, origins: frozenset[Origin]) -> None:
        self.origins = origins

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        if not _allowed(newurl, self.origins):
            raise DownloadError(
                REFUSED, _ORIGIN_HINT, f"{req.full_url} redirects to {newurl[:200]!r}, off the origin list"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _opener(origins: frozenset[Origin]) -> urllib.request.OpenerDirector:
    # No proxy from the environment: the origin check is of the host the agent connects to.
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), _OriginRedirects(origins))


def part_key(url: str, sha256: str) -> str:
    """The name of a download's files in ``incoming/``: SHA-256 over the URL and the expected SHA-256."""
    return hashlib.sha256(f"{sha256}\n{url}".encode()).hexdigest()


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
    origins: Iterable[Origin],
    max_bytes: int = DEFAULT_MAX_BYTES,
    attempts: int = 5,
    timeout_s: float = 30.0,
    backoff_s: float = 1.0,
    progress: Progress | None = None,
    token: str | None = None,
) -> Path:
    """Download ``url`` to ``incoming/<key>.tar.gz`` and return it; raises ``DownloadError``.

    ``origins``: where the agent may fetch from (``parse_origin``); ``url`` and every redirect
    must be on it.  ``attempts`` transfers at most (each resuming where the last stopped),
    waiting ``backoff_s``, then twice that ... between them.  ``progress(have, size)`` is
    called as bytes arrive.  A permanent answer (404, 403, a wrong size) ends it at once.
    """
    allowed = frozenset(origins)
    if not _allowed(url, allowed):
        raise DownloadError(REFUSED, _ORIGIN_HINT, f"{url[:200]} is not on the origin list")
    if size > max_bytes:
        raise DownloadError(
            f"the bundle is {size} bytes, more than this agent's limit of {max_bytes}",
            "raise the agent's --max-bundle-mb, or ship a smaller bundle",
        )
    incoming.mkdir(parents=True, exist_ok=True)
    key = part_key(url, sha256)
    done = incoming / f"{key}.tar.gz"
    part = incoming / f"{key}.part"
    if done.is_file() and _size(done) == size and sha256_file(done) == sha256:
        return done  # fetched before an interruption of the install: no need to fetch again
    _clear_others(incoming, keep=(part.name, done.name))
    try:
        return _fetch(url, part, done, sha256, size, allowed, attempts, timeout_s, backoff_s, progress, token)
    except BaseException:
        part.unlink(missing_ok=True)  # nothing of a failed download is kept, or resumed by another
        raise


def _fetch(
    url: str,
    part: Path,
    done: Path,
    sha256: str,
    size: int,
    allowed: frozenset[Origin],
    attempts: int,
    timeout_s: float,
    backoff_s: float,
    progress: Progress | None,
    token: str | None,
) -> Path:
    opener = _opener(allowed)
    last = "no attempt made"
    backoff = Backoff(backoff_s)  # uncapped: ``attempts`` bounds it
    for attempt in range(1, attempts + 1):
        try:
            _transfer(opener, url, part, size, timeout_s, progress, token)
            break
        except _Retry as why:
            last = str(why)
            if attempt < attempts:
                log.warning(
                    "agent: download of %s: %s (%d of %d bytes here); retry %d/%d in %g s",
                    url, last, _size(part), size, attempt, attempts - 1, backoff.delay_s,
                )  # fmt: skip
                backoff.wait()
    else:
        raise DownloadError(FAILED, _FAILED_HINT, f"could not download {url} in {attempts} attempts: {last}")
    actual = sha256_file(part)
    if actual != sha256:
        raise DownloadError(
            MISMATCH,
            _MISMATCH_HINT,
            f"the download from {url} has SHA-256 {actual}, the command said {sha256}",
        )
    os.replace(part, done)  # the .part was fsynced as it was written
    fsync_dir(done.parent)
    return done


def _clear_others(incoming: Path, keep: tuple[str, ...]) -> None:
    """Downloads of other bundles: one agent fetches one bundle at a time, so they are abandoned."""
    for entry in incoming.iterdir():
        if entry.name not in keep and entry.name.endswith((".part", ".tar.gz")) and entry.is_file():
            entry.unlink(missing_ok=True)


def _transfer(
    opener: urllib.request.OpenerDirector,
    url: str,
    part: Path,
    size: int,
    timeout_s: float,
    progress: Progress | None,
    token: str | None = None,
) -> None:
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
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = opener.open(request, timeout=timeout_s)
    except urllib.error.HTTPError as err:
        err.close()
        if err.code == 416 and have:  # our part does not fit the file on the server: start over
            part.unlink(missing_ok=True)
            raise _Retry(f"the server refused the range {have}- (416)") from None
        if err.code in (408, 429) or err.code >= 500:
            raise _Retry(f"HTTP {err.code} {err.reason}") from None
        raise DownloadError(FAILED, _FAILED_HINT, f"{url} answered HTTP {err.code} {err.reason}") from None
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
                raise DownloadError(MISMATCH, _MISMATCH_HINT, f"{url} sends more than the {size} bytes")
        except (OSError, http.client.HTTPException) as err:
            raise _Retry(f"the transfer broke off: {err}") from None
    if have < size:
        raise _Retry("the transfer broke off early")


def _size_error(url: str, actual: int, expected: int) -> DownloadError:
    return DownloadError(MISMATCH, _MISMATCH_HINT, f"{url} is {actual} bytes, the command said {expected}")
