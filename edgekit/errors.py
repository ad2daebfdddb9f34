"""One error root for everything edgekit raises on purpose.

Every error carries what went wrong (``message``) and what to do about it (``hint``).
The CLI prints both without a traceback; ``--debug`` shows the traceback too.
Errors are raised at one boundary (where a runtime call is made), not caught,
logged and re-raised in every layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TypeVar

_T = TypeVar("_T")


def first_line(err: BaseException) -> str:
    """The line of a runtime's error message that says what went wrong (not where in its C++ source)."""
    lines = [
        ln.strip() for ln in str(err).splitlines() if ln.strip() and not ln.startswith("Exception from src")
    ]
    return lines[0][:300] if lines else type(err).__name__


_from_cli = False


@contextlib.contextmanager
def command_line_hints() -> Iterator[None]:
    """While it is open, ``spelled`` names settings as the ``edgekit`` command's options (the CLI opens it)."""
    global _from_cli
    before, _from_cli = _from_cli, True
    try:
        yield
    finally:
        _from_cli = before


def spelled(cli: _T, python: _T) -> _T:
    """A setting named the way the user gave it: ``cli`` (``--key KEY.pub.pem``) while the ``edgekit``
    command runs, else ``python`` (``trusted_keys=...``), for a program that called the API.

    A process-wide flag, not a context variable: the command's worker threads speak its language too.
    """
    return cli if _from_cli else python


class EdgekitError(Exception):
    """Base class: a message saying what was wrong and where, and a hint saying what to do."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


class ProfileError(EdgekitError):
    """A device profile is unknown, malformed, or names something that does not exist."""


class DetectionError(EdgekitError):
    """The host could not be read or matched to a profile."""


class BackendError(EdgekitError):
    """A backend could not be imported, registered or loaded."""


class ModelLoadError(BackendError):
    """A runtime refused a model artifact (corrupt file, wrong architecture, missing delegate)."""


class InputError(EdgekitError):
    """An input given to a session does not match what the model expects."""


class RunError(EdgekitError):
    """A runtime failed while running a model."""


class SourceError(EdgekitError):
    """A frame source could not be opened or read (no such camera, unreadable file, no GStreamer)."""


class PipelineError(EdgekitError):
    """The frame pipeline was misconfigured (unknown policy, bad budget, nothing to stop it)."""


class BuildError(EdgekitError):
    """Converting, compiling or quantizing a model failed."""


class DeployError(EdgekitError):
    """Shipping or activating a bundle on a device failed."""


class TelemetryError(EdgekitError):
    """Reporting measurements failed in a way the user must fix (bad URL, bad credentials)."""


class NoUsableBackendError(EdgekitError):
    """Every candidate backend failed; ``causes`` holds one ``(candidate, reason)`` per attempt."""

    def __init__(self, message: str, causes: Sequence[tuple[str, str]], hint: str = "") -> None:
        lines = [message] + [f"  - {who}: {why}" for who, why in causes]
        super().__init__("\n".join(lines), hint)
        self.causes = tuple(causes)


class BundleError(EdgekitError):
    """A bundle cannot be written, read or packed (missing file, bad manifest, bad destination)."""


class KeyFileError(BundleError):
    """A signing or verification key file is missing, garbled, or the wrong kind of key."""


class UnsafeArchiveError(BundleError):
    """A bundle archive holds a member that could write outside its folder, or is too big."""


class VerificationError(BundleError):
    """A bundle failed verification: a file's hash, a missing or extra file, or its signature."""
