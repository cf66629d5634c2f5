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


# apimachinery's NewGenericServerResponse: what an error answer that is no Status says, by code.
_GENERIC: dict[int, tuple[str, str]] = {
    400: ("BadRequest", "the server rejected our request for an unknown reason"),
    401: ("Unauthorized", "the server has asked for the client to provide credentials"),
    404: ("NotFound", "the server could not find the requested resource"),
    405: ("MethodNotAllowed", "the server does not allow this method on the requested resource"),
    409: ("Conflict", "the server reported a conflict"),
    422: ("Invalid", "the server rejected our request due to an error in our request"),
    429: ("TooManyRequests", "the server has received too many requests and has asked us to try again later"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: ("Timeout", "the server was unable to return a response in the time allotted, but may still be processing "
                     "the request"),
}
UNEXPECTED_SERVER_RESPONSE_CAUSE = "UnexpectedServerResponse"


def generic_server_response(code: int, verb: str, server_message: str) -> ApiError:
    """The error client-go makes of an error answer that is no Status (a proxy's page, a plain text):
    `server_message` is the answer's text when it is text/plain (or has no type), else "unknown"."""
    reason, message = _GENERIC.get(code, ("", f"the server responded with the status code {code} but did not "
                                              "return more information"))
    if code == 409 and verb == "POST":
        reason = "AlreadyExists"
    elif code in (403, 415) or (code == 406 and server_message not in ("", "unknown")):
        reason = {403: "Forbidden", 406: "NotAcceptable", 415: "UnsupportedMediaType"}[code]
        message = server_message  # who may do what, or which types are acceptable
    elif code == 406:
        reason = "NotAcceptable"
        message = "the server was unable to respond with a content type that the client supports"
    elif code >= 500 and code not in _GENERIC:
        reason, message = "InternalError", f"an error on the server ({_go_quote(server_message)}) has prevented the " \
                                           "request from succeeding"
    cause = {"reason": UNEXPECTED_SERVER_RESPONSE_CAUSE, "message": server_message}
    status = {"kind": "Status", "status": "Failure", "code": code, "reason": reason or "Unknown", "message": message,
              "details": {"causes": [cause]}}
    return error_from_status(code, status)


def _go_quote(text: str) -> str:
    """Go's %q for the common case: double quotes, backslashes and control characters escaped."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


def is_already_exists(err: BaseException) -> bool:
    return isinstance(err, AlreadyExists)


def has_status_cause(err: BaseException, cause_type: str) -> bool:
    return isinstance(err, ApiError) and err.has_cause(cause_type)


NAMESPACE_TERMINATING_CAUSE = "NamespaceTerminating"


class TransportError(Exception):
    """No answer to use: the API server could not be reached, the connection broke (no HTTP status),
    or a success answer could not be decoded (client-go's "serializer for ... doesn't exist")."""

    def __init__(self, message: str, connection_reset: bool = False, ended: bool = False) -> None:
        super().__init__(message)
        self.connection_reset = connection_reset  # the peer reset it (ECONNRESET): worth another try to some callers
        # The connection closed, was reset or timed out (Go's IsProbableEOF or IsTimeout), rather than
        # carrying bytes that were no HTTP: a watch stream ending so is no error to client-go.
        self.ended = ended
