"""The admin API's Bearer token: configured, or generated once and kept in the data dir."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

TOKEN_FILE = "admin_token"


def load_or_create_token(configured: str, data_dir: Path) -> tuple[str, bool]:
    """Return ``(token, generated_now)``; a generated token is written with mode 0600."""
    if configured:
        return configured, False
    path = data_dir / TOKEN_FILE
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token, False
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token, True
