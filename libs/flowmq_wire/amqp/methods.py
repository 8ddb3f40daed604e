"""Every AMQP method that is not on the per-message path, through pamqp's generated classes."""

from __future__ import annotations

from pamqp import base, commands, encode

from flowmq_wire.amqp.frames import _METHOD_ID, SyntaxError_, method_frame, method_index


class UnknownMethod(Exception):
    """A method id the spec does not define (540 NOT_IMPLEMENTED)."""


def decode_method(payload: bytes) -> base.Frame:
    index = method_index(payload)
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise UnknownMethod(f"unknown method class {index >> 16} id {index & 0xFFFF}")
    method = cls()
    try:
        method.unmarshal(payload[4:])
    except Exception as exc:  # struct.error, ValueError, UnicodeDecodeError, IndexError ...
        raise SyntaxError_(f"malformed {method.name}: {exc}") from None
    return method


def encode_method(channel: int, method: base.Frame) -> bytes:
    return method_frame(channel, _METHOD_ID.pack(method.index) + _marshal(method))


def _marshal(method: base.Frame) -> bytes:
    """pamqp's ``Frame.marshal`` without its ``validate``: that applies client-side name
    rules (e.g. queue names limited to ``[a-zA-Z0-9-_.:]``) to what a server echoes back,
    while RabbitMQ accepts any UTF-8 name up to 255 bytes."""
    byte, offset, output, in_bits = 0, 0, [], False
    for argument in method.__slots__:
        data_type = method.amqp_type(argument)
        value = getattr(method, argument, 0)
        if data_type == "bit":
            if not in_bits:
                byte, offset, in_bits = 0, 0, True
            byte = encode.bit(value, byte, offset)
            offset += 1
            if offset == 8:
                output.append(encode.octet(byte))
                in_bits = False
            continue
        if in_bits:
            output.append(encode.octet(byte))
            in_bits = False
        output.append(encode.by_type(value, data_type))
    if in_bits:
        output.append(encode.octet(byte))
    return b"".join(output)


def method_name(index: int) -> str:
    cls = commands.INDEX_MAPPING.get(index)
    return cls.name if cls is not None else f"method {index >> 16}.{index & 0xFFFF}"
