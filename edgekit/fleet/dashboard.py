"""The fleet dashboard's web app (FastAPI): the page, its JSON, live updates by SSE, and ``/metrics``.

Everything the page needs is served from the package (``static/``, uPlot vendored): a
dashboard on a site without internet still draws.  Snapshots are built once per tick and
shared by every client; the SSE stream sends one only when something changed (and a
comment line every few seconds so proxies keep the connection open).  At most ``max_sse``
streams are open at once (then 503): each holds a connection and a snapshot's worth of work.

Who may ask is ``edgekit.fleet.access``: the ``Host`` must be one the server answers to, and
with a ``token`` every request but ``/healthz`` must carry it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

# FastAPI reads the route signatures' annotations at run time: these names must be module globals.
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import Scope

from edgekit.core.names import safe_name
from edgekit.fleet.access import LOOPBACK_NAMES, access_middleware
from edgekit.fleet.view import FleetView
from edgekit.protocol.event_messages import EVENT_ID_PATTERN
from edgekit.protocol.messages import EVENT_KINDS
from edgekit.protocol.proof_messages import PROOF_MEDIA

if TYPE_CHECKING:
    from edgekit.fleet.board import FleetBoard
    from edgekit.fleet.proofs import ProofFetcher
    from edgekit.protocol.control_messages import ProofFile

log = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")
KEEPALIVE_S = 5.0
MAX_SSE = 64


class _CountedStream(StreamingResponse):
    """A stream that calls ``release`` when it ends however it ends (sent, client gone, cancelled)."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None], **kw: Any) -> None:
        super().__init__(content, **kw)
        self._release = release

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


try:
    import orjson

    def _dumps(data: Any) -> bytes:
        return orjson.dumps(data)

except ImportError:  # orjson is in the fleet extra; plain json is slower, not wrong

    def _dumps(data: Any) -> bytes:
        return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


