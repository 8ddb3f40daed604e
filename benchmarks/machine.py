"""What a benchmark says about the machine it ran on (DESIGN.md §11): ratios move with the
machine, so every table is printed beside the interpreter's speed and the CPU model."""

from __future__ import annotations

import math
import platform
import time
from pathlib import Path


def interpreter_speed() -> float:
    """Million iterations per second of a small pure-Python loop (best of 5)."""

    def work(n: int) -> int:
        table: dict[int, bytes] = {}
        topic = b"site/7/device/42/telemetry"
        for i in range(n):
            table[i & 255] = topic[i & 7 :]
        return len(table)

    n = 300_000
    best = math.inf
    for _ in range(5):
        t = time.perf_counter()
        work(n)
        best = min(best, time.perf_counter() - t)
    return n / best / 1e6


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"
