"""The base of every manifest schema: strict, frozen, and no field it does not know."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Schema(BaseModel):
    """``extra="forbid"`` and strict, so a typo or a wrong type in a hand-edited or forged
    manifest is an error that names the field instead of being ignored or coerced; frozen,
    so a manifest read is the manifest hashed."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