class _StaticFiles(StaticFiles):
    """``static/`` with ``.js`` always served as JavaScript.

    The dashboard is ES modules, and a browser runs a module script only with a JavaScript MIME
    type; StaticFiles takes the type from the host's MIME table (``/etc/mime.types``, the Windows
    registry), which may say ``text/plain``.
    """

    def file_response(
        self,
        full_path: os.PathLike[str] | str,
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        if os.fspath(full_path).endswith(".js") and "content-type" in response.headers:  # not on a 304
            response.headers["content-type"] = "text/javascript; charset=utf-8"
        return response


class Ticker:
    """Calls ``view.tick()`` every ``period_s`` and ``housekeeping()`` every ``housekeeping_s``, on a thread."""

    def __init__(
        self,
        view: FleetView,
        period_s: float = 1.0,
        housekeeping: Callable[[], None] | None = None,
        housekeeping_s: float = 300.0,
        each_tick: Callable[[], object] | None = None,
    ) -> None:
        self.view = view
        self.each_tick = each_tick
        self.period_s = period_s
        self.housekeeping = housekeeping
        self.housekeeping_s = housekeeping_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edgekit-fleet-tick", daemon=True)

    def start(self) -> Ticker:
        self._thread.start()
        return self

    def _run(self) -> None:
        last_housekeeping = time.monotonic()
        while not self._stop.wait(self.period_s):
            try:
                if self.each_tick is not None:
                    self.each_tick()
                self.view.tick()
                if self.housekeeping and time.monotonic() - last_housekeeping >= self.housekeeping_s:
                    last_housekeeping = time.monotonic()
                    self.housekeeping()
            except Exception:  # the dashboard must outlive one bad tick
                log.exception("fleet: tick failed")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def create_app(
    view: FleetView,
    ticker: Ticker | None = None,
    static_dir: Path = STATIC,
    artifacts: Path | None = None,
    *,
    token: str | None = None,
    allowed_hosts: list[str] | None = None,
    max_sse: int = MAX_SSE,
    metrics_max_series: int | None = None,
    proofs: ProofFetcher | None = None,
    board: FleetBoard | None = None,
) -> Any:
    """The ASGI app for ``view``; with ``ticker`` it is started and stopped with the app.

    With ``artifacts`` (a folder of bundle archives) it also serves ``/artifacts/<name>`` for fleet deploys.
    With ``token`` every request but ``/healthz`` needs it; only ``allowed_hosts`` (default: loopback's
    names) are answered; at most ``max_sse`` event streams are open at once; ``/metrics`` has at most
    ``metrics_max_series`` device samples (``edgekit.fleet.prometheus.MAX_SERIES`` by default).
    With ``proofs`` a device's events say which have proof, and
    ``/api/device/<fleet>/<device>/events/<id>/{snapshot.jpg,clip.avi}`` fetch it from the device.
    With ``board`` the large-fleet API answers from the store under ``/api/v2/`` (``edgekit.fleet.board``)
    and ``/board`` is its page.
    """
    from edgekit.fleet import prometheus

    max_series = prometheus.MAX_SERIES if metrics_max_series is None else metrics_max_series

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        if ticker is not None:
            ticker.start()
        try:
            yield
        finally:
            if ticker is not None:
                ticker.stop()

    app = FastAPI(
        title="edgekit fleet",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        middleware=access_middleware(token, allowed_hosts or list(LOOPBACK_NAMES)),
    )
    streams = [0]  # open SSE streams (one event loop: no lock needed)

    def release() -> None:
        streams[0] -= 1

    app.mount("/static", _StaticFiles(directory=static_dir), name="static")
    if artifacts is not None:
        from edgekit.fleet.artifacts import artifacts_app

        app.mount("/artifacts", artifacts_app(artifacts), name="artifacts")

    def json_response(data: Any) -> Response:
        return Response(_dumps(data), media_type="application/json")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(static_dir / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/healthz")
    def healthz() -> Response:
        return json_response({"ok": True, "version": view.version})

    @app.get("/api/fleet")
    async def fleet(window: int = Query(300, ge=1, le=30 * 86400)) -> Response:
        return json_response(await asyncio.to_thread(view.snapshot, window))

    @app.get("/api/device/{fleet}/{device}")
    async def device(fleet: str, device: str, window: int = Query(300, ge=1, le=30 * 86400)) -> Response:
        if not (safe_name(fleet) and safe_name(device)):
            raise HTTPException(400, "fleet and device are names of A-Z a-z 0-9 . _ - (no '..')")
        page = await asyncio.to_thread(view.device_page, fleet, device, window)
        if page is None:
            raise HTTPException(404, f"no device {fleet}/{device} has reported to this collector")
        if proofs is not None:
            proofs.annotate(fleet, device, page.get("events") or [])
        return json_response(page)

    def checked_names(fleet: str, device: str, camera: str | None = None) -> None:
        if not (safe_name(fleet) and safe_name(device)) or (camera is not None and not safe_name(camera)):
            raise HTTPException(400, "fleet, device and camera are names of A-Z a-z 0-9 . _ - (no '..')")

    @app.get("/api/device/{fleet}/{device}/events")
    async def device_events(
        fleet: str,
        device: str,
        camera: str | None = None,
        kind: Annotated[list[str] | None, Query()] = None,
        limit: int = Query(100, ge=1, le=1000),
    ) -> Response:
        checked_names(fleet, device, camera)
        if kind and not set(kind) <= set(EVENT_KINDS):
            raise HTTPException(400, f"kind is one of {', '.join(EVENT_KINDS)}")
        page = await asyncio.to_thread(view.device_events, fleet, device, camera, kind, limit)
        if proofs is not None:
            proofs.annotate(fleet, device, page["events"])
        return json_response(page)

    async def proof(fleet: str, device: str, event_id: str, file: ProofFile) -> Response:
        checked_names(fleet, device)
        if not re.fullmatch(EVENT_ID_PATTERN, event_id):
            raise HTTPException(400, "an event id is a lower-case UUID")
        if proofs is None:
            raise HTTPException(404, "this server fetches no event proof")
        from edgekit.fleet.proofs import ProofUnavailable

        try:
            data = await asyncio.to_thread(proofs.fetch, fleet, device, event_id, file)
        except ProofUnavailable as err:
            return Response(err.message + "\n", status_code=err.status, media_type="text/plain")
        suffix = ".jpg" if file == "snapshot" else ".avi"
        headers = {
            # A proof never changes: the page, redrawn every few seconds, asks for it once.
            "Cache-Control": "private, max-age=86400, immutable",
            "Content-Disposition": f'inline; filename="{event_id}{suffix}"',
            "X-Content-Type-Options": "nosniff",
        }
        return Response(data, media_type=PROOF_MEDIA[file], headers=headers)

    @app.get("/api/device/{fleet}/{device}/events/{event_id}/snapshot.jpg")
    async def snapshot(fleet: str, device: str, event_id: str) -> Response:
        return await proof(fleet, device, event_id, "snapshot")

    @app.get("/api/device/{fleet}/{device}/events/{event_id}/clip.avi")
    async def clip(fleet: str, device: str, event_id: str) -> Response:
        return await proof(fleet, device, event_id, "clip")

    @app.get("/api/device/{fleet}/{device}/zones")
    async def zone_counts(
        fleet: str, device: str, camera: str | None = None, window: int = Query(3600, ge=1, le=30 * 86400)
    ) -> Response:
        checked_names(fleet, device, camera)
        return json_response(await asyncio.to_thread(view.zone_counts, fleet, device, window, camera))

    @app.get("/api/events")
    async def events(request: Request, window: int = Query(300, ge=1, le=30 * 86400)) -> Response:
        if streams[0] >= max_sse:
            return Response(
                f"503: {max_sse} live streams are open, the most this server keeps\n",
                status_code=503,
                headers={"Retry-After": "10"},
                media_type="text/plain",
            )
        streams[0] += 1

        async def stream() -> AsyncIterator[bytes]:
            sent_version, sent_at = -1, 0.0
            yield b"retry: 2000\n\n"
            while not await request.is_disconnected():
                if view.version != sent_version:
                    sent_version = view.version
                    snap = await asyncio.to_thread(view.snapshot, window)
                    yield b"event: snapshot\ndata: " + _dumps(snap) + b"\n\n"
                    sent_at = time.monotonic()
                elif time.monotonic() - sent_at >= KEEPALIVE_S:
                    yield b": keep-alive\n\n"
                    sent_at = time.monotonic()
                await asyncio.sleep(0.25)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return _CountedStream(stream(), release, media_type="text/event-stream", headers=headers)

    if board is not None:
        _board_routes(app, board, static_dir, json_response)

    @app.get("/metrics")
    async def metrics() -> Response:
        text = await asyncio.to_thread(
            lambda: prometheus.render(view.prometheus_state(), view.collector_stats(), max_series)
        )
        return Response(text, media_type=prometheus.CONTENT_TYPE)

    return app


def _board_routes(
    app: FastAPI, board: FleetBoard, static_dir: Path, json_response: Callable[[Any], Response]
) -> None:
    """``/board`` and ``/api/v2/``: the large-fleet page and API, every answer read from the store."""
    from edgekit.fleet.board import FILTERS, RANGES, SORTS

    @app.get("/board", include_in_schema=False)
    def board_page() -> FileResponse:
        return FileResponse(static_dir / "board.html", headers={"Cache-Control": "no-cache"})

    @app.get("/api/v2/devices")
    async def devices(request: Request) -> Response:
        params = request.query_params
        unknown = set(params) - {"fleet", "state", "q", "sort", "limit", "offset", "token", *FILTERS}
        if unknown:
            raise HTTPException(400, f"unknown parameter {', '.join(sorted(unknown))}")
        sort = params.get("sort", "worst")
        if sort not in SORTS:
            raise HTTPException(400, f"sort is one of {', '.join(SORTS)}")
        try:
            limit, offset = int(params.get("limit", "50")), int(params.get("offset", "0"))
        except ValueError:
            raise HTTPException(400, "limit and offset are whole numbers") from None
        if not (1 <= limit <= 500 and offset >= 0):
            raise HTTPException(400, "limit is 1..500 and offset 0 or more")
        page = await asyncio.to_thread(
            board.devices,
            fleet=params.get("fleet"),
            state=params.get("state"),
            q=params.get("q"),
            sort=sort,
            limit=limit,
            offset=offset,
            **{k: params[k] for k in FILTERS if k in params},
        )
        return json_response(page)

    @app.get("/api/v2/device/{fleet}/{device}")
    async def device(fleet: str, device: str, range: str = "1h") -> Response:
        if not (safe_name(fleet) and safe_name(device)):
            raise HTTPException(400, "fleet and device are names of A-Z a-z 0-9 . _ - (no '..')")
        if range not in RANGES:
            raise HTTPException(400, f"range is one of {', '.join(RANGES)}")
        page = await asyncio.to_thread(board.device, fleet, device, range)
        if page is None:
            raise HTTPException(404, f"no device {fleet}/{device} in the store")
        return json_response(page)

    @app.get("/api/v2/summary")
    async def summary(
        fleet: str | None = None, since: float | None = None, until: float | None = None
    ) -> Response:
        return json_response(await asyncio.to_thread(board.summary, fleet, since, until))

    @app.get("/api/v2/groups")
    async def groups(by: str = "site", fleet: str | None = None) -> Response:
        if by not in FILTERS:
            raise HTTPException(400, f"by is one of {', '.join(FILTERS)}")
        return json_response({"by": by, "groups": await asyncio.to_thread(board.groups, by, fleet)})

    @app.get("/api/v2/alerts")
    async def alerts(fleet: str | None = None) -> Response:
        return json_response({"alerts": await asyncio.to_thread(board.alerts, fleet)})
