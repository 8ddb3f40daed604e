"""Interpreter settings for a broker process, applied once by ``flowmq serve``."""

from __future__ import annotations

import ctypes
import functools
import gc
import sys
from collections.abc import Callable

_GC_GEN2_THRESHOLD = 1000
_SWITCH_INTERVAL_S = 0.001
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
MMAP_THRESHOLD_BYTES = 4 << 20
"""Blocks of this size or more always get their own mapping, unmapped when freed."""
HEAP_TRIM_INTERVAL_S = 10.0
"""How often the broker gives the C heap's free pages back (``trim_heap``)."""


def tune_interpreter() -> None:
    """Process-wide interpreter settings for a message broker (measured with
    ``benchmarks/amqp_bench.py``, 1 publisher / 1 consumer: 22k -> ~39k msgs/s, p99 83 ->
    ~16 ms).

    Every AMQP message allocates a few dozen tracked objects (``Message``, futures,
    deliveries) that live a flush or two: long enough to be promoted, so full collections
    ran every few thousand messages and each walked the whole broker heap (a third of the
    event loop at 30k msgs/s, and most of the p99).  Almost all of them are freed by
    reference counting; cycles are still collected, just less often.

    The meta store and object store threads need the GIL back after every fsync, and with
    the default 5 ms switch interval they waited up to that long behind a busy event loop
    before committing a flush, which the publishers' confirms (and so their windows) wait
    for."""
    g0, g1, g2 = gc.get_threshold()
    if g2 < _GC_GEN2_THRESHOLD:
        gc.set_threshold(g0, g1, _GC_GEN2_THRESHOLD)
    if sys.getswitchinterval() > _SWITCH_INTERVAL_S:
        sys.setswitchinterval(_SWITCH_INTERVAL_S)
    fix_mmap_threshold()


def fix_mmap_threshold() -> bool:
    """Give large blocks back to the OS when they are freed (glibc only; False elsewhere).

    glibc serves a block of 128 KiB or more with its own mapping until the first such block
    is freed, and then raises that threshold to the freed block's size (up to 32 MiB) and
    its heap trim threshold to twice that.  Every password check runs scrypt, which takes a
    16 MiB block (RFC 7914, N=2^14, r=8): after the first one, each check's 16 MiB came from
    the hashing thread's heap and stayed resident for the life of the process (+16 MiB RSS
    per hashing thread; measured with ``benchmarks/fuzz.py``, mallinfo2: 17 MiB free in the
    arenas after 100k fuzzed AMQP frames).  A fixed threshold turns that adjustment off:
    scrypt's buffer is mapped and unmapped per check (a few ms of page faults next to its
    ~50 ms), blocks below 4 MiB (every message and frame buffer) still come from the heaps,
    and heaps are trimmed at glibc's default 128 KiB again."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return trim


def trim_heap() -> bool:
    """Give the free pages inside the C heaps back to the OS (glibc's ``malloc_trim(0)``;
    False where there is none).  glibc returns only the free top of a heap by itself; pages
    freed below a block still in use stay resident: after a busy minute (1M fuzzed MQTT
    frames, ``benchmarks/fuzz.py``) 2-4 MiB of the heaps were free and resident.  A call
    walks the heaps' free lists: 0.1-1 ms there, so the broker makes it every
    ``HEAP_TRIM_INTERVAL_S``, never per message.  Python's own allocator (objects of up to
    512 bytes) keeps its arenas either way."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
