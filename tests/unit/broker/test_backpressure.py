"""Pausing a publisher for several reasons (backpressure.py, MQTT delivery flow control): the
end of one reason resumes reading only when no other reason still holds the connection.
Real asyncio transports over loopback TCP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from flowmq_broker.backpressure import MEMORY_LIMIT, Backpressure
from flowmq_broker.mqtt.delivery import MqttDelivery
from flowmq_broker.routing import Router

pytestmark = pytest.mark.timeout(30)


class Publisher(asyncio.Protocol):
    """The server side of one TCP connection: all the flow control looks at."""

    def __init__(self, made: asyncio.Future[Publisher]) -> None:
        self.transport: asyncio.Transport | None = None
        self._made = made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._made.set_result(self)


@pytest.fixture
async def publisher() -> AsyncIterator[Publisher]:
    loop = asyncio.get_running_loop()
    made: asyncio.Future[Publisher] = loop.create_future()
    server = await loop.create_server(lambda: Publisher(made), "127.0.0.1", 0)
    _, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
    yield await made
    writer.close()
    server.close()


def reading(publisher: Publisher) -> bool:
    assert publisher.transport is not None
    return publisher.transport.is_reading()


async def test_the_end_of_the_pressure_leaves_a_publisher_paused_for_a_blocked_link(
    publisher: Publisher,
) -> None:
    pressure = Backpressure()
    delivery = MqttDelivery(Router(), {}, {}, pressure=pressure)
    pressure.on_pressure(True)
    delivery.pause_for_pressure(publisher)  # type: ignore[arg-type]
    assert not reading(publisher) and delivery.is_paused(publisher)  # type: ignore[arg-type]
    delivery.pause_for_links(publisher)  # type: ignore[arg-type]
    pressure.on_pressure(False)
    assert not reading(publisher)
    delivery.on_links_free()
    assert reading(publisher) and pressure.held == []


async def test_a_freed_link_leaves_a_publisher_paused_for_the_pressure(
    publisher: Publisher,
) -> None:
    pressure = Backpressure()
    delivery = MqttDelivery(Router(), {}, {}, pressure=pressure)
    delivery.pause_for_links(publisher)  # type: ignore[arg-type]
    pressure.on_pressure(True)
    delivery.pause_for_pressure(publisher)  # type: ignore[arg-type]
    delivery.on_links_free()
    assert not reading(publisher)
    pressure.on_pressure(False)
    assert reading(publisher)


async def test_a_publisher_that_left_is_not_resumed(publisher: Publisher) -> None:
    pressure = Backpressure()
    delivery = MqttDelivery(Router(), {}, {}, pressure=pressure)
    pressure.on_pressure(True)
    delivery.pause_for_pressure(publisher)  # type: ignore[arg-type]
    delivery.forget(publisher)  # type: ignore[arg-type]
    assert pressure.held == []
    pressure.on_pressure(False)
    assert not reading(publisher)


async def test_publishers_resume_only_when_the_backlog_and_the_memory_are_both_under(
    publisher: Publisher,
) -> None:
    pressure = Backpressure()
    delivery = MqttDelivery(Router(), {}, {}, pressure=pressure)
    pressure.on_pressure(True)
    pressure.set_reason(MEMORY_LIMIT, True)
    delivery.pause_for_pressure(publisher)  # type: ignore[arg-type]
    pressure.on_pressure(False)
    assert pressure.active and not reading(publisher)
    pressure.set_reason(MEMORY_LIMIT, False)
    assert not pressure.active and reading(publisher)
