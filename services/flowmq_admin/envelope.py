"""The JSON envelope of every admin API answer and the mapping of errors to status codes."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from flowmq_core.errors import FlowMQError

# error code -> HTTP status; codes not listed are 422 (the request was understood but its
# content is not acceptable).
STATUS_BY_CODE = {
    "bad_request": 400,
    "invalid_json": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "already_exists": 409,
    "name_collision": 409,
    "not_empty": 409,
    "group_active": 409,
    "not_coordinator": 409,
    "payload_too_large": 413,
    "destination_unavailable": 503,
    "not_ready": 503,
    "store_unavailable": 503,
    "overloaded": 503,
}


def ok(data: Any, status: int = 200) -> web.Response:
    return web.json_response({"success": True, "data": data, "error": None}, status=status)


def error_response(
    code: str,
    message: str,
    details: Any = None,
    status: int | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body = {
        "success": False,
        "data": None,
        "error": {"code": code, "message": message, "details": details},
    }
    return web.Response(
        text=json.dumps(body),
        status=status or STATUS_BY_CODE.get(code, 422),
        content_type="application/json",
        headers=headers,
    )


def from_exception(exc: FlowMQError) -> web.Response:
    retry_after = getattr(exc, "retry_after", None)
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return error_response(exc.code, str(exc), getattr(exc, "details", None), headers=headers)


class ApiError(Exception):
    """Raised by handlers and validation for an error answer."""

    def __init__(self, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details
