"""The error object of every JSON error response (llama.cpp's `format_error_response`).

`{"error": {"code": 400, "message": "...", "type": "invalid_request_error"}}`, with the HTTP status equal to
`code`. Handlers raise `ApiError`; the app's exception handlers turn it (and anything else) into this shape.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ERROR_TYPES", "ApiError", "error_body"]

ERROR_TYPES: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "server_error": 500,
    "not_supported_error": 501,
    "unavailable_error": 503,
    "exceed_context_size_error": 400,
}


class ApiError(Exception):
    """An error answered as the reference's JSON error object; `extra` keys are added to it."""

    def __init__(
        self,
        message: str,
        type: str = "invalid_request_error",
        code: int | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.type = type
        self.code = code if code is not None else ERROR_TYPES.get(type, 500)
        self.headers = headers or {}
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return error_body(self.code, self.message, self.type, **self.extra)


def error_body(code: int, message: str, type: str, **extra: Any) -> dict[str, Any]:
    """The error object, keys in the reference's order."""
    return {"error": {"code": code, "message": message, "type": type, **extra}}
