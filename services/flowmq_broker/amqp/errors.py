"""Protocol errors raised by handlers and turned into Channel.Close / Connection.Close."""

from __future__ import annotations

from flowmq_wire.amqp.constants import REPLY_TEXT


class AmqpError(Exception):
    def __init__(self, code: int, text: str) -> None:
        name = REPLY_TEXT.get(code, "ERROR")
        full = text if text.startswith(name) else f"{name} - {text}"
        super().__init__(full)
        self.code = code
        # AMQP reply-text is a short string.
        self.text = full.encode()[:255].decode("utf-8", "ignore")


class ChannelError(AmqpError):
    """Closes the channel (soft errors: 403, 404, 405, 406, ...)."""


class ConnectionError_(AmqpError):  # noqa: N801 - the builtin name is taken
    """Closes the connection (hard errors: 501, 503, 504, 505, 530, 540, ...)."""
