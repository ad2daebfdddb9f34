"""What every subcommand shares: the consoles, the ``--json`` option, JSON printing."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)
# Piped or redirected, stderr is read by programs and by people grepping logs: an error, a hint or
# a path is never hard-wrapped at rich's 80 columns there.  On a terminal rich wraps to its width.
err_console.soft_wrap = not err_console.is_terminal

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]
# How a command reaches an MQTT broker over TLS: the same options wherever one does (run, agent, fleet, tail).
MqttCaOpt = Annotated[Path | None, typer.Option("--mqtt-ca", help="CA certificate (PEM) of the broker.")]
MqttCertOpt = Annotated[Path | None, typer.Option("--mqtt-cert", help="Client certificate (PEM).")]
MqttKeyOpt = Annotated[Path | None, typer.Option("--mqtt-key", help="Client key (PEM).")]
MqttProtocolOpt = Annotated[str, typer.Option("--mqtt-protocol", help="3.1.1 or 5.")]


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout — by Python or by a runtime's C++ — to stderr.

    Converters (NNCF, TVM, LiteRT) print progress on stdout; with ``--json`` stdout must
    hold the JSON document and nothing else.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def print_json(data: Any) -> None:
    """Write ``data`` as one JSON document on stdout (and nothing else there)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
