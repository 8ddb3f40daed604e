"""The version of the installed ``flowmq`` distribution (brokers report it, the CLI too)."""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version


@cache
def flowmq_version() -> str:
    try:
        return version("flowmq")
    except PackageNotFoundError:  # running from a source tree without install
        return "0.0.0"
