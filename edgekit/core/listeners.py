"""Who may reach an edgekit listener: loopback needs no token, anything else does, and which ``Host`` names it answers.

The one rule of ``edgekit fleet serve`` and ``edgekit serve``: bound to loopback (the default,
127.0.0.1) only this machine reaches the server, so no token is needed; bound to anything
else it refuses to start without one (``needs_token``).  Every HTTP request's ``Host`` must be
one the server answers to (``allowed_hosts``: loopback names, the address it is bound to and
``--allowed-host``), so a web page cannot reach a loopback server through DNS rebinding.
The token itself is read by ``edgekit.core.tokens.read_token``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from edgekit.errors import EdgekitError

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


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


def needs_token(bind: str, token: str | None) -> bool:
    """The one rule of every listener: off loopback, nobody is answered without a token."""
    return token is None and not is_loopback(bind)
