"""The flush process: a flush's object write and meta transaction in a child process, with a GIL
of its own (DESIGN.md §5; the child's side is ``flush_worker``).

Why.  In the flush thread (``flush_thread``), a flush gives up the GIL at every system call
and every SQLite statement, and each time waits to get it back behind the busy event loop:
about a dozen waits per flush, each up to the switch interval.  Traced at 10k MQTT QoS 1
msgs/s into a Stream (``benchmarks/stream_trace.py``): a write + fdatasync that takes
0.13 ms alone took 0.86 ms p50 in the broker, a 0.26 ms transaction 1.48 ms, and the hand-off
to the thread 0.6 ms.  In a child process the same steps wait for nothing, and the broker's
loop sees one socket write per flush and its answers as ordinary reads.

What goes there.  Only flushes whose every run has a ``GroupCommit.portable`` form (plain
stream appends: chunks without hooks), on the file store + SQLite, and only once the child is
up; the others (queues, idempotent producers' chunks) and the flushes meanwhile take the flush
thread.  Both routes commit in order: a flush that changes route waits for the one before it.
The child starts on the first portable flush (or ``GroupCommitBatcher.warm_up``), so a broker
without Streams does not pay for it (about 30 MB).  If it dies, its flushes fail as a store
outage would (their keys are abandoned, nothing is acknowledged) and the next portable flush
starts a new one; one that keeps dying before it is up is restarted less and less often.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from flowmq_meta import MetaError
from flowmq_objstore import ObjectStoreError

log = logging.getLogger(__name__)

FRAME = struct.Struct("!II")
"""A frame's header, both ways: the pickle's length, the raw body's length."""


def encode_frame(message: tuple[Any, ...], body: bytes = b"") -> tuple[bytes, bytes]:
    """A frame's header and pickle (the body follows them as it is)."""
    try:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # an exception that does not pickle: its text does
        if message[0] != "failed":
            raise
        data = pickle.dumps(("failed", MetaError(f"{type(message[1]).__name__}: {exc}")))
    return FRAME.pack(len(data), len(body)), data


# A child that died is replaced no sooner than this after the last start; doubled for each
# start in a row that never got up, up to the cap.
RESTART_GAP_S = 5.0
RESTART_GAP_MAX_S = 300.0


class _Pending:
    __slots__ = ("future", "on_written")

    def __init__(self, future: asyncio.Future[Any], on_written: Callable[[float], None]) -> None:
        self.future = future
        self.on_written = on_written


class FlushProcess:
    """The broker's end of one flush process (see the module docstring)."""

    def __init__(self, objects_root: str, meta: Any) -> None:
        self._objects_root = objects_root
        self._meta = meta
        self._child: asyncio.subprocess.Process | None = None
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, _Pending] = {}
        self._jobs = itertools.count()
        self._buffer = bytearray()
        self._ready = False
        self._starting = False
        self._last_start = float("-inf")
        self._failed_starts = 0
        self._closed = False

    @classmethod
    def for_stores(cls, objects: Any, meta: Any) -> FlushProcess | None:
        """A flush process for the file store + SQLite, else None."""
        from flowmq_meta.sqlite import SqliteMetaStore
        from flowmq_objstore import FileObjectStore

        if type(objects) is FileObjectStore and type(meta) is SqliteMetaStore:
            return cls(objects.root, meta)
        return None

    @property
    def ready(self) -> bool:
        """Up and taking flushes."""
        return self._ready

    def start_soon(self) -> None:
        """Start the child unless it is up or starting (at most once per ``RESTART_GAP_S``)."""
        if self._ready or self._starting or self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on the loop (yet): the next flush starts it
            return
        gap = min(RESTART_GAP_S * 2**self._failed_starts, RESTART_GAP_MAX_S)
        if loop.time() - self._last_start >= gap:
            self._last_start = loop.time()
            self._starting = True
            loop.create_task(self._start())

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        try:
            # Its own session: a terminal's Ctrl-C goes to the broker, whose exit ends it.
            self._child = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "flowmq_commit.flush_worker",
                str(theirs.fileno()),
                self._objects_root,
                self._meta.url,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
            theirs.close()
            await loop.create_connection(lambda: _Protocol(self), sock=ours)
        except Exception:
            log.warning("could not start the flush process; flushes use the flush thread")
            theirs.close()
            ours.close()
            self._starting = False
            self._failed_starts = min(self._failed_starts + 1, 16)

    # -- jobs ---------------------------------------------------------------------------------

    def write_and_commit(
        self,
        key: str,
        body: bytes,
        commit: Callable[[Any], Any],
        on_written: Callable[[float], None],
    ) -> asyncio.Future[Any]:
        """Like ``FlushThread.write_and_commit``; ``commit`` must pickle."""
        future = asyncio.get_running_loop().create_future()
        transport = self._transport
        if transport is None or transport.is_closing():
            future.set_exception(ObjectStoreError("the flush process is not running"))
            return future
        job = next(self._jobs)
        header, data = encode_frame(("flush", job, key, commit), body)
        self._pending[job] = _Pending(future, on_written)
        transport.writelines((header, data, body))
        return future

    def create_ahead(self, keys: list[str]) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.writelines(encode_frame(("reserve", keys)))

    # -- answers ------------------------------------------------------------------------------

    def _connected(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def _received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        pos = 0
        while len(buffer) - pos >= FRAME.size:
            size, _ = FRAME.unpack_from(buffer, pos)
            end = pos + FRAME.size + size
            if len(buffer) < end:
                break
            self._answer(pickle.loads(memoryview(buffer)[pos + FRAME.size : end]))
            pos = end
        del buffer[:pos]

    def _answer(self, answer: tuple[Any, ...]) -> None:
        kind = answer[0]
        if kind == "ready":
            self._ready = True
            self._starting = False
            self._failed_starts = 0
            return
        job = answer[1]
        if kind == "written":
            pending = self._pending.get(job)
            if pending is not None:
                pending.on_written(answer[2])
            return
        pending = self._pending.pop(job, None)
        if kind == "done":
            self._meta.committed_elsewhere(answer[3])
            if pending is not None and not pending.future.done():
                pending.future.set_result(answer[2])
        elif pending is not None and not pending.future.done():
            pending.future.set_exception(answer[2])

    def _lost(self, exc: BaseException | None) -> None:
        if not self._ready:
            self._failed_starts = min(self._failed_starts + 1, 16)
        self._transport = None
        self._ready = False
        self._starting = False
        self._buffer.clear()
        if not self._closed:
            log.warning("the flush process exited (%s); flushes use the flush thread", exc)
        error = MetaError("the flush process exited; the outcome of its flush is unknown")
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(error)
        self._pending.clear()
        child, self._child = self._child, None
        if child is not None and not self._closed:  # (closing: it ends once the jobs are done)
            with contextlib.suppress(OSError):  # (gone already)
                child.kill()

    async def close(self) -> None:
        """End the child after the jobs already sent (the batcher has awaited them)."""
        self._closed = True
        transport, child = self._transport, self._child
        if transport is not None:
            transport.close()
        if child is not None:
            try:
                await asyncio.wait_for(child.wait(), 5.0)
            except TimeoutError:
                with contextlib.suppress(OSError):
                    child.kill()


class _Protocol(asyncio.Protocol):
    def __init__(self, owner: FlushProcess) -> None:
        self._owner = owner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._owner._connected(transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self._owner._received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner._lost(exc)
