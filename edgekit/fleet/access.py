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

The loopback and ``Host`` rules are every edgekit listener's (``edgekit.core.listeners``; ``edgekit
serve`` follows them too).  The same rule guards each listener (``access_middleware``, ``needs_token``): the dashboard's
port with the dashboard's token, and ``--artifacts-port`` with its own download token
(``--artifact-token-file`` / ``EDGEKIT_ARTIFACT_TOKEN``, which agents hold: a device never
holds the dashboard's token, which would let it read the whole fleet).
"""

from __future__ import annotations

import hashlib
import hmac
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs

from edgekit.core.listeners import LOOPBACK_NAMES, allowed_hosts, is_loopback, needs_token
from edgekit.core.tokens import ARTIFACT_TOKEN_ENV, MAKE_ONE, MIN_TOKEN, TOKEN_ENV, read_token

__all__ = [
    "ARTIFACT_TOKEN_ENV",
    "LOOPBACK_NAMES",
    "MAKE_ONE",
    "MIN_TOKEN",
    "TOKEN_ENV",
    "TokenMiddleware",
    "access_middleware",
    "allowed_hosts",
    "is_loopback",
    "needs_token",
    "read_token",
]

COOKIE = "edgekit_fleet"
# Open to anyone who reaches the port: a load balancer's probe (it says "ok" and a counter, nothing more).
OPEN_PATHS = frozenset({"/healthz"})


def access_middleware(token: str | None, hosts: list[str]) -> list[Any]:
    """The middleware that guards a listener: ``Host`` in ``hosts`` (checked first), then ``token`` if any."""
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    guards = [Middleware(TrustedHostMiddleware, allowed_hosts=hosts)]
    if token is not None:
        guards.append(Middleware(TokenMiddleware, token=token))
    return guards


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
