"""API errors shared by every Cluster implementation, shaped like the API server's Status responses.

Controllers branch on them (retry a Conflict, ignore a NotFound on delete), so the in-memory store and the lightkube
adapter raise the same classes with the same codes and reasons.
"""

from __future__ import annotations

from kubegpu.errors import KubegpuError


class ApiError(KubegpuError):
    """An API call failed; ``code`` is the HTTP status, ``reason`` the Status reason (``NotFound``, ``Conflict``...)."""

    default_code = 500
    default_reason = "InternalError"

    def __init__(self, message: str, code: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = self.default_code if code is None else code
        self.reason = self.default_reason if reason is None else reason


class NotFound(ApiError):
    default_code = 404
    default_reason = "NotFound"


class Conflict(ApiError):
    """409: a stale resourceVersion, or (reason ``AlreadyExists``) a create of a name that exists."""

    default_code = 409
    default_reason = "Conflict"


class Invalid(ApiError):
    default_code = 422
    default_reason = "Invalid"


class Gone(ApiError):
    """410: a watch asked to start from a resourceVersion older than the server still remembers; re-list."""

    default_code = 410
    default_reason = "Expired"


class BadRequest(ApiError):
    default_code = 400
    default_reason = "BadRequest"


def error_for(code: int, message: str, reason: str | None = None) -> ApiError:
    """The ApiError subclass for an HTTP status code, so adapters map server answers one way."""
    classes: dict[int, type[ApiError]] = {404: NotFound, 409: Conflict, 422: Invalid, 410: Gone, 400: BadRequest}
    return classes.get(code, ApiError)(message, code=code, reason=reason)
