"""Null checks of decoded Kafka requests against their schema's ``nullableVersions``.

kafka-python's generated decoders read a length of -1 as ``None`` for every array, string
and bytes field, whether or not the schema lets that field be null in that version.  A Kafka
broker refuses such a request as malformed; handlers here iterate arrays and use names
without asking, so a null where the schema has none must stop at the codec.  The fields to
look at for one (struct, version) are worked out once and cached: what remains per request is
a ``getattr`` per field that could fail the check (``_spec``).
"""

from __future__ import annotations

from typing import Any

# (field name, may be null, element/child struct to descend into or None, is an array)
_Spec = tuple[tuple[str, bool, Any, bool], ...]
_SPECS: dict[tuple[int, int], _Spec] = {}
# Simple types whose length -1 decodes as None.
_LENGTH_PREFIXED = frozenset({"string", "bytes", "records"})


def _spec(struct: Any, version: int) -> _Spec:
    """The fields of ``struct`` worth a look in ``version``: those that may not be null, and
    those with children that may not be; a nullable leaf can never fail and is left out, as
    is a child struct with nothing to check (a Produce's partitions: only ``records``, which
    is nullable), so a request costs a few ``getattr``s per topic, none per partition."""
    key = (id(struct), version)
    spec = _SPECS.get(key)
    if spec is None:
        rows = []
        for field in struct.untagged_fields(version):
            nullable = field.nullable_for_version_q(version)
            if field.is_struct_array():
                child, is_array = field.array_of, True
            elif field.is_struct():
                child, is_array = field, False
            elif field.is_array() or field.type_str in _LENGTH_PREFIXED:
                child, is_array = None, False
            else:
                continue  # a number, or a UUID (its all-zero value decodes as None)
            if child is not None and not _spec(child, version):
                child = None
            if nullable and child is None:
                continue
            rows.append((field.name, nullable, child, is_array))
        spec = _SPECS[key] = tuple(rows)
    return spec


def null_field(struct: Any, obj: Any, version: int) -> str | None:
    """The dotted path of the first field of ``obj`` that is null where ``struct`` (a
    kafka-python ``StructField``) does not allow it in ``version``, or None."""
    for name, nullable, child, is_array in _spec(struct, version):
        value = getattr(obj, name, None)
        if value is None:
            if not nullable:
                return name
            continue
        if child is None:
            continue
        for item in value if is_array else (value,):
            path = null_field(child, item, version)
            if path is not None:
                return f"{name}.{path}"
    return None


__all__ = ["null_field"]
