"""The published JSON Schemas of edgekit's wire messages, generated from their pydantic models.

    python -m edgekit.protocol.schemas           write edgekit/protocol/schema/<kind>.schema.json
    python -m edgekit.protocol.schemas --check   exit 1 if a committed schema differs from its model

The models (``edgekit.protocol.messages``) are the definition; the files are for people and
tools outside Python.  A test runs the check, so CI fails while a schema is out of date.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from edgekit.protocol.messages import KINDS

SCHEMA_DIR = Path(__file__).with_name("schema")
DIALECT = "https://json-schema.org/draft/2020-12/schema"
# Not a URL anyone serves: a stable name tools use to tell these schemas apart.
ID_BASE = "https://edgekit.invalid/schema/v1/"


def schema_file(kind: str) -> Path:
    """Where the schema of ``kind`` (``telemetry``, ``cmd-result``, ...) is published."""
    return SCHEMA_DIR / f"{kind}.schema.json"


def generate(kind: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the messages of ``kind``, as its model validates them."""
    body = KINDS[kind].model_json_schema(by_alias=True, mode="validation")
    head = {"$schema": DIALECT, "$id": f"{ID_BASE}{kind}.schema.json"}
    return head | body


def render(kind: str) -> str:
    """The file's text: stable key order and indentation, so a diff shows what changed."""
    return json.dumps(generate(kind), indent=2, ensure_ascii=False) + "\n"


def stale() -> list[str]:
    """The kinds whose committed schema file is missing or differs from what the model generates."""
    out = []
    for kind in KINDS:
        path = schema_file(kind)
        if not path.is_file() or path.read_text(encoding="utf-8") != render(kind):
            out.append(kind)
    return out


def write() -> list[Path]:
    """Write every schema file; returns those whose text changed."""
    SCHEMA_DIR.mkdir(exist_ok=True)
    changed = []
    for kind in KINDS:
        path, text = schema_file(kind), render(kind)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m edgekit.protocol.schemas", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--check", action="store_true", help="only check that the files are current")
    args = parser.parse_args(argv)
    if args.check:
        out_of_date = stale()
        for kind in out_of_date:
            print(
                f"{schema_file(kind)} is out of date: run python -m edgekit.protocol.schemas", file=sys.stderr
            )
        return 1 if out_of_date else 0
    for path in write():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
