"""How a request ends, and how each protocol says so: one table for HTTP statuses and gRPC codes.

Every refusal is a ``ProtocolError`` carrying its ``Outcome``; the HTTP server answers the
Open Inference Protocol's error object ``{"error": "..."}`` with the outcome's status, the
gRPC server aborts with its code and the same message.  ``/metrics`` counts requests by
outcome name.
"""

from __future__ import annotations

import enum


class Outcome(enum.Enum):
    """A request's end: (HTTP status, gRPC status code name)."""

    OK = (200, "OK")
    INVALID = (400, "INVALID_ARGUMENT")  # a bad tensor, shape, datatype, name or parameter
    UNAUTHENTICATED = (401, "UNAUTHENTICATED")
    NOT_FOUND = (404, "NOT_FOUND")  # no such model or version
    TOO_LARGE = (413, "RESOURCE_EXHAUSTED")  # over a request size, element or pixel cap
    BUSY = (429, "RESOURCE_EXHAUSTED")  # the queue is full: try again later
    FAILED = (500, "INTERNAL")  # the runtime failed on an input that passed every check
    UNAVAILABLE = (503, "UNAVAILABLE")  # stopping
    DEADLINE = (504, "DEADLINE_EXCEEDED")  # waited past its deadline: not computed

    @property
    def http_status(self) -> int:
        return self.value[0]

    @property
    def grpc_code(self) -> str:
        return self.value[1]

    @property
    def label(self) -> str:
        return self.name.lower()


class ProtocolError(Exception):
    """A request the server refuses or could not answer, with the message the client gets."""

    def __init__(self, message: str, outcome: Outcome = Outcome.INVALID) -> None:
        super().__init__(message)
        self.message = message
        self.outcome = outcome
