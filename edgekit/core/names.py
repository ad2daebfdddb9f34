"""Names that travel as MQTT topic levels and file names: fleets and device ids."""

from __future__ import annotations

import re

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def safe_name(value: str) -> bool:
    """1-128 of ``A-Z a-z 0-9 . _ -``, starting with a letter or digit, no ``..``: no topic wildcards, no paths."""
    return bool(_NAME.fullmatch(value)) and ".." not in value
