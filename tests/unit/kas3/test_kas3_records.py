"""Record batch v2 helpers: header summary without decompression, splitting, base-offset
patching, building (every codec) and decoding, MQTT/AMQP message encoding."""

from __future__ import annotations

import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from flowmq_kas3 import TOPIC_HEADER, InvalidRecordBatch, build_batch, decode_batch, encode_messages
from flowmq_kas3.errors import DecompressedTooLarge
from flowmq_kas3.records import (
    CODEC_NAMES,
    HEADER_SIZE,
    base_offset_of,
    crc_ok,
    decode_batches,
    encode_batch,
    encode_message,
    iter_batches,
    message_summary,
    patch_base_offsets,
    split_batches,
    summarize,
)

RECORDS = [
    (b"k%d" % i, b"value-%d" % i * 30, [("h", b"x"), ("n", None)], 1_000 + 7 * i) for i in range(25)
]


@pytest.mark.parametrize("codec", sorted(CODEC_NAMES))
def test_build_and_decode_every_codec(codec: str) -> None:
    batch = build_batch(RECORDS, compression=CODEC_NAMES[codec])
    assert crc_ok(batch)
    # kafka-python's own reader agrees on the header and the CRC
    reader = DefaultRecordBatch(batch)
    assert reader.validate_crc() and reader.compression_type == CODEC_NAMES[codec]
    records = decode_batch(batch)
    assert [(r.key, r.value, r.headers, r.timestamp) for r in records] == [
        (k, v, list(h), t) for k, v, h, t in RECORDS
    ]
    assert [r.offset for r in records] == list(range(25))
    if codec != "none":
        assert len(batch) < len(build_batch(RECORDS))


@pytest.mark.parametrize("codec", sorted(CODEC_NAMES))
def test_summary_needs_no_decompression(codec: str) -> None:
    batch = build_batch(RECORDS, compression=CODEC_NAMES[codec])
    summary = summarize(batch + batch)
    assert summary.offset_count == 50
    assert summary.max_timestamp == 1_000 + 7 * 24
    assert summary.batch_count == 2


def test_split_and_patch_base_offsets() -> None:
    a, b = build_batch(RECORDS[:3]), build_batch(RECORDS[3:4])
    buf = bytearray(a + b + a)
    assert [bytes(v) for v in split_batches(buf)] == [a, b, a]
    assert patch_base_offsets(buf, 100) == 107
    assert [base_offset_of(v) for v in split_batches(buf)] == [100, 103, 104]
    assert [r.offset for r in decode_batches(buf)] == [100, 101, 102, 103, 104, 105, 106]
    assert all(crc_ok(v) for v in split_batches(buf))  # the CRC does not cover the base offset


def test_invalid_framing_is_rejected() -> None:
    batch = build_batch(RECORDS[:2])
    for bad in (b"", batch[: HEADER_SIZE - 1], batch[:-1], batch + b"\x00"):
        with pytest.raises(InvalidRecordBatch):
            summarize(bad)
    v1 = bytearray(batch)
    v1[16] = 1
    with pytest.raises(InvalidRecordBatch, match="magic"):
        summarize(v1)
    negative = bytearray(batch)
    struct.pack_into(">i", negative, 23, -1)
    with pytest.raises(InvalidRecordBatch):
        list(iter_batches(negative))
    corrupt = bytearray(batch)
    corrupt[-3] ^= 0xFF
    assert not crc_ok(corrupt)


def test_corrupt_compressed_payload_raises_invalid_batch() -> None:
    batch = bytearray(build_batch(RECORDS, compression=CODEC_NAMES["zstd"]))
    batch[HEADER_SIZE + 5 :] = b"\x00" * (len(batch) - HEADER_SIZE - 5)
    with pytest.raises(InvalidRecordBatch):
        decode_batch(batch)


class _Msg:
    def __init__(self, topic: str, payload: bytes, headers, key=None, ts: int = 42) -> None:
        self.topic, self.payload, self.headers, self.key, self.timestamp_ms = (
            topic,
            payload,
            headers,
            key,
            ts,
        )


def test_encode_messages_puts_topic_first_then_user_properties() -> None:
    batch = encode_messages(
        [_Msg("a/b", b"1", [("p", b"v"), ("p", b"w")]), _Msg("a/ü", b"2", [], key=b"k", ts=43)]
    )
    r1, r2 = decode_batch(batch)
    assert r1.headers == [(TOPIC_HEADER, b"a/b"), ("p", b"v"), ("p", b"w")]
    assert r2.headers == [(TOPIC_HEADER, "a/ü".encode())]
    assert (r1.value, r1.timestamp, r2.key, r2.timestamp) == (b"1", 42, b"k", 43)


