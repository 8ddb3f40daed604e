from __future__ import annotations

import aiohttp
import pytest

from flowmq_broker.server import Broker
from flowmq_core.config import BrokerConfig

TOKEN = "test-token"


@pytest.fixture
async def broker(tmp_path):
    config = BrokerConfig(
        data_dir=str(tmp_path / "data"),
        http_port=0,
        mqtt_port=0,
        kafka_port=0,
        amqp_port=0,
        gossip_port=0,
        admin_token=TOKEN,
        node_id="node-a",
    )
    broker = Broker(config)
    await broker.start()
    yield broker
    await broker.stop()


class Api:
    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def call(self, method: str, path: str, *, token: str | None = TOKEN, **kwargs):
        headers = kwargs.pop("headers", {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        async with self.session.request(method, self.base + path, headers=headers, **kwargs) as r:
            body = await r.json(content_type=None)
            return r.status, body


@pytest.fixture
async def api(broker):
    async with aiohttp.ClientSession() as session:
        yield Api(session, f"http://127.0.0.1:{broker.ports['http']}")
