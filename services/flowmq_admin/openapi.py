"""Renders the operation table as an OpenAPI 3.1 document (JSON Schema 2020-12 bodies)."""

from __future__ import annotations

from typing import Any

from flowmq_admin.operations import Operation
from flowmq_admin.schemas import ERROR_ENVELOPE, envelope

_REASONS = {
    200: "OK",
    201: "Created",
    400: "Malformed request (invalid JSON, missing parameter)",
    401: "Missing or invalid Bearer token",
    403: "Forbidden",
    404: "Not found",
    409: "Conflict (already exists, name collision, not empty)",
    413: "Request body too large",
    422: "Validation failed",
    503: "Unavailable: a matched destination cannot be served by this broker, durable "
    "storage is down, or durable writes lag (publish; then with Retry-After), "
    "or a readiness check failed (ready)",
}


def build_document(operations: list[Operation], version: str) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        responses: dict[str, Any] = {}
        success_schema = op.raw_response or envelope(op.response or {})
        responses[str(op.status)] = {
            "description": _REASONS.get(op.status, "OK"),
            "content": {"application/json": {"schema": success_schema}},
        }
        implied = ({401, 403} if op.auth else set()) | (
            {400, 422} if op.params or op.body else set()
        )
        for status in sorted(set(op.errors) | implied):
            responses[str(status)] = {
                "description": _REASONS[status],
                "content": {"application/json": {"schema": ERROR_ENVELOPE}},
            }
        entry: dict[str, Any] = {
            "operationId": op.operation_id,
            "summary": op.summary,
            "tags": [op.tag],
            "responses": responses,
        }
        if op.params:
            entry["parameters"] = [
                {
                    "name": p.name,
                    "in": p.location,
                    "required": p.required or p.location == "path",
                    "schema": p.schema,
                    **({"description": p.description} if p.description else {}),
                }
                for p in op.params
            ]
        if op.body is not None:
            entry["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": op.body}},
            }
        if not op.auth:
            entry["security"] = []
        paths.setdefault(op.path, {})[op.method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "FlowMQ-py admin API",
            "version": version,
            "description": "Namespaces, Streams, Queues, Users, Subscriptions, routing, HTTP "
            "publish, health and readiness, stream and queue reads, consumer groups, clients. "
            "Every answer is the envelope {success, data, error}.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }
