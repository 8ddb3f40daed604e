"""The flush process: a child of the broker that writes the batcher's objects and commits their
transactions with a GIL of its own (``flush_process`` is the broker's side; DESIGN.md §5).

    python -m flowmq_commit.flush_worker FD OBJECTS_ROOT META_URL

``FD`` is the child's end of a socket pair with the broker.  Both directions carry frames:
a header (``FRAME``: the pickle's length, the raw body's length), a pickle, then the body.
The broker sends ``("reserve", keys)`` (create objects ahead, no answer) and
``("flush", job, key, commit)`` with the object's bytes as the body; the child answers each
flush with ``("written", job, seconds)`` once the object is durable and
``("done", job, results, changes)`` once the transaction (``commit``: a picklable callable of
a transaction) committed, or with ``("failed", job, exception)`` instead of either.
``changes`` is what the transaction wrote, for the broker's watches.  As in the flush thread,
the transaction's statements run beside the write and its COMMIT waits for the write's
fdatasync (``WriteGate``).  Writes run one at a time in order, and so do transactions (in the
meta store's one thread); a job's write may run while the job before commits.  The child
ends when the broker's end closes (the broker exited, or closed it), once its transactions
are over.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import pickle
import socket
import sys
import threading
import time
from typing import Any, BinaryIO

from flowmq_commit.flush_process import FRAME, encode_frame
from flowmq_commit.flush_thread import WriteGate

log = logging.getLogger("flowmq.flush_process")


def _read_exactly(reader: BinaryIO, n: int) -> bytes | None:
    data = reader.read(n)
    return data if data is not None and len(data) == n else None


def serve(sock: socket.socket, objects_root: str, meta_url: str) -> None:
    from flowmq_meta.sqlite import SqliteMetaStore
    from flowmq_objstore.file import FileObjectStore

    objects = FileObjectStore(objects_root)
    meta = SqliteMetaStore.from_url(meta_url)
    reader = sock.makefile("rb", buffering=1 << 16)
    sending = threading.Lock()
    unanswered: set[concurrent.futures.Future[Any]] = set()

    def send(message: tuple[Any, ...]) -> None:
        frame = b"".join(encode_frame(message))
        with sending:
            sock.sendall(frame)

    def answer(job: int, transaction: concurrent.futures.Future[Any]) -> None:
        """In the meta store's thread once the transaction is over (in job order)."""
        unanswered.discard(transaction)
        exc = transaction.exception()
        with contextlib.suppress(OSError):  # the broker is gone: nobody to tell
            if exc is not None:
                send(("failed", job, exc))
            else:
                results, changes = transaction.result()
                send(("done", job, results, changes))

    send(("ready",))
    while True:
        header = _read_exactly(reader, FRAME.size)
        if header is None:
            break
        size, body_size = FRAME.unpack(header)
        data = _read_exactly(reader, size)
        body = _read_exactly(reader, body_size) if body_size else b""
        if data is None or body is None:
            break
        request = pickle.loads(data)
        if request[0] == "reserve":
            try:
                objects.reserve_blocking(request[1])
            except Exception:
                log.warning("could not create objects ahead; their flushes write them whole")
            continue
        _, job, key, commit = request
        # The statements run beside the write and COMMIT waits for its fdatasync; the next
        # job's write starts while this one commits.  A failed write fails the transaction
        # with the write's error, which ``answer`` reports.
        gate = WriteGate()
        transaction = meta.transact_in_thread(commit, gate.wait)
        unanswered.add(transaction)
        transaction.add_done_callback(functools.partial(answer, job))
        try:
            started = time.perf_counter()
            objects.write_blocking(key, body)
        except Exception as exc:
            gate.open(exc)
            continue
        # Told before the gate opens, so that it always comes before "done".
        send(("written", job, time.perf_counter() - started))
        gate.open(None)
    concurrent.futures.wait(list(unanswered))


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
