"""The AMQP listener's size and count limits (docs/operations.md#limits), read once from the
broker configuration; each refusal is logged at info and counted in
``limits_rejections_count{limit}`` by the code that refuses (connection.py, channel.py).

- ``frame_max`` (``amqp_frame_max``): offered in Connection.Tune; the client may lower it, and
  from TuneOk on a frame larger than what was agreed closes the connection (501 FRAME_ERROR).
- ``channel_max`` (``amqp_channel_max``): offered in Tune; Channel.Open above what was agreed
  closes the connection (504 CHANNEL_ERROR).
- ``max_message_bytes`` (``amqp_max_message_bytes``, RabbitMQ's ``max_message_size``): a
  content header declaring more closes the channel (406 PRECONDITION_FAILED), as RabbitMQ.
- ``max_partial_bytes``: body bytes received for messages not yet complete, over all channels
  of a connection (four messages at the limit); past it the channel whose frame passed it is
  closed (406), so one connection cannot hold thousands of half-sent messages.
- ``max_unacked`` (``amqp_max_unacked``): a consumer without a prefetch count (Basic.Qos 0)
  is given this one, so it stops receiving past that many unacknowledged deliveries instead
  of the broker sending, and holding, without bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowmq_core.config import BrokerConfig

# The partial bodies a connection may hold, in messages at ``max_message_bytes``.
PARTIAL_MESSAGES = 4


@dataclass(frozen=True)
class AmqpLimits:
    frame_max: int
    channel_max: int
    max_message_bytes: int
    max_partial_bytes: int
    max_unacked: int

    @classmethod
    def from_config(cls, config: BrokerConfig) -> AmqpLimits:
        return cls(
            frame_max=config.amqp_frame_max,
            channel_max=config.amqp_channel_max,
            max_message_bytes=config.amqp_max_message_bytes,
            max_partial_bytes=PARTIAL_MESSAGES * config.amqp_max_message_bytes,
            max_unacked=config.amqp_max_unacked,
        )


__all__ = ["PARTIAL_MESSAGES", "AmqpLimits"]
