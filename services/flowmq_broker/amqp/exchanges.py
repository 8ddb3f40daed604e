"""AMQP exchanges: the built-in ones, and those clients declare (kept in the meta store so
every broker maps publishes to them the same way, DESIGN.md §3)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from flowmq_meta import keys
from flowmq_meta.api import MetaStore, Transaction
from flowmq_meta.changelog import record_change

SUPPORTED_TYPES = ("direct", "topic", "fanout")
KNOWN_TYPES = (*SUPPORTED_TYPES, "headers")


@dataclass
class Exchange:
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    builtin: bool = False


BUILTIN = {
    "": Exchange("", "direct", builtin=True),
    "amq.direct": Exchange("amq.direct", "direct", builtin=True),
    "amq.topic": Exchange("amq.topic", "topic", builtin=True),
    "amq.fanout": Exchange("amq.fanout", "fanout", builtin=True),
    "amq.headers": Exchange("amq.headers", "headers", builtin=True),
    "amq.match": Exchange("amq.match", "headers", builtin=True),
}


def _plain(value: Any) -> Any:
    """Argument values as JSON can hold them (field tables may carry bytes, decimals...)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


class ExchangeRegistry:
    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self._declared: dict[tuple[str, str], Exchange] = {}

    def get(self, ns: str, name: str) -> Exchange | None:
        builtin = BUILTIN.get(name)
        if builtin is not None:
            return builtin
        return self._declared.get((ns, name))

    async def load(self) -> None:
        begin, end = keys.AMQP_EXCHANGES.range()
        rows = await self.meta.transact(lambda tr: tr.get_range(begin, end))
        declared = {}
        for key, value in rows:
            ns, name = keys.AMQP_EXCHANGES.unpack(key)
            declared[(ns, name)] = Exchange(**json.loads(value))
        self._declared = declared

    async def declare(self, ns: str, exchange: Exchange) -> Exchange:
        """Store ``exchange`` unless one of that name exists; returns the stored one."""
        exchange.arguments = _plain(exchange.arguments)
        key = keys.AMQP_EXCHANGES.pack(ns, exchange.name)
        record = json.dumps(asdict(exchange)).encode()

        def txn(tr: Transaction) -> Exchange:
            raw = tr.get(key)
            if raw is not None:
                return Exchange(**json.loads(raw))
            tr.set(key, record)
            record_change(tr, "amqp.exchange.declared", {"namespace": ns, "name": exchange.name})
            return exchange

        stored = await self.meta.transact(txn)
        self._declared[(ns, stored.name)] = stored
        return stored

    async def delete(self, ns: str, name: str) -> bool:
        key = keys.AMQP_EXCHANGES.pack(ns, name)

        def txn(tr: Transaction) -> bool:
            if tr.get(key) is None:
                return False
            tr.clear(key)
            record_change(tr, "amqp.exchange.deleted", {"namespace": ns, "name": name})
            return True

        found = await self.meta.transact(txn)
        self._declared.pop((ns, name), None)
        return found
