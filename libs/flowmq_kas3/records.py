"""Kafka record batch v2: header parsing without decompression, building, decoding.

Batches are stored exactly as produced.  Everything the storage layer needs (how many offsets
a batch occupies, its max timestamp, its size) is in the fixed 61-byte header, so appends and
fetches never decompress; only ``decode_batch`` (routing Kafka records to MQTT/AMQP, exact
timestamp look-ups) does.

Header layout (big-endian), offsets in bytes::

    0 baseOffset i64 | 8 length i32 | 12 partitionLeaderEpoch i32 | 16 magic i8 | 17 crc u32
    21 attributes i16 | 23 lastOffsetDelta i32 | 27 firstTimestamp i64 | 35 maxTimestamp i64
    43 producerId i64 | 51 producerEpoch i16 | 53 baseSequence i32 | 57 recordsCount i32

The CRC covers bytes 21.. only, so the broker may rewrite baseOffset (and the leader epoch)
without touching it — which is how offsets assigned at commit time reach consumers.

Messages from MQTT/AMQP become records whose headers carry the canonical topic under
``flowmq.topic`` followed by the message's user properties / AMQP headers in order, names
unchanged.  Names starting with ``flowmq.`` are reserved for the broker.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

import cramjam
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.util import calc_crc32c

from flowmq_kas3.errors import DecompressedTooLarge, InvalidRecordBatch

HEADER_SIZE = 61
# baseOffset + length: the bytes of a batch that its length field does not count.
LOG_OVERHEAD = 12
MAGIC_V2 = 2

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4
CODEC_NAMES = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_CODEC_MASK = 0x07
_CONTROL_MASK = 0x20

TOPIC_HEADER = "flowmq.topic"

_LENGTH = struct.Struct(">i")
BASE_OFFSET = struct.Struct(">q")
# attributes, lastOffsetDelta, firstTimestamp, maxTimestamp (bytes 21..43)
_MIDDLE = struct.Struct(">hiqq")
_RECORDS_COUNT = struct.Struct(">i")
_MIN_LENGTH = HEADER_SIZE - LOG_OVERHEAD


class BatchInfo(NamedTuple):
    """One batch inside a buffer, from its header alone."""

    position: int  # where the batch starts in the buffer
    size: int  # bytes, header included
    offset_count: int  # offsets it occupies: lastOffsetDelta + 1
    record_count: int
    first_timestamp: int
    max_timestamp: int
    attributes: int

    @property
    def compression(self) -> int:
        return self.attributes & _CODEC_MASK

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_MASK)


class BatchesSummary(NamedTuple):
    """What an index entry needs to know about a chunk of whole batches."""

    offset_count: int
    max_timestamp: int
    batch_count: int


class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


class MessageLike(Protocol):
    """What ``encode_messages`` reads from a message (``flowmq_core.message.Message`` fits)."""

    topic: str
    payload: bytes
    key: bytes | None
    headers: list[tuple[str, bytes]]
    timestamp_ms: int


def _batch_at(buf: bytes | bytearray | memoryview, pos: int) -> BatchInfo:
    end = len(buf)
    if end - pos < HEADER_SIZE:
        raise InvalidRecordBatch(
            f"truncated record batch at byte {pos}: {end - pos} bytes left, header needs "
            f"{HEADER_SIZE}"
        )
    (length,) = _LENGTH.unpack_from(buf, pos + 8)
    magic = buf[pos + 16]
    if magic != MAGIC_V2:
        raise InvalidRecordBatch(f"record batch at byte {pos} has magic {magic}, only v2 is stored")
    size = length + LOG_OVERHEAD
    if length < _MIN_LENGTH or pos + size > end:
        raise InvalidRecordBatch(
            f"record batch at byte {pos} declares length {length}, {end - pos - LOG_OVERHEAD} "
            "bytes available"
        )
    attributes, last_delta, first_ts, max_ts = _MIDDLE.unpack_from(buf, pos + 21)
    if last_delta < 0:
        raise InvalidRecordBatch(f"record batch at byte {pos} has lastOffsetDelta {last_delta}")
    (count,) = _RECORDS_COUNT.unpack_from(buf, pos + 57)
    return BatchInfo(pos, size, last_delta + 1, count, first_ts, max(first_ts, max_ts), attributes)


def iter_batches(buf: bytes | bytearray | memoryview) -> Iterable[BatchInfo]:
    """Every batch of ``buf`` in order; raises ``InvalidRecordBatch`` on anything that is not
    a whole number of v2 batches."""
    pos = 0
    end = len(buf)
    while pos < end:
        info = _batch_at(buf, pos)
        yield info
        pos += info.size


def split_batches(buf: bytes | bytearray | memoryview) -> list[memoryview]:
    """Zero-copy views of each batch in ``buf``."""
    view = memoryview(buf)
    return [view[b.position : b.position + b.size] for b in iter_batches(buf)]


def summarize(buf: bytes | bytearray | memoryview) -> BatchesSummary:
    """Offsets occupied and max timestamp of a produced chunk, validating its framing
    (not CRCs: the adapter checks those where the protocol asks for it)."""
    offsets = 0
    max_ts = -1
    n = 0
    for info in iter_batches(buf):
        offsets += info.offset_count
        if info.max_timestamp > max_ts:
            max_ts = info.max_timestamp
        n += 1
    if n == 0:
        raise InvalidRecordBatch("empty record set: nothing to append")
    return BatchesSummary(offsets, max_ts, n)


def patch_base_offsets(buf: bytearray | memoryview, base_offset: int) -> int:
    """Rewrite each batch's baseOffset in place so the batches occupy consecutive offsets
    from ``base_offset``; returns the offset after the last batch."""
    pos = 0
    end = len(buf)
    offset = base_offset
    while pos < end:
        info = _batch_at(buf, pos)
        BASE_OFFSET.pack_into(buf, pos, offset)
        offset += info.offset_count
        pos += info.size
    return offset


def base_offset_of(batch: bytes | bytearray | memoryview) -> int:
    return BASE_OFFSET.unpack_from(batch, 0)[0]


# -- compression ----------------------------------------------------------------------------

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")
_XERIAL_BLOCK = 32 * 1024


def compress(codec: int, data: bytes) -> bytes:
    if codec == CODEC_GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == CODEC_SNAPPY:
        # Xerial framing, as the Java client writes it; every client reads it.
        out = [_XERIAL_HEADER.pack(_XERIAL_MAGIC, 1, 1)]
        for i in range(0, len(data), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(data[i : i + _XERIAL_BLOCK]))
            out.append(_LENGTH.pack(len(block)))
            out.append(block)
        return b"".join(out)
    if codec == CODEC_LZ4:
        # Kafka's LZ4 is the frame format with independent blocks.
        comp = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
        comp.compress(data)
        return bytes(comp.finish())
    if codec == CODEC_ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise InvalidRecordBatch(f"unknown compression codec {codec}")


_INTO = {CODEC_GZIP: cramjam.gzip, CODEC_LZ4: cramjam.lz4, CODEC_ZSTD: cramjam.zstd}
_FULL_BUFFER = "whole buffer"  # cramjam's DecompressionError when the output does not fit


def _too_large(codec: int, max_size: int) -> DecompressedTooLarge:
    return DecompressedTooLarge(
        f"record batch (codec {codec}) decompresses to more than {max_size} bytes"
    )


def _decompress_bounded(codec: int, raw: bytes, max_size: int) -> bytes:
    """Decompress into buffers of growing size, never one past ``max_size + 1`` bytes:
    cramjam stops as soon as the output does not fit, so a small batch that would inflate
    to gigabytes costs at most ``max_size`` bytes and a moment of the event loop."""
    size = min(max_size + 1, max(64 * 1024, 8 * len(raw)))
    while True:
        out = bytearray(size)
        try:
            n = _INTO[codec].decompress_into(raw, out)
        except cramjam.DecompressionError as exc:
            if _FULL_BUFFER not in str(exc):
                raise
            if size > max_size:
                raise _too_large(codec, max_size) from None
            size = min(max_size + 1, size * 8)
            continue
        if n > max_size:
            raise _too_large(codec, max_size)
        del out[n:]
        return bytes(out)


def _snappy_block(block: bytes, budget: int, max_size: int) -> bytes:
    """One raw snappy block, its declared length checked before decompressing it."""
    if cramjam.snappy.decompress_raw_len(block) > budget:
        raise _too_large(CODEC_SNAPPY, max_size)
    return bytes(cramjam.snappy.decompress_raw(block))


def decompress(codec: int, data: bytes | memoryview, max_size: int | None = None) -> bytes:
    """The batch body ``data`` decompressed; with ``max_size``, ``DecompressedTooLarge``
    as soon as the output would pass it (nothing larger is ever allocated)."""
    limit = max_size if max_size is not None else 1 << 62
    try:
        if codec == CODEC_SNAPPY:
            raw = bytes(data)
            if raw.startswith(_XERIAL_MAGIC):
                pos = _XERIAL_HEADER.size
                parts = []
                budget = limit
                while pos < len(raw):
                    (n,) = _LENGTH.unpack_from(raw, pos)
                    pos += 4
                    parts.append(_snappy_block(raw[pos : pos + n], budget, limit))
                    budget -= len(parts[-1])
                    pos += n
                return b"".join(parts)
            return _snappy_block(raw, limit, limit)
        if codec in _INTO:
            if max_size is not None:
                return _decompress_bounded(codec, bytes(data), max_size)
            return bytes(_INTO[codec].decompress(bytes(data)))
    except DecompressedTooLarge:
        raise
    except (cramjam.DecompressionError, struct.error, ValueError) as exc:
        raise InvalidRecordBatch(f"cannot decompress record batch (codec {codec}): {exc}") from exc
    raise InvalidRecordBatch(f"unknown compression codec {codec}")


# -- building --------------------------------------------------------------------------------

NewRecord = tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]], int]
"""(key, value, headers, timestamp_ms) of a record to build."""

# Hand-written, not kafka-python's builder: every message routed into a Stream is encoded as
# its own batch, and kafka-python's pure-Python DefaultRecordBatchBuilder (one bytearray append
# per varint byte) took 23 % of the broker's samples in the MQTT QoS 1 -> Stream benchmark.
# The encoder below writes the same bytes (the unit tests compare it with that builder over
# many record shapes) from precomputed varints and one join.  timeit, one 100-byte message:
# ``encode_messages`` 7.6 µs -> 2.6 µs, and ``encode_message`` (what the Stream destination
# calls) 1.5 µs (medians of 6 alternated runs, load average 6-9 on 2 cores;
# benchmarks/README.md).

# zigzag varints of the values whose zigzag form is below 4,096 (lengths below 2 KiB, small
# timestamp and offset deltas), so the common fields cost one index; larger ones are computed.
# (All two-byte forms, 1 << 14, held ~0.7 MB from import on, in every broker process.)
_VARINT_TABLE_SIZE = 1 << 12
_VARINTS = [
    bytes((z,)) if z < 0x80 else bytes(((z & 0x7F) | 0x80, z >> 7))
    for z in range(_VARINT_TABLE_SIZE)
]
_NULL = _VARINTS[1]  # length -1: a null key, value or header value
# attributes, lastOffsetDelta, firstTimestamp, maxTimestamp, producerId, producerEpoch,
# baseSequence, recordsCount (bytes 21..61: what the CRC covers before the records)
_CRC_COVERED_HEADER = struct.Struct(">hiqqqhii")
# baseOffset, length, partitionLeaderEpoch, magic, crc (bytes 0..21)
_LEADING_HEADER = struct.Struct(">qiibI")
_CRC_COVERED_HEADER_OFFSET = 21


def _varint(value: int) -> bytes:
    """Kafka's zigzag varint of a signed 64-bit ``value``."""
    z = (value << 1) ^ (value >> 63)
    if z < _VARINT_TABLE_SIZE:
        return _VARINTS[z]
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _append_field(parts: list[bytes], data: bytes | None) -> None:
    """A varint-length-prefixed byte field, -1 for null."""
    if data is None:
        parts.append(_NULL)
    else:
        parts.append(_varint(len(data)))
        parts.append(data)


