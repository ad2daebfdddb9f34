"""``open_store``: the fleet store a ``--db`` value names, SQLite for a path, PostgreSQL for a URL.

Kept apart from both stores so that neither imports the other: ``pgstore`` builds on
``store``, and only this module knows them both.
"""

from __future__ import annotations

from pathlib import Path

from edgekit.fleet.sql import StoreError
from edgekit.fleet.store import FleetStore


def open_store(url_or_path: Path | str) -> FleetStore:
    """A ``postgresql://`` (or ``postgres://``) URL opens a ``PostgresStore``; anything else is a SQLite path."""
    target = str(url_or_path)
    if target.startswith(("postgresql://", "postgres://")):
        try:
            # Imported here: psycopg is in the fleet extra, and a SQLite fleet runs without it.
            from edgekit.fleet.pgstore import PostgresStore
        except ModuleNotFoundError as err:
            if not (err.name or "").startswith("psycopg"):
                raise
            raise StoreError(
                f"a PostgreSQL fleet database needs psycopg ({err})", 'pip install "edgekit[fleet]"'
            ) from err
        return PostgresStore(target)
    return FleetStore(target)
