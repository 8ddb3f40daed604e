"""SWIM membership and event dissemination over UDP (asyncio), after hashicorp/memberlist.

Wire format: one compact JSON object per datagram, ``{"t": type, "f": sender id, ...,
"b": [broadcast, ...]}``, at most ``GossipConfig.max_datagram`` bytes. With a cluster secret
every datagram is sealed (``flowmq_cluster.auth.GossipSeal``: timestamp and HMAC-SHA256 in
front of the JSON, counted in the size), and one that does not verify is dropped before its
JSON is read; without one the node must be bound to loopback. Membership updates are
piggybacked on every ping, ack, ping-req and gossip message; events ride on gossip rounds,
where one batch goes to ``gossip_nodes`` distinct peers. Each broadcast is sent at most
``retransmit_limit(N)`` times by each node; newer updates about a member replace older ones.

Message types: ``ping`` (probe), ``ack``, ``preq`` (indirect probe request), ``g`` (gossip),
``pp`` (push-pull full state; a reply is requested with ``"r": 1``).
Broadcast kinds: ``a`` alive, ``s`` suspect, ``d`` dead, ``l`` left, ``e`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import json
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from flowmq_cluster.auth import AuthFailure, ClusterSecret, FailureLog, GossipSeal, check_bind
from flowmq_cluster.config import GossipConfig

log = logging.getLogger("flowmq.cluster")

Addr = tuple[str, int]
EventId = tuple[str, int]


class Status(StrEnum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


@dataclass
class Member:
    node_id: str
    addr: Addr
    incarnation: int = 0
    status: Status = Status.ALIVE
    meta: dict[str, Any] = field(default_factory=dict)
    since: float = field(default=0.0, compare=False, repr=False)  # monotonic time of status


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


class _BroadcastQueue:
    """Transmit-limited queue (memberlist's TransmitLimitedQueue): least-sent, newest first."""

    def __init__(self) -> None:
        self._items: dict[str, list[Any]] = {}  # key -> [encoded, transmits, order]
        self._order = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, key: str, encoded: str) -> None:
        self._order += 1
        self._items[key] = [encoded, 0, self._order]  # replaces an older update on the key

    def take(self, budget: int, limit: int, max_items: int, copies: int = 1) -> list[str]:
        """Broadcasts that fit in ``budget`` bytes; each counts ``copies`` transmissions."""
        out: list[str] = []
        ordered = sorted(self._items.items(), key=lambda kv: (kv[1][1], -kv[1][2]))
        for key, item in ordered:
            if len(out) >= max_items or budget < 16:
                break
            size = len(item[0]) + 1
            if size > budget:
                continue
            out.append(item[0])
            budget -= size
            item[1] += copies
            if item[1] >= limit:
                del self._items[key]
        return out


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, owner: Gossip) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.owner._on_datagram(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:  # e.g. ICMP port unreachable
        log.debug("gossip udp error: %s", exc)


class Gossip:
    """One cluster member. See the module docstring and DESIGN.md §6."""

    def __init__(
        self,
        node_id: str,
        bind: Addr = ("127.0.0.1", 0),
        seeds: Iterable[Addr | str] = (),
        meta: dict[str, Any] | None = None,
        config: GossipConfig | None = None,
        advertise: Addr | None = None,
        secret: ClusterSecret | None = None,
    ) -> None:
        self.node_id = node_id
        self.bind = bind
        self.seeds = [self._parse_addr(s) for s in seeds]
        self.config = config or GossipConfig()
        self.advertise = advertise
        check_bind(bind[0], secret)
        # Every datagram is sealed and opened with the secret; None: an open (loopback) plane.
        self._seal = GossipSeal(secret) if secret is not None else None
        # JSON bytes per datagram: max_datagram less the seal's header
        self._room = self.config.max_datagram - (self._seal.overhead if self._seal else 0)
        meta = dict(meta or {})
        if len(_dumps(meta)) > self._room // 2:
            raise ValueError("node metadata too large for one datagram")
        self._self = Member(node_id, ("0.0.0.0", 0), 0, Status.ALIVE, meta, time.monotonic())
        self._members: dict[str, Member] = {node_id: self._self}
        self._queue = _BroadcastQueue()  # membership updates: on every message
        self._events = _BroadcastQueue()  # events: on gossip rounds (distinct peers per round)
        self._acks: dict[int, Callable[[], None]] = {}
        self._seq = 0
        self._event_seq = (
            time.time_ns() // 1000
        )  # grows across restarts: (origin, seq) stays unique
        self._seen: dict[EventId, float] = {}
        self._probe_list: list[str] = []
        self._suspicion_timers: dict[str, asyncio.TimerHandle] = {}
        self._transport: asyncio.DatagramTransport | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._running = False
        self._leaving = False
        self._bg: set[asyncio.Task[Any]] = set()
        # callbacks
        self.on_member_change: Callable[[Member, Status | None, Status], Any] | None = None
        self.on_event: Callable[[str, dict[str, Any], int, str], Any] | None = None
        # test-only fault hook: return True to drop the datagram
        self.drop: Callable[[Addr, str], bool] | None = None
        # metrics (the broker maps them to Prometheus)
        self.events_originated = 0
        self.events_received = 0
        self.event_hops_total = 0
        self.messages_sent = 0
        self.messages_received = 0
        self.messages_dropped = 0
        self.bad_messages = 0
        self.auth_failures = FailureLog("gossip")  # .count: datagrams rejected

    # ------------------------------------------------------------------ public API

    @property
    def address(self) -> Addr:
        return self._self.addr

    @property
    def incarnation(self) -> int:
        return self._self.incarnation

    @property
    def pending_broadcasts(self) -> int:
        """Membership updates and events still to be (re)transmitted."""
        return len(self._queue) + len(self._events)

    @property
    def cluster_size(self) -> int:
        return len(self.members())

    def members(self) -> list[Member]:
        """Live members (alive or suspect, as SWIM treats suspects as live), self included."""
        return [
            copy.deepcopy(m)
            for m in self._members.values()
            if m.status in (Status.ALIVE, Status.SUSPECT)
        ]

    def all_members(self) -> list[Member]:
        """Every known member, dead and left ones included (until ``dead_retention``)."""
        return [copy.deepcopy(m) for m in self._members.values()]

    def member(self, node_id: str) -> Member | None:
        m = self._members.get(node_id)
        return copy.deepcopy(m) if m else None

    def stats(self) -> dict[str, int]:
        return {
            "cluster_size": self.cluster_size,
            "events_originated": self.events_originated,
            "events_received": self.events_received,
            "event_hops_total": self.event_hops_total,
            "messages_sent": self.messages_sent,
            "messages_received": self.messages_received,
            "messages_dropped": self.messages_dropped,
        }

    async def start(self) -> Addr:
        if self._running:
            return self.address
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Protocol(self), local_addr=self.bind
        )
        self._transport = transport  # type: ignore[assignment]
        host, port = transport.get_extra_info("sockname")[:2]
        if self.advertise:  # a port of 0 there means "the port we just bound"
            self._self.addr = (self.advertise[0], self.advertise[1] or port)
        else:
            self._self.addr = (host, port)
        if self._leaving:  # restarted after stop(): outbid our own "left"
            self._leaving = False
            self._self.incarnation += 1
        self._set_status(self._self, Status.ALIVE)
        self._running = True
        self._queue_alive(self._self)
        self._tasks = [
            asyncio.create_task(self._probe_loop(), name=f"gossip-probe-{self.node_id}"),
            asyncio.create_task(self._gossip_loop(), name=f"gossip-gossip-{self.node_id}"),
            asyncio.create_task(self._push_pull_loop(), name=f"gossip-pp-{self.node_id}"),
        ]
        return self.address

    async def stop(self, leave: bool = True) -> None:
        if not self._running:
            return
        if leave:
            self._leaving = True
            self._self.status = Status.LEFT
            update = {"k": "l", "n": self.node_id, "i": self._self.incarnation}
            self._queue.put("m:" + self.node_id, _dumps(update))
            # tell every live member directly, a few times, then let gossip spread it
            deadline = time.monotonic() + self.config.leave_timeout
            while True:
                for m in self._others(Status.ALIVE, Status.SUSPECT):
                    self._send(m.addr, {"t": "g", "b": [update]})
                if time.monotonic() + self.config.gossip_interval > deadline:
                    break
                await asyncio.sleep(self.config.gossip_interval)
        self._running = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for handle in self._suspicion_timers.values():
            handle.cancel()
        self._suspicion_timers.clear()
        for task in list(self._bg):
            task.cancel()
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    async def join(self, seeds: Iterable[Addr | str]) -> None:
        """Contact more seeds now (push-pull); they are also retried while we are alone."""
        for seed in seeds:
            addr = self._parse_addr(seed)
            if addr not in self.seeds:
                self.seeds.append(addr)
        await self._contact_seeds()

    def update_meta(self, meta: dict[str, Any]) -> None:
        """Replace our metadata; a new incarnation carries it to every member."""
        meta = dict(meta)
        if len(_dumps(meta)) > self._room // 2:
            raise ValueError("node metadata too large for one datagram")
        self._self.meta = meta
        self._self.incarnation += 1
        self._queue_alive(self._self)

    def broadcast(self, kind: str, payload: dict[str, Any]) -> EventId:
        """Disseminate an event to every other member; returns its id (origin, seq)."""
        self._event_seq += 1
        eid = (self.node_id, self._event_seq)
        item = {"k": "e", "o": self.node_id, "q": self._event_seq, "n": kind, "p": payload, "h": 0}
        encoded = _dumps(item)
        if len(encoded) > self._room - 200:
            raise ValueError("event too large for one datagram")
        self._seen[eid] = time.monotonic()
        self._events.put(f"e:{eid[0]}:{eid[1]}", encoded)
        self.events_originated += 1
        return eid

    # ------------------------------------------------------------------ sending

    @staticmethod
    def _parse_addr(a: Addr | str) -> Addr:
        if isinstance(a, str):
            host, _, port = a.rpartition(":")
            return (host.strip("[]") or "127.0.0.1", int(port))
        return (a[0], int(a[1]))

    def _take_broadcasts(self, base: str, copies: int = 1, events: bool = False) -> list[str]:
        budget = self._room - len(base) - 8
        limit = self.config.retransmit_limit(max(1, self.cluster_size))
        items = self._queue.take(budget, limit, self.config.max_piggyback, copies)
        if events:
            budget -= sum(len(i) + 1 for i in items)
            room = self.config.max_piggyback - len(items)
            items += self._events.take(budget, limit, room, copies)
        return items

    def _send(
        self,
        addr: Addr,
        msg: dict[str, Any],
        piggyback: bool = False,
        items: list[str] | None = None,
    ) -> None:
        if self._transport is None:
            return
        msg["f"] = self.node_id
        base = _dumps(msg)
        if piggyback:
            items = self._take_broadcasts(base)
        if items:
            base = base[:-1] + ',"b":[' + ",".join(items) + "]}"
        if self.drop is not None and self.drop(addr, msg["t"]):
            self.messages_dropped += 1
            return
        self._sendto(base, addr)

    def _others(self, *statuses: Status) -> list[Member]:
        return [m for m in self._members.values() if m is not self._self and m.status in statuses]

    # ------------------------------------------------------------------ loops

    async def _probe_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self._running:
            started = loop.time()
            try:
                target = self._next_probe_target()
                if target is not None:
                    await self._probe(target)
                self._reap()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("gossip probe failed")
            await asyncio.sleep(max(0.0, self.config.probe_interval - (loop.time() - started)))

    def _next_probe_target(self) -> Member | None:
        while True:
            if not self._probe_list:
                self._probe_list = [m.node_id for m in self._others(Status.ALIVE, Status.SUSPECT)]
                random.shuffle(self._probe_list)
                if not self._probe_list:
                    return None
            m = self._members.get(self._probe_list.pop())
            if m is not None and m.status in (Status.ALIVE, Status.SUSPECT):
                return m

    async def _probe(self, target: Member) -> None:
        cfg = self.config
        node_id, inc = target.node_id, target.incarnation
        seq = self._next_seq()
        acked = asyncio.get_running_loop().create_future()

        def on_ack() -> None:
            if not acked.done():
                acked.set_result(True)

        self._acks[seq] = on_ack
        try:
            self._send(target.addr, {"t": "ping", "q": seq, "to": node_id}, piggyback=True)
            await asyncio.wait({acked}, timeout=cfg.probe_timeout)
            if acked.done():
                return
            helpers = [m for m in self._others(Status.ALIVE) if m.node_id != node_id]
            host, port = target.addr
            for m in random.sample(helpers, min(cfg.indirect_checks, len(helpers))):
                req = {"t": "preq", "q": seq, "to": node_id, "h": host, "p": port}
                self._send(m.addr, req, piggyback=True)
            await asyncio.wait({acked}, timeout=cfg.probe_interval - cfg.probe_timeout)
            if acked.done():
                return
        finally:
            self._acks.pop(seq, None)
        current = self._members.get(node_id)
        if current is not None and current.status == Status.ALIVE and current.incarnation == inc:
            self._apply({"k": "s", "n": node_id, "i": inc, "w": self.node_id})

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    async def _gossip_loop(self) -> None:
        while self._running:
            await asyncio.sleep(self.config.gossip_interval)
            try:
                self._gossip_round()
            except Exception:
                log.exception("gossip round failed")

    def _gossip_round(self) -> None:
        now = time.monotonic()
        targets = [
            m
            for m in self._members.values()
            if m is not self._self
            and (
                m.status in (Status.ALIVE, Status.SUSPECT)
                or (m.status == Status.DEAD and now - m.since < self.config.gossip_to_dead_time)
            )
        ]
        if not targets or not self.pending_broadcasts:
            return
        chosen = random.sample(targets, min(self.config.gossip_nodes, len(targets)))
        # one batch for the whole round, so each broadcast reaches distinct peers
        base = _dumps({"t": "g", "f": self.node_id})
        items = self._take_broadcasts(base, len(chosen), events=True)
        for m in chosen:
            self._send(m.addr, {"t": "g"}, items=items)

    async def _push_pull_loop(self) -> None:
        last = time.monotonic()
        while self._running:
            try:
                live = self._others(Status.ALIVE, Status.SUSPECT)
                if not live:
                    await self._contact_seeds()
                elif time.monotonic() - last >= self.config.push_pull_interval:
                    last = time.monotonic()
                    self._send_state(random.choice(live).addr, reply=True)
            except Exception:
                log.exception("gossip push-pull failed")
            await asyncio.sleep(min(self.config.probe_interval, self.config.push_pull_interval))

    async def _contact_seeds(self) -> None:
        loop = asyncio.get_running_loop()
        for host, port in self.seeds:
            try:
                infos = await loop.getaddrinfo(host, port, type=2)  # SOCK_DGRAM
            except OSError:
                continue
            addr = infos[0][4][:2] if infos else (host, port)
            if (addr[0], addr[1]) == self._self.addr:
                continue
            self._send_state((addr[0], addr[1]), reply=True)

    def _state_of(self, m: Member) -> dict[str, Any]:
        k = {Status.ALIVE: "a", Status.SUSPECT: "s", Status.DEAD: "d", Status.LEFT: "l"}
        return {
            "k": k[m.status],
            "n": m.node_id,
            "i": m.incarnation,
            "h": m.addr[0],
            "p": m.addr[1],
            "m": m.meta,
        }

    def _send_state(self, addr: Addr, reply: bool) -> None:
        """Push-pull: our full member table, split over as many datagrams as needed."""
        states = [_dumps(self._state_of(m)) for m in self._members.values()]
        budget = self._room - 64
        chunk: list[str] = []
        size = 0
        first = True
        for s in states:
            if chunk and size + len(s) + 1 > budget:
                self._send_raw_state(addr, chunk, reply and first)
                first, chunk, size = False, [], 0
            chunk.append(s)
            size += len(s) + 1
        if chunk:
            self._send_raw_state(addr, chunk, reply and first)

    def _send_raw_state(self, addr: Addr, states: list[str], reply: bool) -> None:
        if self._transport is None:
            return
        msg = _dumps({"t": "pp", "f": self.node_id, "r": int(reply)})
        data = msg[:-1] + ',"s":[' + ",".join(states) + "]}"
        if self.drop is not None and self.drop(addr, "pp"):
            self.messages_dropped += 1
            return
        self._sendto(data, addr)

    def _sendto(self, text: str, addr: Addr) -> None:
        assert self._transport is not None
        data = text.encode()
        if self._seal is not None:
            data = self._seal.seal(data)
        self.messages_sent += 1
        try:
            self._transport.sendto(data, addr)
        except OSError as exc:
            log.debug("gossip send to %s failed: %s", addr, exc)

    def _reap(self) -> None:
        now = time.monotonic()
        for node_id, m in list(self._members.items()):
            if (
                m is not self._self
                and m.status in (Status.DEAD, Status.LEFT)
                and now - m.since > self.config.dead_retention
            ):
                del self._members[node_id]
        ttl = self.config.event_dedup_ttl
        for eid, t in list(self._seen.items()):
            if now - t > ttl:
                del self._seen[eid]

    # ------------------------------------------------------------------ receiving

    def _on_datagram(self, data: bytes, addr: Addr) -> None:
        if not self._running:
            return
        if self._seal is not None:
            try:
                data = self._seal.open(data)
            except AuthFailure as exc:
                self.auth_failures(addr[0], str(exc))
                return
        try:
            msg = json.loads(data)
            kind = msg["t"]
        except (ValueError, KeyError, TypeError):
            self.bad_messages += 1
            return
        self.messages_received += 1
        try:
            for item in msg.get("b", ()):
                self._apply(item)
            if kind == "ping":
                if msg.get("to") == self.node_id:
                    self._send(addr, {"t": "ack", "q": msg["q"]}, piggyback=True)
            elif kind == "ack":
                cb = self._acks.get(msg["q"])
                if cb is not None:
                    cb()
            elif kind == "preq":
                self._indirect_ping(msg, addr)
            elif kind == "pp":
                self._merge_state(msg.get("s", ()))
                if msg.get("r"):
                    self._send_state(addr, reply=False)
        except (KeyError, TypeError, ValueError):
            self.bad_messages += 1
            log.debug("bad gossip message from %s: %r", addr, msg)

    def _indirect_ping(self, msg: dict[str, Any], requester: Addr) -> None:
        seq = self._next_seq()
        orig_seq = msg["q"]

        def on_ack() -> None:
            self._acks.pop(seq, None)
            self._send(requester, {"t": "ack", "q": orig_seq}, piggyback=True)

        self._acks[seq] = on_ack
        asyncio.get_running_loop().call_later(self.config.probe_interval, self._acks.pop, seq, None)
        self._send((msg["h"], int(msg["p"])), {"t": "ping", "q": seq, "to": msg["to"]}, True)

    def _merge_state(self, states: Iterable[dict[str, Any]]) -> None:
        for s in states:
            k = s["k"]
            if k == "d":  # like memberlist: a remote "dead" only makes us suspect
                s = {**s, "k": "s"}
            self._apply(s)

    def _apply(self, u: dict[str, Any]) -> None:
        k = u["k"]
        if k == "e":
            self._apply_event(u)
        elif k == "a":
            self._apply_alive(u)
        elif k == "s":
            self._apply_suspect(u)
        elif k in ("d", "l"):
            self._apply_dead(u, Status.DEAD if k == "d" else Status.LEFT)

    def _apply_event(self, u: dict[str, Any]) -> None:
        eid = (u["o"], int(u["q"]))
        if eid in self._seen:
            return
        self._seen[eid] = time.monotonic()
        hops = int(u["h"]) + 1
        self.events_received += 1
        self.event_hops_total += hops
        self._events.put(f"e:{eid[0]}:{eid[1]}", _dumps({**u, "h": hops}))
        self._callback(self.on_event, u["n"], u["p"], hops, u["o"])

    def _apply_alive(self, u: dict[str, Any]) -> None:
        node_id, inc = u["n"], int(u["i"])
        addr = (u["h"], int(u["p"]))
        if node_id == self.node_id:
            if not self._leaving and (
                inc > self._self.incarnation
                or (inc == self._self.incarnation and addr != self._self.addr)
            ):
                self._refute(inc)
            return
        m = self._members.get(node_id)
        if m is None:
            m = Member(node_id, addr, inc, Status.ALIVE, dict(u.get("m") or {}), time.monotonic())
            self._members[node_id] = m
            self._probe_list.insert(random.randint(0, len(self._probe_list)), node_id)
            self._queue_alive(m)
            self._changed(m, None)
            return
        revived_elsewhere = m.status in (Status.DEAD, Status.LEFT) and addr != m.addr
        if inc <= m.incarnation and not revived_elsewhere:
            return
        old = m.status
        meta_changed = m.meta != (u.get("m") or {})
        m.incarnation, m.addr = inc, addr
        m.meta = dict(u.get("m") or {})
        self._cancel_suspicion(node_id)
        self._set_status(m, Status.ALIVE)
        self._queue_alive(m)
        if old != Status.ALIVE or meta_changed:
            self._changed(m, old)

    def _accused(self, node_id: str, inc: int) -> Member | None:
        """The member a suspect or dead update about ``node_id`` at incarnation ``inc``
        applies to; None when it is stale or about this node (which refutes it instead)."""
        if node_id == self.node_id:
            if not self._leaving and inc >= self._self.incarnation:
                self._refute(inc)
            return None
        m = self._members.get(node_id)
        if m is None or inc < m.incarnation or m.status in (Status.DEAD, Status.LEFT):
            return None
        return m

    def _apply_suspect(self, u: dict[str, Any]) -> None:
        node_id, inc = u["n"], int(u["i"])
        m = self._accused(node_id, inc)
        if m is None or (m.status == Status.SUSPECT and inc == m.incarnation):
            return
        old = m.status
        m.incarnation = inc
        self._set_status(m, Status.SUSPECT)
        self._queue.put("m:" + node_id, _dumps({"k": "s", "n": node_id, "i": inc}))
        self._cancel_suspicion(node_id)
        timeout = self.config.suspicion_timeout(self.cluster_size)
        self._suspicion_timers[node_id] = asyncio.get_running_loop().call_later(
            timeout, self._suspicion_expired, node_id, inc
        )
        if old != Status.SUSPECT:
            self._changed(m, old)

    def _suspicion_expired(self, node_id: str, inc: int) -> None:
        self._suspicion_timers.pop(node_id, None)
        m = self._members.get(node_id)
        if self._running and m is not None and m.status == Status.SUSPECT and m.incarnation == inc:
            self._apply_dead({"k": "d", "n": node_id, "i": inc}, Status.DEAD)

    def _apply_dead(self, u: dict[str, Any], status: Status) -> None:
        node_id, inc = u["n"], int(u["i"])
        m = self._accused(node_id, inc)
        if m is None:
            return
        old = m.status
        m.incarnation = inc
        self._cancel_suspicion(node_id)
        self._set_status(m, status)
        self._queue.put("m:" + node_id, _dumps({"k": u["k"], "n": node_id, "i": inc}))
        self._changed(m, old)

    def _refute(self, inc: int) -> None:
        """Someone thinks we are suspect/dead: outbid them and gossip that we are alive."""
        self._self.incarnation = max(self._self.incarnation, inc) + 1
        self._queue_alive(self._self)

    # ------------------------------------------------------------------ helpers

    def _queue_alive(self, m: Member) -> None:
        self._queue.put("m:" + m.node_id, _dumps(self._state_of(m)))

    def _set_status(self, m: Member, status: Status) -> None:
        m.status = status
        m.since = time.monotonic()

    def _cancel_suspicion(self, node_id: str) -> None:
        handle = self._suspicion_timers.pop(node_id, None)
        if handle is not None:
            handle.cancel()

    def _changed(self, m: Member, old: Status | None) -> None:
        self._callback(self.on_member_change, copy.deepcopy(m), old, m.status)

    def _callback(self, cb: Callable[..., Any] | None, *args: Any) -> None:
        if cb is None:
            return
        try:
            result = cb(*args)
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                self._bg.add(task)
                task.add_done_callback(self._bg.discard)
        except Exception:
            log.exception("gossip callback failed")
