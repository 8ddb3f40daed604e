"""Size-prefixed framing of the Kafka protocol (``int32 size`` + payload), incremental.

``FrameSplitter.feed`` returns every complete frame of the bytes received so far; the tail is
kept.  Frames that arrive whole inside one read are zero-copy views of that read; only a
frame split over several reads is joined, once, when its last byte arrives.
"""

from __future__ import annotations

import struct

from flowmq_wire.kafka.errors import FrameTooLarge, MalformedRequest

_SIZE = struct.Struct(">i")
# api_key + api_version + correlation_id + client_id length: the least a request can be.
MIN_REQUEST_SIZE = 10
DEFAULT_MAX_FRAME = 100 * 1024 * 1024


class FrameSplitter:
    __slots__ = ("_chunks", "_have", "_need", "max_frame")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._chunks: list[bytes] = []
        self._have = 0
        self._need = 0  # bytes of the buffered frame, size prefix included (0: unknown yet)

    @property
    def buffered(self) -> int:
        return self._have

    def _check(self, size: int) -> int:
        if size > self.max_frame:
            raise FrameTooLarge(f"request of {size} bytes exceeds the limit of {self.max_frame}")
        if size < MIN_REQUEST_SIZE:
            raise MalformedRequest(f"request frame of {size} bytes is too short for a header")
        return size + 4

    def feed(self, data: bytes) -> list[memoryview]:
        """Complete frames (payload without the size prefix) in arrival order.  Raises
        ``FrameTooLarge`` / ``MalformedRequest``; the splitter is unusable afterwards."""
        frames: list[memoryview] = []
        if self._have:
            self._chunks.append(data)
            self._have += len(data)
            if not self._need:
                if self._have < 4:
                    return frames
                head = b"".join(self._chunks)
                self._chunks = [head]
                self._need = self._check(_SIZE.unpack_from(head, 0)[0])
            if self._have < self._need:
                return frames
            data = b"".join(self._chunks)
            self._chunks = []
            self._have = self._need = 0
        view = memoryview(data)
        pos = 0
        end = len(data)
        while end - pos >= 4:
            total = self._check(_SIZE.unpack_from(data, pos)[0])
            if end - pos < total:
                break
            frames.append(view[pos + 4 : pos + total])
            pos += total
        if pos < end:
            rest = bytes(view[pos:])
            self._chunks = [rest]
            self._have = len(rest)
            if len(rest) >= 4:
                self._need = self._check(_SIZE.unpack_from(rest, 0)[0])
        return frames


__all__ = ["DEFAULT_MAX_FRAME", "MIN_REQUEST_SIZE", "FrameSplitter"]
