"""MQTT load-generator processes for ``mqtt_bench.py``.

Each public function here is the body of one OS process (``multiprocessing``, spawn start
method), so publishers, subscribers and the broker never share a GIL. Everything is built so
the generator costs far less CPU per message than a broker does (DESIGN.md §11):

- raw blocking/non-blocking sockets, no client library; MQTT 3.1.1 (protocol level 4);
- PUBLISH packets are encoded once before the clock starts and sent as large blobs
  (``BLOB_BYTES`` per ``send``); QoS 0 flow control is plain TCP back-pressure;
- a QoS 1 flooding publisher keeps a window of unacknowledged packets (pre-encoded ring of all
  65535 packet ids) and counts PUBACKs by bytes (a 3.1.1 PUBACK is always 4 bytes);
- a counting subscriber never parses: every message is one packet of a known length, so
  received bytes give the message count; once its first packet has been checked, a QoS 0
  counting subscriber over plain TCP has the kernel discard what it reads (``MSG_TRUNC``:
  the count without the copy, about a third of the kernel time per byte), so it takes less
  of the cores it shares with the broker; QoS 1 PUBACKs are built with extended slices of the
  received bytes (packet ids sit at a fixed offset of every packet);
- with ``cafile`` (``tls_bench.py``; QoS 0 throughput loads only) every connection is TLS,
  trusting that CA; a TLS subscriber drains all decrypted records of a readable socket per
  wake-up (one ``recv`` gives at most one 16 KiB record), so it reads in chunks as large as
  over plain TCP;
- latency loads send at a fixed rate with a ``time.monotonic_ns()`` stamp (CLOCK_MONOTONIC:
  one clock for every process on Linux) in the first 8 payload bytes; the subscriber decodes
  with the codec's client-side ``MqttDecoder`` and computes the latency per message.

Control: the parent passes an ``Event`` (go), a shared double (the monotonic start time) and a
shared integer (how many messages each subscriber should get; set once the publishers are done,
-1 before). Every process first reports ``("ready", name, None)`` on the queue once its
connections are up (subscribers: SUBACK received), then one ``("result", name, dict)``.
Every loop is bounded in time, so a stalled or message-dropping broker still ends the run.
"""

from __future__ import annotations

import array
import os
import select
import selectors
import socket
import ssl
import time
import traceback
from dataclasses import dataclass

from flowmq_wire.mqtt.codec import MqttDecoder, encode, encode_publish
from flowmq_wire.mqtt.packets import (
    Connack,
    Connect,
    Publish,
    Suback,
    Subscribe,
    SubscriptionOptions,
)

LEVEL = 4  # MQTT 3.1.1: both brokers forward the PUBLISH byte for byte (no properties)
BLOB_BYTES = 256 * 1024  # one send() of pre-encoded QoS 0 PUBLISH packets
RECV_BYTES = 256 * 1024
SMALL_READ = 32 * 1024
READY_TIMEOUT_S = 60.0  # connect/subscribe, and the wait for "go"
ACK_DRAIN_S = 5.0  # after the last send, how long a QoS 1 publisher waits for PUBACKs
HARD_EXTRA_S = 60.0  # a subscriber gives up this long after the planned end, whatever happens
DISCONNECT = b"\xe0\x00"
MAX_ID = 65535
STAMP = 8  # bytes of monotonic_ns stamp at the start of a latency payload


@dataclass
class PubSpec:
    name: str
    port: int
    client_id: str
    topic: str
    msg_size: int
    qos: int
    duration: float
    window: int = 256  # QoS 1: unacknowledged PUBLISH packets in flight
    rate: float = 0.0  # messages/s; 0 = as fast as the socket accepts
    host: str = "127.0.0.1"
    cafile: str = ""  # TLS, trusting this CA; "" = plain TCP


@dataclass
class SubSpec:
    name: str
    port: int
    client_ids: list[str]  # one connection each, all served by this process
    topic_filter: str
    qos: int
    msg_size: int
    pkt_len: int  # length of every PUBLISH this subscriber receives
    prefix: bytes  # fixed header + topic length every such PUBLISH starts with (checked once)
    duration: float
    warmup: float
    latency: bool = False  # decode and measure latency instead of counting bytes
    drain_s: float = 2.0  # stop once nothing arrived for this long after the publishers ended
    nap: float = 0.0005  # QoS 0 counting: sleep this long after a read smaller than SMALL_READ
    host: str = "127.0.0.1"
    cafile: str = ""  # TLS, trusting this CA; "" = plain TCP
    persistent: bool = False  # clean session 0: a persistent session (its messages stored)


