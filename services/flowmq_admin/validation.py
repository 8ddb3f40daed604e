"""Request validation against the JSON Schemas, with messages that name the field."""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from flowmq_admin.envelope import ApiError
from flowmq_admin.schemas import Schema

_UNEXPECTED = re.compile(r"\('(.+)' (?:was|were) unexpected\)")


# id(schema) -> (schema, its validator).  The schemas are module constants built once, so a
# lookup by identity is enough; keeping the schema in the entry keeps its id from being reused.
_VALIDATORS: dict[int, tuple[Schema, Draft202012Validator]] = {}


def _validator(schema: Schema) -> Draft202012Validator:
    entry = _VALIDATORS.get(id(schema))
    if entry is None or entry[0] is not schema:
        entry = _VALIDATORS[id(schema)] = (schema, Draft202012Validator(schema))
    return entry[1]


def _describe(error: ValidationError) -> tuple[str, str]:
    field = ".".join(str(part) for part in error.absolute_path) or "body"
    if error.validator == "additionalProperties":
        unexpected = _UNEXPECTED.search(error.message)
        names = unexpected.group(1) if unexpected else error.message
        return (
            field,
            f"unknown field {names!r}" if field == "body" else f"{field}: unknown field {names!r}",
        )
    if error.validator == "required":
        return field, f"missing required field: {error.message.split(' ')[0]}"
    return field, f"{field}: {error.message}"


def validate(schema: Schema, value: Any) -> None:
    validator = _validator(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        problems = [_describe(error) for error in errors]
        raise ApiError(
            "validation_failed",
            problems[0][1],
            {"problems": [{"field": field, "message": message} for field, message in problems]},
        )


def _integral_as_int(text: str) -> int | float:
    """JSON Schema counts 2.0 as an integer; so do we, so handlers only ever see ints there."""
    value = float(text)
    return int(value) if value.is_integer() else value


async def read_json_body(request: web.Request, schema: Schema) -> Any:
    raw = await request.read()
    if not raw:
        raise ApiError("invalid_json", "request body is empty; a JSON object is required")
    try:
        value = json.loads(raw, parse_float=_integral_as_int)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError("invalid_json", f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # nested past the interpreter's stack: no request body needs it
        raise ApiError("invalid_json", "request body is nested too deeply") from None
    try:
        validate(schema, value)
    except RecursionError:  # parsed, but too deep for the schema validator's recursion
        raise ApiError("invalid_json", "request body is nested too deeply") from None
    return value
