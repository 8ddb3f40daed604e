"""The flush process: a child of the broker that writes the batcher's objects and commits their
transactions with a GIL of its own (``flush_process`` is the broker's side; DESIGN.md §5).

    python -m flowmq_commit.flush_worker FD OBJECTS_ROOT META_URL

``FD`` is the child's end of a socket pair with the broker.  Both directions carry frames:
a header (``FRAME``: the pickle's length, the raw body's length), a pickle, then the body.
The broker sends ``("reserve", keys)`` (create objects ahead, no answer) and
``("flush", key, commit)`` with the object's bytes as the body; the child answers each flush
with ``("written", seconds)`` once the object is durable and ``("done", results, changes)``
once the transaction (``commit``: a picklable callable of a transaction) committed, or with
``("failed", exception)`` instead of either.  ``changes`` is what the transaction wrote, for
the broker's watches.  As in the flush thread, the transaction's statements run beside the
write and its COMMIT waits for the write's fdatasync (``WriteGate``).  Jobs run one at a time, in order.  The
child ends when the broker's end closes (the broker exited, or closed it).
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import socket
import sys
import time
from typing import Any, BinaryIO

from flowmq_commit.flush_process import FRAME, encode_frame
from flowmq_commit.flush_thread import WriteGate

log = logging.getLogger("flowmq.flush_process")


def _read_exactly(reader: BinaryIO, n: int) -> bytes | None:
    data = reader.read(n)
    return data if data is not None and len(data) == n else None


def serve(sock: socket.socket, objects_root: str, meta_url: str) -> None:
    from flowmq_commit.flush_txn import commit_flush  # noqa: F401 - the pickles name it
    from flowmq_meta.sqlite import SqliteMetaStore
    from flowmq_objstore.file import FileObjectStore

    objects = FileObjectStore(objects_root)
    meta = SqliteMetaStore.from_url(meta_url)
    reader = sock.makefile("rb", buffering=1 << 16)

    def send(message: tuple[Any, ...]) -> None:
        sock.sendall(b"".join(encode_frame(message)))

    send(("ready",))
    while True:
        header = _read_exactly(reader, FRAME.size)
        if header is None:
            return
        size, body_size = FRAME.unpack(header)
        data = _read_exactly(reader, size)
        body = _read_exactly(reader, body_size) if body_size else b""
        if data is None or body is None:
            return
        job = pickle.loads(data)
        if job[0] == "reserve":
            try:
                objects.reserve_blocking(job[1])
            except Exception:
                log.warning("could not create objects ahead; their flushes write them whole")
            continue
        _, key, commit = job
        # The statements run beside the write; COMMIT waits for its fdatasync.
        gate = WriteGate()
        transaction = meta.transact_in_thread(commit, gate.wait)
        try:
            started = time.perf_counter()
            objects.write_blocking(key, body)
        except Exception as exc:
            gate.open(exc)
            send(("failed", exc))
            with contextlib.suppress(Exception):
                transaction.result()  # rolled back by the gate
            continue
        gate.open(None)
        send(("written", time.perf_counter() - started))
        try:
            results, changes = transaction.result()
        except Exception as exc:
            send(("failed", exc))
            continue
        send(("done", results, changes))


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    fd, objects_root, meta_url = int(argv[1]), argv[2], argv[3]
    with socket.socket(fileno=fd) as sock:
        try:
            serve(sock, objects_root, meta_url)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the broker is gone


if __name__ == "__main__":
    main(sys.argv)