# --- helpers -------------------------------------------------------------------------------


def payload_for(msg_size: int) -> bytes:
    return bytes((48 + i % 10) for i in range(msg_size))


def packet_len(topic: str, msg_size: int, qos: int) -> int:
    return len(encode_publish(topic, b"\0" * msg_size, qos, packet_id=1 if qos else None))


def _cpu() -> float:
    return time.process_time()


def _sys_cpu() -> float:
    """This process's CPU seconds in the kernel (its sends and receives, mostly)."""
    return os.times().system


def _handshake(sock: socket.socket, packet: bytes, want: type, what: str):
    """Send ``packet`` and read until one packet of type ``want`` (nothing else expected)."""
    sock.sendall(packet)
    decoder = MqttDecoder(server=False, protocol_level=LEVEL)
    while True:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError(f"broker closed the connection during {what}")
        packets = decoder.feed(data)
        if packets:
            p = packets[0]
            if not isinstance(p, want) or len(packets) > 1 or decoder.buffered:
                raise ConnectionError(f"unexpected answer to {what}: {packets!r}")
            return p


def connect(
    port: int,
    client_id: str,
    host: str = "127.0.0.1",
    timeout: float = READY_TIMEOUT_S,
    cafile: str = "",
    clean_start: bool = True,
) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if cafile:
        sock = ssl.create_default_context(cafile=cafile).wrap_socket(sock, server_hostname=host)
    connack = _handshake(
        sock,
        encode(Connect(client_id, clean_start=clean_start, keep_alive=0), LEVEL),
        Connack,
        "CONNECT",
    )
    if connack.reason_code != 0:
        raise ConnectionError(f"CONNACK refused {client_id}: {connack.reason_code}")
    return sock


def subscribe(sock: socket.socket, topic_filter: str, qos: int) -> None:
    packet = encode(Subscribe(1, [(topic_filter, SubscriptionOptions(qos=qos))]), LEVEL)
    suback = _handshake(sock, packet, Suback, "SUBSCRIBE")
    if suback.reason_codes != [qos]:
        raise ConnectionError(f"SUBACK {suback.reason_codes} for {topic_filter} QoS {qos}")


def _close(sock: socket.socket) -> None:
    try:
        sock.settimeout(1.0)
        sock.sendall(DISCONNECT)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    sock.close()


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _wait_go(go, go_time) -> float:
    if not go.wait(READY_TIMEOUT_S):
        raise TimeoutError("no start signal")
    start = go_time.value
    _sleep_until(start)
    return start


# --- publishers ----------------------------------------------------------------------------


