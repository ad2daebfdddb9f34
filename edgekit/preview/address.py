"""Where the preview listens: ``HOST:PORT``, ``:PORT`` (loopback) or ``[::1]:PORT``."""

from __future__ import annotations

import ipaddress

from edgekit.errors import EdgekitError

#: ``:8080`` means this machine only: the preview has no login, so reaching it from the
#: network is something the user asks for by naming an address.
DEFAULT_HOST = "127.0.0.1"


class PreviewError(EdgekitError):
    """The preview could not be started (a malformed address, a port in use)."""


def parse_address(address: str) -> tuple[str, int]:
    """``(host, port)`` from ``HOST:PORT``; an empty host is loopback, port 0 picks a free one."""
    text = address.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise PreviewError(
            f"the preview address {address!r} is not HOST:PORT",
            "e.g. --preview :8080 (this machine only) or --preview 0.0.0.0:8080 (every interface)",
        )
    port = int(port_text)
    if port > 65535:
        raise PreviewError(f"the preview port {port} is out of range", "use a port from 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise PreviewError(
                f"{host!r} in the preview address is not an IPv6 address", "e.g. --preview [::1]:8080"
            ) from None
    elif ":" in host:
        raise PreviewError(
            f"the preview address {address!r} has an IPv6 host without brackets",
            f"write it as [{host}]:{port}",
        )
    return host or DEFAULT_HOST, port


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