def _append_header(parts: list[bytes], name: str, value: bytes | None) -> None:
    encoded = name.encode()
    parts.append(_varint(len(encoded)))
    parts.append(encoded)
    _append_field(parts, value)


def _append_record(
    parts: list[bytes], record: list[bytes], offset_delta: int, timestamp_delta: int
) -> None:
    """Close ``record`` (its fields after the attributes byte) into ``parts`` with its length
    prefix, attributes 0, timestamp delta and offset delta."""
    prefix = b"".join((b"\x00", _varint(timestamp_delta), _varint(offset_delta)))
    size = len(prefix)
    for part in record:
        size += len(part)
    parts.append(_varint(size))
    parts.append(prefix)
    parts.extend(record)


def _close_batch(parts: list[bytes], count: int, first_ts: int, max_ts: int) -> bytes:
    """The batch around the encoded records in ``parts[1:]`` (``parts[0]`` is reserved for
    the CRC-covered header), laid out as ``DefaultRecordBatchBuilder.build`` writes it."""
    parts[0] = _CRC_COVERED_HEADER.pack(0, count - 1, first_ts, max_ts, -1, -1, -1, count)
    covered = b"".join(parts)
    length = _CRC_COVERED_HEADER_OFFSET - LOG_OVERHEAD + len(covered)
    return _LEADING_HEADER.pack(0, length, 0, MAGIC_V2, calc_crc32c(covered)) + covered