def _flood_qos0(sock: socket.socket, spec: PubSpec, deadline: float) -> dict:
    pkt = encode_publish(spec.topic, payload_for(spec.msg_size), 0)
    size = len(pkt)
    blob = pkt * max(1, BLOB_BYTES // size)
    view = memoryview(blob)
    span = len(blob)
    sock.settimeout(0.1)
    sent = 0  # bytes
    send, now = sock.send, time.monotonic
    while now() < deadline:
        try:
            sent += send(view[sent % span :])
        except TimeoutError:
            pass
    rest = -sent % size
    if rest:  # finish the packet cut by the last partial send
        sock.settimeout(5.0)
        sock.sendall(view[sent % span : sent % span + rest])
        sent += rest
    return {"sent": sent // size, "acked": None}


def _flood_qos1(sock: socket.socket, spec: PubSpec, deadline: float) -> dict:
    payload = payload_for(spec.msg_size)
    ring = b"".join(
        encode_publish(spec.topic, payload, 1, packet_id=i) for i in range(1, MAX_ID + 1)
    )
    size = len(ring) // MAX_ID
    view = memoryview(ring)
    window = spec.window
    batch = max(1, window // 16)
    sock.setblocking(False)
    fd = sock.fileno()
    sent = acked = 0
    tail = b""
    bad = 0
    pending: memoryview | None = None
    closed = False
    now = time.monotonic

    def read_acks() -> bool:
        nonlocal tail, acked, bad, closed
        try:
            data = sock.recv(RECV_BYTES)
        except BlockingIOError:
            return False
        if not data:
            closed = True
            return False
        buf = tail + data if tail else data
        n = len(buf) >> 2
        bad += n - buf[0 : n * 4 : 4].count(0x40)  # PUBACK = 40 02 id id
        tail = buf[n * 4 :]
        acked += n
        return True

    while not closed:
        progressed = read_acks()
        t = now()
        if pending is None:
            if t >= deadline:
                break
            room = window - (sent - acked)
            if room >= batch:
                idx = sent % MAX_ID
                k = min(room, MAX_ID - idx)
                pending = view[idx * size : (idx + k) * size]
                sent += k
        if pending is not None:
            try:
                n = sock.send(pending)
            except BlockingIOError:
                n = 0
            if n:
                progressed = True
                pending = pending[n:] if n < len(pending) else None
        if not progressed:
            select.select([fd], [fd] if pending is not None else [], [], 0.05)
    end = now() + ACK_DRAIN_S
    while acked < sent and not closed and now() < end:
        if not read_acks():
            select.select([fd], [], [], 0.05)
    return {
        "sent": sent,
        "acked": acked,
        "bad_acks": bad,
        "closed_by_broker": closed,
    }


def _paced(sock: socket.socket, spec: PubSpec, start: float, deadline: float) -> dict:
    """Fixed rate, each PUBLISH stamped with monotonic_ns just before its send."""
    qos = spec.qos
    filler = payload_for(spec.msg_size)[STAMP:]
    sample = encode_publish(spec.topic, b"\0" * spec.msg_size, qos, packet_id=1 if qos else None)
    head = sample[: len(sample) - spec.msg_size - (2 if qos else 0)]
    rate = spec.rate
    tick = max(1.0 / rate, 0.0002)  # send what is due, at most every 200 µs
    window = spec.window
    sock.setblocking(False)
    fd = sock.fileno()
    sent = acked = 0
    behind = 0  # most messages ever due but held back by a full window
    ack_bytes = 0
    closed = False
    now, now_ns = time.monotonic, time.monotonic_ns
    out = bytearray()

    def read_acks() -> None:
        nonlocal ack_bytes, acked, closed
        while True:
            try:
                data = sock.recv(RECV_BYTES)
            except BlockingIOError:
                return
            if not data:
                closed = True
                return
            ack_bytes += len(data)
            acked = ack_bytes >> 2

    while not closed:
        t = now()
        if t >= deadline:
            break
        due = int((t - start) * rate) + 1 - sent
        if qos:
            read_acks()
            room = window - (sent - acked)
            if due > room:
                behind = max(behind, due - max(room, 0))
                due = max(room, 0)
        if due > 0:
            stamp = now_ns().to_bytes(8, "big") + filler
            if qos:
                for i in range(sent, sent + due):
                    out += head
                    out += (i % MAX_ID + 1).to_bytes(2, "big")
                    out += stamp
            else:
                one = head + stamp
                out += one * due
            sent += due
        if out:
            try:
                n = sock.send(out)
            except BlockingIOError:
                n = 0
            del out[:n]
        wake = start + (sent + 1) / rate
        wait = max(wake - now(), tick if due > 0 else 0.0)
        if qos:
            select.select([fd], [fd] if out else [], [], min(wait, 0.05))
        elif wait > 0:
            time.sleep(min(wait, 0.05))
    sock.setblocking(True)
    sock.settimeout(5.0)
    if out and not closed:
        sock.sendall(out)
    if qos:
        sock.setblocking(False)
        end = now() + ACK_DRAIN_S
        while acked < sent and not closed and now() < end:
            select.select([fd], [], [], 0.05)
            read_acks()
    return {
        "sent": sent,
        "acked": acked if qos else None,
        "behind": behind,
        "rate": sent / (deadline - start),
        "closed_by_broker": closed,
    }


def publisher(spec: PubSpec, go, go_time, expected, out) -> None:
    sock = None
    try:
        sock = connect(spec.port, spec.client_id, spec.host, cafile=spec.cafile)
        out.put(("ready", spec.name, None))
        start = _wait_go(go, go_time)
        cpu0, sys0 = _cpu(), _sys_cpu()
        deadline = start + spec.duration
        if spec.rate:
            result = _paced(sock, spec, start, deadline)
        elif spec.qos == 0:
            result = _flood_qos0(sock, spec, deadline)
        else:
            result = _flood_qos1(sock, spec, deadline)
        result["t_end"] = time.monotonic()
        result["cpu"] = _cpu() - cpu0
        result["sys"] = _sys_cpu() - sys0
        result["wall"] = result["t_end"] - start
        out.put(("result", spec.name, result))
    except BaseException:
        out.put(("result", spec.name, {"error": traceback.format_exc(limit=4)}))
    finally:
        if sock is not None:
            _close(sock)


# --- subscribers ---------------------------------------------------------------------------


def _send_nb(sock: socket.socket, data: bytes | bytearray, timeout: float = 5.0) -> None:
    """``sendall`` for a non-blocking socket (PUBACKs are small: one send in practice)."""
    view = memoryview(data)
    end = time.monotonic() + timeout
    while view:
        try:
            view = view[sock.send(view) :]
        except BlockingIOError:
            if time.monotonic() > end:
                raise TimeoutError("broker does not read our PUBACKs") from None
            select.select([], [sock], [], 0.05)


def _qos1_acks(buf: bytes, size: int, id_at: int) -> tuple[int, bytearray, bytes, int]:
    """Messages in ``buf`` (fixed-length QoS 1 PUBLISH packets), their PUBACKs, the leftover
    partial packet and how many packets had an unexpected first byte."""
    n = len(buf) // size
    end = n * size
    bad = len(buf[0:end:size].translate(None, b"\x32\x3a"))  # PUBLISH QoS 1, DUP or not
    acks = bytearray(4 * n)
    acks[0::4] = b"\x40" * n
    acks[1::4] = b"\x02" * n
    acks[2::4] = buf[id_at:end:size]
    acks[3::4] = buf[id_at + 1 : end : size]
    return n, acks, buf[end:], bad


def subscriber(spec: SubSpec, go, go_time, expected, out) -> None:
    socks: list[socket.socket] = []
    try:
        for cid in spec.client_ids:
            sock = connect(
                spec.port, cid, spec.host, cafile=spec.cafile, clean_start=not spec.persistent
            )
            socks.append(sock)
            subscribe(sock, spec.topic_filter, spec.qos)
        out.put(("ready", spec.name, None))
        start = _wait_go(go, go_time)
        result = _receive(socks, spec, start, expected)
        out.put(("result", spec.name, result))
    except BaseException:
        out.put(("result", spec.name, {"error": traceback.format_exc(limit=4)}))
    finally:
        for sock in socks:
            _close(sock)


def _recv_into_tls(sock: ssl.SSLSocket, buf: memoryview) -> int:
    """``recv_into`` for a non-blocking TLS socket: every record already readable, up to
    ``len(buf)`` bytes (0 at the end of the stream; ``BlockingIOError`` if nothing yet)."""
    n = 0
    size = len(buf)
    while n < size:
        try:
            got = sock.recv_into(buf[n:])
        except ssl.SSLWantReadError:
            if n:
                return n
            raise BlockingIOError from None
        if not got:
            return n
        n += got
    return n


def _receive(socks: list[socket.socket], spec: SubSpec, start: float, expected) -> dict:
    cpu0, sys0 = _cpu(), _sys_cpu()
    k = len(socks)
    size = spec.pkt_len
    qos1 = spec.qos == 1
    latency = spec.latency
    id_at = size - spec.msg_size - 2
    counting_bytes = not latency and not qos1  # QoS 0 count: bytes, converted at the end
    got = [0] * k  # bytes (QoS 0 count) or messages
    tails = [b""] * k
    decoders = [MqttDecoder(server=False, protocol_level=LEVEL) for _ in range(k)]
    checked = [False] * k
    bad = 0
    errors: list[str] = []
    lat = array.array("q")
    warm_ns = int((start + spec.warmup) * 1e9)
    warm_at = start + spec.warmup
    hard_end = start + spec.duration + HARD_EXTRA_S
    sel = selectors.DefaultSelector()
    for i, sock in enumerate(socks):
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, i)
    buf = bytearray(RECV_BYTES)
    mv = memoryview(buf)
    tls = bool(spec.cafile)
    total = 0
    t_first = t0 = t_last = None
    c0 = c_last = 0
    last_data = time.monotonic()
    timeline: list[int] = []  # bytes/messages received per 100 ms since the start
    max_gap = 0.0  # longest time without data between the first and the last receive
    exp_seen = None
    now, now_ns = time.monotonic, time.monotonic_ns
    open_socks = k
    reads = read_bytes = 0  # what the reads cost depends on how much each gets
    nap = spec.nap if counting_bytes else 0.0  # QoS 1: PUBACKs pace the broker, never wait
    while open_socks:
        events = sel.select(0.1)
        t = now()
        arrived = False
        biggest = 0
        for key, _ in events:
            i = key.data
            sock = key.fileobj
            try:
                if counting_bytes:
                    if tls:
                        n = _recv_into_tls(sock, mv)
                    elif checked[i]:  # only the count matters now: no copy to user space
                        n = sock.recv_into(buf, 0, socket.MSG_TRUNC)
                    else:
                        n = sock.recv_into(buf)
                    data = None
                else:
                    data = sock.recv(RECV_BYTES)
                    n = len(data)
            except BlockingIOError:
                continue
            except OSError as exc:
                n, data = 0, None
                errors.append(f"{spec.client_ids[i]}: {exc!r}")
            if not n:
                if not errors or spec.client_ids[i] not in errors[-1]:
                    errors.append(f"{spec.client_ids[i]}: connection closed by the broker")
                sel.unregister(sock)
                open_socks -= 1
                continue
            arrived = True
            reads += 1
            read_bytes += n
            if n > biggest:
                biggest = n
            if not checked[i] and n >= size:
                first = bytes(mv[:16] if data is None else data[:16])
                if not first.startswith(spec.prefix):
                    errors.append(f"unexpected first packet {first!r}, not {spec.prefix!r}…")
                checked[i] = True
            if counting_bytes:
                got[i] += n
                total += n
            elif not latency:
                m, acks, tails[i], b = _qos1_acks(
                    tails[i] + data if tails[i] else data, size, id_at
                )
                bad += b
                got[i] += m
                total += m
                if m:
                    _send_nb(sock, acks)
            else:
                arrived_ns = now_ns()
                acks = []
                for p in decoders[i].feed(data):
                    if p.__class__ is not Publish:
                        continue
                    got[i] += 1
                    total += 1
                    sent_ns = int.from_bytes(p.payload[:STAMP], "big")
                    if sent_ns >= warm_ns:
                        lat.append(arrived_ns - sent_ns)
                    if p.qos:
                        acks.append(b"\x40\x02" + p.packet_id.to_bytes(2, "big"))
                if acks:
                    _send_nb(sock, b"".join(acks))
        if arrived:
            slot = int((t - start) * 10)
            while len(timeline) <= slot:
                timeline.append(0)
            timeline[slot] += total - c_last
            if t_first is None:
                t_first = t
            elif t - t_last > max_gap:
                max_gap = t - t_last
            if t0 is None and t >= warm_at:  # the window starts at the warm-up mark
                t0, c0 = warm_at, c_last
            t_last, c_last = t, total
            last_data = t
        if nap and arrived and biggest < SMALL_READ:
            time.sleep(nap)  # let data pile up: fewer, larger reads (less CPU taken from brokers)
        exp = expected.value
        if exp >= 0:
            if exp_seen is None:
                exp_seen = t
            want = exp * size if counting_bytes else exp
            if all(g >= want for g in got):
                break
            if t - max(last_data, exp_seen) > spec.drain_s:
                break
        if t > hard_end:
            errors.append("gave up at the hard deadline")
            break
    div = size if counting_bytes else 1
    if counting_bytes:
        partial = [g % size for g in got]
        if any(partial):
            errors.append(f"byte count not a multiple of the packet length: {partial}")
    return {
        "received": [g // div for g in got],
        "t_first": t_first,
        "t0": t0,
        "c0": c0 // div,
        "t_last": t_last,
        "c_last": c_last // div,
        "bad_packets": bad,
        "max_gap": max_gap,
        "timeline": [n // div for n in timeline],
        "lat": lat.tobytes() if latency else b"",
        "cpu": _cpu() - cpu0,
        "sys": _sys_cpu() - sys0,
        "wall": (t_last or now()) - start,
        "reads": reads,
        "read_bytes": read_bytes,
        "errors": errors,
        "pid": os.getpid(),
    }
