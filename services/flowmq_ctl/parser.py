"""Argument parsing shared by every ``flowmq`` command: one-line usage errors (exit 2) and
the connection and output options every admin command takes after its verb."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from flowmq_ctl.output import FORMATS


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"flowmq: {message} (see '{self.prog} --help')\n")
        sys.exit(2)


def common_options() -> argparse.ArgumentParser:
    """``--url``, ``--token``, ``-o``: a parent of every admin command's parser.  Defaults are
    suppressed, so an option given before the verb is not reset by the verb's parser."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection and output")
    group.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help="admin API base URL (env FLOWMQ_URL; default: the HTTP port in ./data/ports.json, "
        "else http://127.0.0.1:8080)",
    )
    group.add_argument(
        "--token",
        default=argparse.SUPPRESS,
        help="admin token (env FLOWMQ_TOKEN; default: ./data/admin_token)",
    )
    group.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default=argparse.SUPPRESS,
        help="output format (default table)",
    )
    return common