def encode_batch(records: Sequence[NewRecord]) -> bytes:
    """One uncompressed v2 batch holding ``records``: the bytes kafka-python's
    ``DefaultRecordBatchBuilder`` writes (base offset 0, producer id, epoch and base sequence
    -1, attributes 0)."""
    if not records:
        raise InvalidRecordBatch("a record batch needs at least one record")
    first_ts = max_ts = records[0][3]
    parts: list[bytes] = [b""]
    for offset, (key, value, headers, timestamp) in enumerate(records):
        if timestamp > max_ts:
            max_ts = timestamp
        record: list[bytes] = []
        _append_field(record, key)
        _append_field(record, value)
        record.append(_varint(len(headers)))
        for name, header_value in headers:
            _append_header(record, name, header_value)
        _append_record(parts, record, offset, timestamp - first_ts)
    return _close_batch(parts, len(records), first_ts, max_ts)


def build_batch(records: Sequence[NewRecord], *, compression: int = CODEC_NONE) -> bytes:
    """One v2 batch (base offset 0, no producer id) holding ``records`` in order, its body
    compressed with ``compression``."""
    batch = encode_batch(records)
    if compression == CODEC_NONE:
        return batch
    buf = bytearray(batch[:HEADER_SIZE])
    buf += compress(compression, batch[HEADER_SIZE:])
    _LENGTH.pack_into(buf, 8, len(buf) - LOG_OVERHEAD)
    attributes = _MIDDLE.unpack_from(buf, 21)[0] | compression
    struct.pack_into(">h", buf, 21, attributes)
    struct.pack_into(">I", buf, 17, calc_crc32c(memoryview(buf)[21:]))
    return bytes(buf)


