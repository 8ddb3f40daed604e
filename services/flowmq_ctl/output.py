"""Rendering answers: ``-o table`` (default, for people), ``json`` and ``yaml`` (for scripts).

A table shows chosen columns of a list of objects; a single object is shown as ``key: value``
lines.  JSON and YAML show the API's ``data`` unchanged, so what a script parses is what
the admin API documents.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

FORMATS = ("table", "json", "yaml")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(_cell(v) for v in value) if value else "-"
    if isinstance(value, dict):
        return ",".join(f"{k}={_cell(v)}" for k, v in value.items()) if value else "-"
    return str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], out: TextIO) -> None:
    header = [c.upper() for c in columns]
    body = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(columns))]
    for line in [header, *body]:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        out.write("\n")


def details(obj: dict[str, Any], out: TextIO) -> None:
    width = max((len(k) for k in obj), default=0)
    for key, value in obj.items():
        out.write(f"{key.ljust(width)}  {_cell(value)}\n")


def to_yaml(data: Any) -> str:
    import yaml  # a runtime dependency; imported only when asked for

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)


def emit(
    data: Any,
    fmt: str,
    columns: Sequence[str] | None = None,
    out: TextIO | None = None,
) -> None:
    """Print ``data``: as JSON/YAML, or as a table of ``columns`` (a list) or details (an
    object; ``columns``, when given, picks and orders its keys)."""
    out = out or sys.stdout
    if fmt == "json":
        out.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    elif fmt == "yaml":
        out.write(to_yaml(data))
    elif isinstance(data, list):
        table(data, columns or (sorted(data[0]) if data else ["name"]), out)
    elif isinstance(data, dict):
        shown = data if columns is None else {c: data.get(c) for c in columns if c in data}
        details(shown, out)
    else:
        out.write(f"{data}\n")


def emit_line(data: Any, fmt: str, text: str, out: TextIO | None = None) -> None:
    """One item of a stream of results (consume, tail): ``text`` in table mode, one JSON
    object per line (JSON Lines) or one YAML document per item."""
    out = out or sys.stdout
    if fmt == "json":
        out.write(json.dumps(data, ensure_ascii=False) + "\n")
    elif fmt == "yaml":
        out.write("---\n" + to_yaml(data))
    else:
        out.write(text + "\n")
    out.flush()
