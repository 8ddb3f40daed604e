"""flowmq_wire: pure protocol codecs, no I/O (DESIGN.md §2).

Subpackages: ``mqtt`` (own MQTT 3.1.1 + 5.0 codec), ``kafka``, ``amqp``. Nothing here opens a
socket, touches asyncio or imports another FlowMQ package; adapters in ``flowmq_broker`` feed
bytes in and write the bytes that come out.
"""
