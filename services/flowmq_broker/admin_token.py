"""The admin API's Bearer token: configured, or generated once and kept in the data dir.

Several processes may start on one data dir at once (host mode, ``flowmq cluster``, two
brokers by hand), so the first generation is race-free: the token is written whole to a
private temporary file and linked into place, which fails if another process got there first;
the loser then uses the winner's token.  Nobody ever reads a half-written file."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from flowmq_meta.tokens import new_secret

TOKEN_FILE = "admin_token"


def load_or_create_token(configured: str, data_dir: Path) -> tuple[str, bool]:
    """Return ``(token, generated_now)``; a generated token is written with mode 0600."""
    if configured:
        return configured, False
    path = data_dir / TOKEN_FILE
    token = _read(path)
    if token:
        return token, False
    token = new_secret()
    tmp = data_dir / f".{TOKEN_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            existing = _read(path)
            if existing:  # another process generated it first
                return existing, False
            os.replace(tmp, path)  # an empty file left by a crash: ours replaces it
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return token, True


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""
