"""Errors raised by KaS3; the Kafka adapter maps them to Kafka error codes."""

from __future__ import annotations

from flowmq_core.errors import FlowMQError


class Kas3Error(FlowMQError):
    code = "kas3_error"


class InvalidRecordBatch(Kas3Error, ValueError):
    """Bytes that are not a sequence of complete Kafka record batches v2 (Kafka:
    CORRUPT_MESSAGE / INVALID_RECORD)."""

    code = "invalid_record_batch"


class DecompressedTooLarge(InvalidRecordBatch):
    """A compressed batch whose records would pass the size allowed (Kafka:
    MESSAGE_TOO_LARGE); found without decompressing more than that size."""

    code = "decompressed_too_large"


class OffsetOutOfRange(Kas3Error):
    """A fetch offset outside ``[log_start_offset, high_watermark]`` (Kafka:
    OFFSET_OUT_OF_RANGE).  Carries both bounds so the adapter can apply the consumer's
    ``auto.offset.reset`` without another round trip."""

    code = "offset_out_of_range"

    def __init__(self, offset: int, log_start_offset: int, high_watermark: int) -> None:
        super().__init__(
            f"offset {offset} is outside [{log_start_offset}, {high_watermark}]",
            details={
                "offset": offset,
                "log_start_offset": log_start_offset,
                "high_watermark": high_watermark,
            },
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.high_watermark = high_watermark


class ChunkRefused(Kas3Error):
    """Returned by an ``append_nowait(on_commit=...)`` hook to leave its chunk out of the
    flush transaction (nothing indexed, no offsets taken); the chunk's future fails with it.
    The Kafka adapter refuses a retried or out-of-order idempotent batch this way, checked
    against the state stored in the very transaction that would have appended it."""

    code = "kas3_chunk_refused"


class CompactionConflict(Kas3Error):
    """The index changed under a compaction run (retention or another compactor); the run is
    abandoned and its new object scheduled for deletion."""

    code = "kas3_compaction_conflict"


__all__ = [
    "ChunkRefused",
    "CompactionConflict",
    "InvalidRecordBatch",
    "Kas3Error",
    "OffsetOutOfRange",
]
