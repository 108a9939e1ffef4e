"""ApiError: a request the OpenAI-compatible API refuses, and the error object it answers with.

Every refusal of the REST API is one of these, raised by api/protocol.py while it validates a body
or by api/server.py around it, and rendered in OpenAI's wire format:

    {"error": {"message": ..., "type": "invalid_request_error", "param": <field or null>, "code": null}}

with the HTTP status it carries (400 for a bad field, 401, 404 for an unknown model, 413, 5xx when
the engine, not the client, is at fault).
"""

from __future__ import annotations

from typing import Any

# OpenAI's error types by status class; clients match on them.
INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"
UNAVAILABLE = "service_unavailable_error"
TIMEOUT = "timeout_error"


class ApiError(Exception):
    """A refusal with its HTTP status and the request field (`param`) it is about, if any."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 error_type: str | None = None) -> None:
        super().__init__(message)
        if not 400 <= status <= 599:
            raise ValueError(f"ApiError status must be 4xx or 5xx, got {status}")
        self.status = status
        self.message = message
        self.param = param
        self.error_type = error_type or (INVALID_REQUEST if status < 500 else SERVER_ERROR)

    def to_dict(self) -> dict[str, Any]:
        return error_object(self.message, self.error_type, self.param)

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.message!r}, param={self.param!r})"


def error_object(message: str, error_type: str = INVALID_REQUEST, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": None}}


def invalid(param: str | None, message: str, status: int = 400) -> ApiError:
    """A 4xx about one request field; the message should name the field and what was wrong."""
    return ApiError(status, message, param, INVALID_REQUEST)
