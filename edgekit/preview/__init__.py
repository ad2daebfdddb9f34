"""See what the model sees: ``edgekit run … --preview :8080`` serves the frames with their boxes.

``start_preview(pipeline, ":8080")`` attaches a :class:`PreviewServer` to a pipeline: the
frame loop hands it each result (a reference swap), and a thread of its own draws the
boxes and encodes JPEGs, only while someone watches.  It stops with the pipeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgekit.pipeline.sinks import sink
from edgekit.preview.address import PreviewError, parse_address
from edgekit.preview.feed import PreviewFeed
from edgekit.preview.server import PreviewServer

if TYPE_CHECKING:
    from edgekit.pipeline import Pipeline


def start_preview(pipeline: Pipeline, address: str) -> PreviewServer:
    """Serve ``pipeline``'s frames at ``address`` (``HOST:PORT``; ``:PORT`` is this machine only)."""
    host, port = parse_address(address)
    manifest = pipeline.model.manifest
    server = PreviewServer(host, port, model=manifest.model.name, task=manifest.model.task)
    # Inline: the feed is already a one-frame slot (newest wins) read by the server's own thread.
    pipeline.add_sink(sink("preview", server.offer, close=server.close))
    return server.start()


__all__ = ["PreviewError", "PreviewFeed", "PreviewServer", "parse_address", "start_preview"]
