"""Subcommands of ``edgekit``, one module per area; each module has ``register(app)``."""

from __future__ import annotations

import importlib

import typer

# Add a module here to add its commands to `edgekit`.
MODULES: tuple[str, ...] = (
    "edgekit.commands.build",
    "edgekit.commands.bundle",
    "edgekit.commands.run",
    "edgekit.commands.demo",
    "edgekit.commands.telemetry",
    "edgekit.commands.fleet",
    "edgekit.commands.agent",
    "edgekit.commands.deploy",
    "edgekit.commands.bench",
    "edgekit.commands.select",
    "edgekit.commands.eval",
    "edgekit.commands.serve",
)


def register_all(app: typer.Typer) -> None:
    """Add every area's commands to ``app`` (importing them imports no runtime)."""
    for name in MODULES:
        importlib.import_module(name).register(app)