def _encode_topic_header(topic: str) -> bytes:
    parts: list[bytes] = []
    _append_header(parts, TOPIC_HEADER, topic.encode())
    return b"".join(parts)


# The same few topics are routed over and over; the bounds keep what a client sending many
# long distinct topics can pin to a few MiB (MQTT allows 64 KiB topics).
_CACHED_TOPIC_HEADERS = 4096
_CACHED_TOPIC_MAX_LENGTH = 256
_cached_topic_header = functools.lru_cache(maxsize=_CACHED_TOPIC_HEADERS)(_encode_topic_header)


def _topic_header(topic: str) -> bytes:
    """The encoded ``flowmq.topic`` header of ``topic``."""
    if len(topic) <= _CACHED_TOPIC_MAX_LENGTH:
        return _cached_topic_header(topic)
    return _encode_topic_header(topic)


_ONE_HEADER = _varint(1)
# attributes 0, timestamp delta 0, offset delta 0: the start of a batch's only record
_FIRST_RECORD_PREFIX = b"\x00" + _varint(0) + _varint(0)


def encode_message(msg: MessageLike) -> bytes:
    """``encode_messages([msg])``: the one-record batch every message routed into a Stream
    becomes, from one join when the message has no user properties."""
    if msg.headers:
        return encode_messages((msg,))
    key = msg.key
    payload = msg.payload
    timestamp = msg.timestamp_ms
    record = b"".join(
        (
            _FIRST_RECORD_PREFIX,
            _NULL if key is None else _varint(len(key)),
            key or b"",
            _NULL if payload is None else _varint(len(payload)),
            payload or b"",
            _ONE_HEADER,
            _topic_header(msg.topic),
        )
    )
    return _close_batch([b"", _varint(len(record)), record], 1, timestamp, timestamp)


