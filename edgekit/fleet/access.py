"""Who may read the fleet server: a bearer token off loopback, and only the host names it answers to.

``edgekit fleet serve`` on loopback (the default, 127.0.0.1) needs no token: only this machine
reaches it.  Bound to anything else it refuses to start without one (``--token-file`` or
``EDGEKIT_FLEET_TOKEN``), and then every request but ``/healthz`` must carry it:

- ``Authorization: Bearer <token>`` (Prometheus' ``authorization: credentials_file``, curl, scripts);
- or the dashboard's cookie: open ``/?token=<token>`` once, the server answers with an HttpOnly,
  SameSite=Strict cookie and a redirect to ``/`` (so the token leaves the address bar and the
  history).  The cookie holds an HMAC of the token, not the token itself.

Tokens are compared with ``hmac.compare_digest``.  Every request's ``Host`` must be one the
server answers to (``TrustedHostMiddleware``: loopback names, the address it is bound to and
``--allowed-host``), so a web page cannot reach a loopback dashboard through DNS rebinding.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import stat
from collections.abc import Iterable
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from edgekit.errors import EdgekitError

TOKEN_ENV = "EDGEKIT_FLEET_TOKEN"
COOKIE = "edgekit_fleet"
MIN_TOKEN = 16
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")
# Open to anyone who reaches the port: a load balancer's probe (it says "ok" and a counter, nothing more).
OPEN_PATHS = frozenset({"/healthz"})
MAKE_ONE = "make one: python -c 'import secrets; print(secrets.token_urlsafe(32))' > fleet.token; chmod 600 fleet.token"


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` keeps the server to this machine."""
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind: str, extra: Iterable[str] = ()) -> list[str]:
    """The ``Host`` names the server answers to: loopback's, ``bind`` itself unless a wildcard, and ``extra``."""
    hosts = list(LOOPBACK_NAMES)
    if bind not in ("0.0.0.0", "::", "") and bind not in hosts:
        hosts.append(bind)
    for name in extra:
        name = name.strip().lower()
        if not name or any(c in name for c in "/@ \t") or (":" in name and not name.startswith("[")):
            raise EdgekitError(
                f"--allowed-host {name!r} is not a host name",
                "give the name or address browsers use, without a port: --allowed-host fleet.local",
            )
        hosts.append(name)
    return hosts


def read_token(token_file: Path | None) -> str | None:
    """The token from ``token_file``, else ``$EDGEKIT_FLEET_TOKEN``, else None; refused when too short."""
    if token_file is not None:
        try:
            st = token_file.stat()
            text = token_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise EdgekitError(f"cannot read --token-file {token_file}: {err}", MAKE_ONE) from err
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise EdgekitError(
                f"--token-file {token_file} can be read by other users",
                f"chmod 600 {token_file}",
            )
        token, where = text.strip(), f"--token-file {token_file}"
    elif os.environ.get(TOKEN_ENV):
        token, where = os.environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
    else:
        return None
    if len(token) < MIN_TOKEN or any(c.isspace() or not c.isprintable() for c in token):
        raise EdgekitError(
            f"the token in {where} is not usable: {MIN_TOKEN} or more printable characters, no spaces",
            MAKE_ONE,
        )
    return token


def _cookie_value(token: str) -> str:
    return hmac.new(token.encode(), b"edgekit fleet dashboard cookie", hashlib.sha256).hexdigest()


class TokenMiddleware:
    """ASGI middleware: every HTTP request but ``OPEN_PATHS`` needs the token (header or cookie); see the module."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self._bearer = f"Bearer {token}".encode()
        self._cookie = _cookie_value(token)
        self._token = token.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])  # names are lower-case bytes; a repeated one: the last
        if hmac.compare_digest(headers.get(b"authorization", b""), self._bearer) or self._has_cookie(
            headers.get(b"cookie", b"")
        ):
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/" and scope["method"] == "GET":
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            offered = query.get("token", [""])[-1].encode()
            if offered and hmac.compare_digest(offered, self._token):
                await self._exchange(scope, send)
                return
        await self._refuse(send)

    def _has_cookie(self, header: bytes) -> bool:
        if not header or len(header) > 8192:
            return False
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(header.decode("latin-1"))
        except CookieError:  # a malformed Cookie header is no cookie
            return False
        morsel = jar.get(COOKIE)
        return morsel is not None and hmac.compare_digest(morsel.value.encode(), self._cookie.encode())

    async def _exchange(self, scope: dict[str, Any], send: Any) -> None:
        """``/?token=...``: set the cookie and send the browser to ``/`` without the token in the address."""
        secure = "; Secure" if scope.get("scheme") == "https" else ""
        cookie = f"{COOKIE}={self._cookie}; Path=/; HttpOnly; SameSite=Strict{secure}"
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", b"/"),
                    (b"set-cookie", cookie.encode()),
                    (b"cache-control", b"no-store"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"content-length", b"0"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    @staticmethod
    async def _refuse(send: Any) -> None:
        body = (
            b"401: this fleet server needs its token: send 'Authorization: Bearer <token>', "
            b"or open /?token=<token> once in the browser\n"
        )
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"www-authenticate", b'Bearer realm="edgekit fleet"'),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
