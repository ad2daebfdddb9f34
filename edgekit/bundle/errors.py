"""What the bundle code raises: one subclass of ``EdgekitError`` per kind of problem."""

from __future__ import annotations

from edgekit.errors import EdgekitError


class BundleError(EdgekitError):
    """A bundle cannot be written, read or packed (missing file, bad manifest, bad destination)."""


class KeyFileError(BundleError):
    """A signing or verification key file is missing, garbled, or the wrong kind of key."""


class UnsafeArchiveError(BundleError):
    """A bundle archive holds a member that could write outside its folder, or is too big."""


class VerificationError(BundleError):
    """A bundle failed verification: a file's hash, a missing or extra file, or its signature."""
