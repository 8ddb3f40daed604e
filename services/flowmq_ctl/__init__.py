"""``flowmq``'s operator commands: the admin REST API from the command line.

Layout: ``client`` (where the API is, the token, one request), ``output`` (table, JSON,
YAML), ``parser`` (one-line usage errors, the shared options), ``commands`` (the parsers),
``resources`` (streams, queues, groups, clients, users, cluster), ``messaging`` (produce,
consume), ``tail`` (a minimal MQTT 3.1.1 subscriber on our codec), ``completion``.

Exit codes: 0 done; 1 the broker refused (not found, conflict, invalid); 2 usage error or no
answer from the broker.  Every error is one line on stderr, starting ``flowmq:``.
"""

from __future__ import annotations

import argparse
import sys

from flowmq_ctl.client import CliError
from flowmq_ctl.context import context_of


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the admin command ``args`` was parsed into (it has a ``handler``)."""
    try:
        if getattr(args, "local", False):
            return args.handler(args, parser)
        return args.handler(args, context_of(args))
    except CliError as exc:
        sys.stderr.write(f"flowmq: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. flowmq consume … | head
        return 0
