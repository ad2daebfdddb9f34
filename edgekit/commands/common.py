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

#: The width of a console that is not a terminal: rich would fit tables to 80 columns and cut
#: their cells ("17…" for 170 ms); a file or a pipe has no width to fit, so nothing is cut.
PIPE_WIDTH = 1000


def _console(stderr: bool = False) -> Console:
    """A console for stdout or stderr: a terminal's width on a terminal, else ``$COLUMNS`` or ``PIPE_WIDTH``."""
    made = Console(stderr=stderr)
    if not made.is_terminal and not os.environ.get("COLUMNS"):
        made.width = PIPE_WIDTH
    return made


console = _console()
err_console = _console(stderr=True)
# Piped or redirected, stderr is read by programs and by people grepping logs: an error, a hint or
# a path is never hard-wrapped there.  On a terminal rich wraps to its width.
err_console.soft_wrap = not err_console.is_terminal

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]
# How a command reaches an MQTT broker over TLS: the same options wherever one does (run, agent, fleet, tail).
MqttCaOpt = Annotated[Path | None, typer.Option("--mqtt-ca", help="CA certificate (PEM) of the broker.")]
MqttCertOpt = Annotated[Path | None, typer.Option("--mqtt-cert", help="Client certificate (PEM).")]
MqttKeyOpt = Annotated[Path | None, typer.Option("--mqtt-key", help="Client key (PEM).")]
MqttProtocolOpt = Annotated[str, typer.Option("--mqtt-protocol", help="3.1.1 or 5.")]
# A pipeline's telemetry (edgekit run, and the cameras beside edgekit serve).
FleetOpt = Annotated[str, typer.Option("--fleet", help="Fleet name in the telemetry topics.")]
TelemetryIntervalOpt = Annotated[
    float, typer.Option("--telemetry-interval", help="Seconds between telemetry messages.")
]
SpoolOpt = Annotated[
    Path | None, typer.Option("--spool", help="SQLite file holding telemetry until the broker has it.")
]


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
