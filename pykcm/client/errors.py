"""API errors as typed exceptions, modelled on k8s.io/apimachinery/pkg/api/errors."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A failed API call: HTTP code, the Status reason, message and causes."""

    def __init__(self, code: int, reason: str = "", message: str = "", status: dict[str, Any] | None = None):
        self.code = code
        self.reason = reason
        self.message = message or reason or f"HTTP {code}"
        self.status = status or {}
        self.details: dict[str, Any] = self.status.get("details") or {}
        self.causes: list[dict[str, Any]] = self.details.get("causes") or []
        super().__init__(self.message)

    def has_cause(self, cause_type: str) -> bool:
        # metav1.StatusCause serialises its Type field under the JSON key "reason".
        return any(c.get("reason") == cause_type for c in self.causes)


class BadRequest(ApiError): ...
class Unauthorized(ApiError): ...
class Forbidden(ApiError): ...
class NotFound(ApiError): ...
class MethodNotSupported(ApiError): ...
class NotAcceptable(ApiError): ...
class AlreadyExists(ApiError): ...
class Conflict(ApiError): ...
class Gone(ApiError):
    """410: the requested resourceVersion or continue token is too old (reason Expired or Gone)."""
class Invalid(ApiError): ...
class TooManyRequests(ApiError): ...
class InternalError(ApiError): ...
class ServiceUnavailable(ApiError): ...
class Timeout(ApiError): ...


# Status.reason decides first (409 can be AlreadyExists or Conflict); the code is the fallback.
_BY_REASON: dict[str, type[ApiError]] = {
    "BadRequest": BadRequest,
    "Unauthorized": Unauthorized,
    "Forbidden": Forbidden,
    "NotFound": NotFound,
    "MethodNotAllowed": MethodNotSupported,
    "NotAcceptable": NotAcceptable,
    "AlreadyExists": AlreadyExists,
    "Conflict": Conflict,
    "Gone": Gone,
    "Expired": Gone,
    "Invalid": Invalid,
    "TooManyRequests": TooManyRequests,
    "InternalError": InternalError,
    "ServiceUnavailable": ServiceUnavailable,
    "Timeout": Timeout,
    "ServerTimeout": Timeout,
}
_BY_CODE: dict[int, type[ApiError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 405: MethodNotSupported,
    406: NotAcceptable, 409: Conflict, 410: Gone, 422: Invalid, 429: TooManyRequests,
    500: InternalError, 503: ServiceUnavailable, 504: Timeout,
}


def error_from_status(code: int, status: dict[str, Any] | None) -> ApiError:
    status = status if isinstance(status, dict) and status.get("kind") == "Status" else {}
    reason = status.get("reason", "")
    cls = _BY_REASON.get(reason) or _BY_CODE.get(code, ApiError)
    return cls(code, reason, status.get("message", ""), status)


def is_already_exists(err: BaseException) -> bool:
    return isinstance(err, AlreadyExists)


def has_status_cause(err: BaseException, cause_type: str) -> bool:
    return isinstance(err, ApiError) and err.has_cause(cause_type)


NAMESPACE_TERMINATING_CAUSE = "NamespaceTerminating"


class TransportError(Exception):
    """The API server could not be reached or the connection broke (no HTTP status)."""