def _kafka_python_batch(records) -> bytes:
    """What kafka-python's builder writes for ``records``: the reference for the encoder."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 62,
    )
    for offset, (key, value, headers, timestamp) in enumerate(records):
        builder.append(offset, timestamp, key, value, list(headers))
    return bytes(builder.build())


# Record shapes the hand-written encoder must write exactly as kafka-python's builder does:
# null/empty keys and values, null header values, unicode names, negative and past-the-table
# timestamp deltas, lengths and header counts whose varints take several bytes.
ENCODER_SHAPES = {
    "one plain": [(None, b"x" * 100, [], 1_700_000_000_000)],
    "null value and key": [(None, None, [], 0)],
    "empty key and value": [(b"", b"", [], 5)],
    "null header values": [(b"k", b"v", [("a", None), ("b", b""), ("a", b"1")], 9)],
    "unicode header names": [(None, b"v", [("ü/é", b"\xff"), ("日本", None)], 1)],
    "decreasing timestamps": [(b"k%d" % i, b"v", [], 1_000 - 300 * i) for i in range(5)],
    "wide timestamp deltas": [(None, b"v", [], t) for t in (0, 1 << 40, -(1 << 40), 8191, -8192)],
    "negative timestamp": [(None, b"v", [], -1)],
    "long fields": [(b"k" * 9000, b"v" * 70_000, [("h" * 200, b"x" * 20_000)], 3)],
    "many headers": [(None, b"v", [(f"h{i}", b"%d" % i) for i in range(100)], 7)],
    "several records": RECORDS,
    "many records": [(None, b"%d" % i, [], 50 + i) for i in range(300)],
}


@pytest.mark.parametrize("shape", sorted(ENCODER_SHAPES))
def test_encode_batch_writes_what_kafka_python_writes(shape: str) -> None:
    records = ENCODER_SHAPES[shape]
    batch = encode_batch(records)
    assert batch == _kafka_python_batch(records) == build_batch(records)
    assert crc_ok(batch)
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in decode_batch(batch)] == [
        (i, k, v, list(h), t) for i, (k, v, h, t) in enumerate(records)
    ]


MESSAGE_SHAPES = {
    "plain": [_Msg("sensors/1/temp", b"x" * 100, [])],
    "empty payload with key": [_Msg("a", b"", [], key=b"k")],
    "unicode topic and properties": [_Msg("капуста/ü", b"v", [("ключ", b"\x00"), ("p", b"")])],
    "long topic and payload": [_Msg("t/" * 5000, b"p" * 100_000, [], ts=0)],
    "several messages": [
        _Msg(f"t/{i % 3}", b"m%d" % i, [("n", b"%d" % i)] * (i % 4), ts=10_000 - i * 999)
        for i in range(40)
    ],
}


@pytest.mark.parametrize("shape", sorted(MESSAGE_SHAPES))
def test_encode_messages_writes_what_kafka_python_writes(shape: str) -> None:
    messages = MESSAGE_SHAPES[shape]
    expected = _kafka_python_batch(
        [
            (m.key, m.payload, [(TOPIC_HEADER, m.topic.encode()), *m.headers], m.timestamp_ms)
            for m in messages
        ]
    )
    assert encode_messages(messages) == expected
    assert encode_messages(messages) == expected  # again, with the topic headers cached
    zstd = encode_messages(messages, compression=CODEC_NAMES["zstd"])
    assert decode_batch(zstd) == decode_batch(expected)


@pytest.mark.parametrize(
    "message",
    [
        _Msg("sensors/1/temp", b"x" * 100, []),
        _Msg("a", b"", [], key=b"k", ts=0),
        _Msg("ü/" * 3000, b"p" * 20_000, [], key=b"k" * 200, ts=-5),
        _Msg("a/b", b"v", [("p", b"1"), ("q", None)], key=b"k"),
    ],
)
def test_encode_message_writes_what_kafka_python_writes(message: _Msg) -> None:
    expected = _kafka_python_batch(
        [
            (
                message.key,
                message.payload,
                [(TOPIC_HEADER, message.topic.encode()), *message.headers],
                message.timestamp_ms,
            )
        ]
    )
    assert encode_message(message) == expected
    assert message_summary(message) == summarize(expected)


def test_encoders_refuse_an_empty_batch() -> None:
    with pytest.raises(InvalidRecordBatch):
        encode_batch([])
    with pytest.raises(InvalidRecordBatch):
        encode_messages([])


def test_control_batches_decode_to_no_records() -> None:
    batch = bytearray(build_batch([(b"\x00\x00\x00\x01", b"", [], 5)]))
    attrs = struct.unpack_from(">h", batch, 21)[0] | 0x20
    struct.pack_into(">h", batch, 21, attrs)
    assert decode_batch(batch) == []
    assert summarize(batch).offset_count == 1  # still occupies its offset


@pytest.mark.parametrize("name", sorted(n for n in CODEC_NAMES if n != "none"))
def test_decompression_stops_at_max_size(name: str) -> None:
    """A batch that inflates past ``max_size`` is refused without being inflated: gigabyte
    bombs cost what ``max_size`` allows; batches within it decode as without a bound."""
    codec = CODEC_NAMES[name]
    bomb = build_batch([(None, bytes(1 << 20), [], 0)] * 16, compression=codec)
    assert len(bomb) < 1 << 20
    with pytest.raises(DecompressedTooLarge):
        decode_batches(bomb, max_size=1 << 20)
    fits = build_batch([(None, b"y" * 300_000, [], 0)] * 3, compression=codec)
    assert len(decode_batches(fits, max_size=1 << 20)) == 3
    assert len(decode_batches(bomb)) == 16
