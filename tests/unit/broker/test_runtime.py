"""The broker's process-wide malloc settings: a password check's 16 MiB scrypt buffer goes back
to the OS when the check is done, instead of staying resident in the hashing thread's heap;
the heaps' free pages go back when the broker trims them (``trim_heap``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Two checks in a hashing thread, then the growth of VmRSS in MiB: the first check's buffer
# is mapped and unmapped under every setting; from the second on glibc's default keeps it.
_CHECKS = textwrap.dedent(
    """
    import asyncio, sys
    from flowmq_broker.runtime import fix_mmap_threshold
    from flowmq_meta.users import hash_password, off_loop, verify_password

    def rss_kib():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])

    async def main():
        stored = hash_password("secret")
        before = rss_kib()
        for _ in range(3):
            assert await off_loop(verify_password, stored, "secret")
        print((rss_kib() - before) / 1024)

    if sys.argv[1] == "fixed":
        assert fix_mmap_threshold()
    asyncio.run(main())
    """
)


# 80 MB of C-heap blocks (Python objects over 512 bytes) freed but for one in 200, which keep
# the heap's top in use; then the drop of VmRSS in MiB.
_FREED = textwrap.dedent(
    """
    import sys
    from flowmq_broker.runtime import trim_heap

    def rss_kib():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])

    blocks = [bytes(2000) for _ in range(40_000)]
    kept = blocks[::200]
    del blocks
    before = rss_kib()
    if sys.argv[1] == "trimmed":
        assert trim_heap()
    print((before - rss_kib()) / 1024)
    """
)


def _run_mib(script: str, setting: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", script, setting], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_password_check_gives_its_scrypt_buffer_back():
    assert _run_mib(_CHECKS, "default") > 12  # the condition this setting is for
    assert _run_mib(_CHECKS, "fixed") < 4


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_trimming_gives_freed_heap_pages_back():
    assert _run_mib(_FREED, "kept") < 8  # glibc alone keeps pages below a block in use
    assert _run_mib(_FREED, "trimmed") > 60
