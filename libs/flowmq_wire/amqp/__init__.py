"""AMQP 0-9-1 wire codec (no I/O).

``frames``: frame splitting and the hand-written encoders/decoders of the per-message methods
(Basic.Publish, Deliver, GetOk, Ack, Nack, Reject, Return) and content frames — pamqp costs
~12 us to decode and ~15 us to encode one message's three frames, which alone would cap a
broker core near 35k msgs/s; a server's reader hands a whole publish, or an ack, over as one
item, and ``DeliverEncoder`` prepares a consumer's Deliver bytes once per shape.  ``methods``: every other method through pamqp.
``properties``: Basic properties kept as the raw bytes the publisher sent, parsed lazily.
``constants``: reply codes.
"""

from __future__ import annotations
