"""What every subcommand shares: the consoles, the ``--json`` option, JSON printing."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]


def print_json(data: Any) -> None:
    """Write ``data`` as one JSON document on stdout (and nothing else there)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
