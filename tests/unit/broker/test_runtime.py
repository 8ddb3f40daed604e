"""The broker's process-wide malloc setting: a password check's 16 MiB scrypt buffer goes back
to the OS when the check is done, instead of staying resident in the hashing thread's heap."""

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


def _growth_mib(setting: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", _CHECKS, setting], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_password_check_gives_its_scrypt_buffer_back():
    assert _growth_mib("default") > 12  # the condition this setting is for
    assert _growth_mib("fixed") < 4
