"""What every command handler gets: the admin API client, the output format, the target."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import TextIO

from flowmq_ctl.client import Api, Target, resolve_target


@dataclass
class Context:
    api: Api
    target: Target
    fmt: str = "table"
    namespace: str | None = None  # None: the server's default namespace
    out: TextIO = field(default_factory=lambda: sys.stdout)

    @property
    def ns_query(self) -> dict[str, str | None]:
        return {"namespace": self.namespace}


def context_of(args: argparse.Namespace) -> Context:
    target = resolve_target(getattr(args, "url", None), getattr(args, "token", None))
    return Context(
        api=Api(target),
        target=target,
        fmt=getattr(args, "output", "table"),
        namespace=getattr(args, "namespace", None),
    )