def message_summary(msg: MessageLike) -> BatchesSummary:
    """``summarize(encode_message(msg))`` without walking the bytes just written: one batch
    of one record at the message's timestamp (``summarize`` counts none below -1)."""
    return BatchesSummary(1, max(msg.timestamp_ms, -1), 1)


def encode_messages(messages: Iterable[MessageLike], *, compression: int = CODEC_NONE) -> bytes:
    """A v2 batch of routed MQTT/AMQP messages: canonical topic as header ``flowmq.topic``,
    then the message's own headers (user properties) in order.  (One message without user
    properties, the Stream destination's hot path, is ``encode_message``.)"""
    records: list[NewRecord] = []
    for msg in messages:
        headers: list[tuple[str, bytes | None]] = [(TOPIC_HEADER, msg.topic.encode())]
        headers.extend(msg.headers)
        records.append((msg.key, msg.payload, headers, msg.timestamp_ms))
    if not records:
        raise InvalidRecordBatch("a record batch needs at least one record")
    return build_batch(records, compression=compression)


# -- decoding --------------------------------------------------------------------------------


def decode_batch(
    batch: bytes | bytearray | memoryview,
    *,
    include_control: bool = False,
    max_size: int | None = None,
) -> list[Record]:
    """The records of one batch, decompressed; offsets use the batch's baseOffset as it is
    in ``batch`` (patched on fetch).  Control batches (transaction markers) give no records
    unless ``include_control``.  ``max_size``: the most its records may decompress to
    (``DecompressedTooLarge`` past it)."""
    info = _batch_at(batch, 0)
    if info.is_control and not include_control:
        return []
    buf = bytearray(memoryview(batch)[: info.size])
    if info.compression != CODEC_NONE:
        body = decompress(info.compression, memoryview(buf)[HEADER_SIZE:], max_size)
        struct.pack_into(">h", buf, 21, info.attributes & ~_CODEC_MASK)
        buf[HEADER_SIZE:] = body
    try:
        return [
            Record(r.offset, r.timestamp, r.key, r.value, r.headers)
            for r in DefaultRecordBatch(buf)
        ]
    except Exception as exc:  # kafka-python raises several types for corrupt records
        raise InvalidRecordBatch(f"corrupt records in batch: {exc}") from exc


def decode_batches(
    buf: bytes | bytearray | memoryview, *, max_size: int | None = None
) -> list[Record]:
    """The records of every batch in ``buf`` (each decompressing to at most ``max_size``)."""
    out: list[Record] = []
    for view in split_batches(buf):
        out.extend(decode_batch(view, max_size=max_size))
    return out


def crc_ok(batch: bytes | bytearray | memoryview) -> bool:
    """Whether the batch's CRC-32C matches its content (bytes 21.. of the batch)."""
    info = _batch_at(batch, 0)
    view = memoryview(batch)
    (crc,) = struct.unpack_from(">I", view, 17)
    return crc == calc_crc32c(view[21 : info.size])
