"""The tests' PostgreSQL (``edgekit.testing.postgres``), skipping the test where the host has none."""

from __future__ import annotations

import pytest

from edgekit.testing.postgres import PASSWORD, USER, PostgresMissing
from edgekit.testing.postgres import PostgresServer as _Server

__all__ = ["PASSWORD", "USER", "PostgresServer"]


class PostgresServer(_Server):
    def __init__(self, settings: dict[str, str] | None = None) -> None:
        try:
            super().__init__(settings)
        except PostgresMissing as err:
            pytest.skip(f"{err.message} ({err.hint})")
