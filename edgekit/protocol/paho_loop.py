"""``PahoLoop``: many paho clients driven from one thread, on one epoll selector.

paho's ``loop_start`` gives each client a thread and a wake-up socket pair; at thousands of
clients (the fleet simulators, ``edgekit.telemetry.simulate_fleet`` and ``edgekit.deploy.sim_agents``)
that, not the broker, is the limit.  Without its thread paho says through its socket callbacks
when a client's socket opens, closes, and has bytes waiting to go: ``attach`` hands those to this
loop, which keeps the selector in step; ``step`` reads and writes what is ready.
"""

from __future__ import annotations

import contextlib
import selectors
from typing import Any


class PahoLoop:
    """The selector of many paho clients; a client's socket is watched from its open to its close."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self._socks: dict[Any, Any] = {}  # client -> the socket being watched for it

    def attach(self, client: Any) -> None:
        """Before ``client.connect``: its sockets are this loop's to watch."""
        client.on_socket_open = self._opened
        client.on_socket_close = self._closed
        client.on_socket_register_write = self._want_write
        client.on_socket_unregister_write = self._wrote

    def forget(self, client: Any) -> Any:
        """Stop watching ``client``'s socket; returns it (to close without a word), or ``None``."""
        sock = self._socks.pop(client, None)
        if sock is not None:
            with contextlib.suppress(KeyError, ValueError):  # already closed, and so gone from epoll
                self.sel.unregister(sock)
        return sock

    def step(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds; each ready client reads and writes what it can."""
        for key, mask in self.sel.select(timeout):
            client = key.data
            if mask & selectors.EVENT_READ:
                client.loop_read()
            if mask & selectors.EVENT_WRITE:
                client.loop_write()

    def watching(self) -> int:
        """How many sockets are open (a disconnect closes its client's)."""
        return len(self._socks)

    # paho's socket callbacks (client, userdata, sock); a forgotten client's late calls change nothing.

    def _opened(self, client: Any, userdata: Any, sock: Any) -> None:
        self.forget(client)
        self._socks[client] = sock
        self.sel.register(sock, selectors.EVENT_READ, client)

    def _closed(self, client: Any, userdata: Any, sock: Any) -> None:
        if self._socks.get(client) is sock:
            self.forget(client)

    def _want_write(self, client: Any, userdata: Any, sock: Any) -> None:
        self._watch(client, sock, selectors.EVENT_READ | selectors.EVENT_WRITE)

    def _wrote(self, client: Any, userdata: Any, sock: Any) -> None:
        self._watch(client, sock, selectors.EVENT_READ)

    def _watch(self, client: Any, sock: Any, events: int) -> None:
        watched = self._socks.get(client)
        if watched is not None and watched is sock:
            self.sel.modify(watched, events, client)
