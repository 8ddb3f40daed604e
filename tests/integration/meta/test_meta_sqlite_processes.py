"""Several OS processes on one SQLite meta-store file: serializable, no lost updates, and
watches see other processes' commits."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from flowmq_meta import decode_int, open_meta_store
from flowmq_meta.sqlite import BEGIN_MODES

KEY = b"\x02counter\x00"
N = 200

# Each child opens the store, says "ready", waits for "go" on stdin (so both really run at
# once), then does N read-modify-write increments with get + set (no atomic add).
CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from flowmq_meta import decode_int, encode_int, open_meta_store

    KEY = b"\\x02counter\\x00"

    def incr(tr):
        tr.set(KEY, encode_int(decode_int(tr.get(KEY)) + 1))

    async def main(url, n):
        store = open_meta_store(url)
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(n):
            await store.transact(incr)
        print("conflicts", store.conflicts, flush=True)
        await store.close()

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


def run_children(url: str, count: int, n: int) -> list[str]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, url, str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = []
        for proc in procs:
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0
            outputs.append(out.strip())
        return outputs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


@pytest.mark.parametrize("begin", BEGIN_MODES)
async def test_two_processes_no_lost_updates(tmp_path, begin: str) -> None:
    url = f"sqlite:///{tmp_path}/meta.db?begin={begin}"
    outputs = await asyncio.to_thread(run_children, url, 2, N)
    store = open_meta_store(url)
    try:
        assert decode_int(await store.get(KEY)) == 2 * N, outputs
    finally:
        await store.close()


async def test_watch_sees_other_process(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/meta.db"
    store = open_meta_store(url)
    try:
        watch = await store.watch(KEY)
        await asyncio.to_thread(run_children, url, 1, 1)
        await asyncio.wait_for(watch, 5.0)
        assert decode_int(await store.get(KEY)) == 1
    finally:
        await store.close()
