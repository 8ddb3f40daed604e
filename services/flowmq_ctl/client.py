"""The admin API as the CLI sees it: where it is, the token, and one call per request.

Where: ``--url``, else ``FLOWMQ_URL``, else the HTTP port in ``./data/ports.json`` (what a
``flowmq serve`` in this directory bound), else ``http://127.0.0.1:8080``.  Token: ``--token``,
else ``FLOWMQ_TOKEN``, else ``./data/admin_token``.  Plain ``urllib``: the CLI starts fast and
needs no event loop.

Errors are one of two kinds, which decide the exit code (``main``): ``Refused`` — the broker
answered with an error envelope (exit 1) — and ``Unreachable`` — no answer at all (exit 2).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8080"
DATA_DIR = Path("data")
TIMEOUT_S = 15.0


class CliError(Exception):
    """A failure the CLI reports as one line on stderr; ``exit_code`` is what it exits with."""

    exit_code = 1


class Refused(CliError):
    """The broker answered with an error (not found, conflict, validation …)."""

    exit_code = 1

    def __init__(self, message: str, status: int, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class Unreachable(CliError):
    """No answer from the broker (nothing listening, timeout, not an admin API)."""

    exit_code = 2


class UsageError(CliError):
    """The command line itself is wrong (caught before any request)."""

    exit_code = 2


def _read_ports(data_dir: Path) -> dict[str, Any]:
    try:
        ports = json.loads((data_dir / "ports.json").read_text())
    except (OSError, ValueError):
        return {}
    return ports if isinstance(ports, dict) else {}


@dataclass(frozen=True)
class Target:
    url: str  # base URL, no trailing slash, e.g. http://127.0.0.1:8080
    token: str
    mqtt_port: int | None = None  # from ports.json, for ``flowmq tail``

    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.url).hostname or "127.0.0.1"


def resolve_target(
    url: str | None, token: str | None, data_dir: Path = DATA_DIR, env: Any = None
) -> Target:
    env = os.environ if env is None else env
    ports = _read_ports(data_dir)
    url = url or env.get("FLOWMQ_URL")
    if not url:
        http = ports.get("http")
        url = f"http://127.0.0.1:{http}" if isinstance(http, int) else DEFAULT_URL
    if "://" not in url:
        url = "http://" + url
    token = token or env.get("FLOWMQ_TOKEN")
    if not token:
        try:
            token = (data_dir / "admin_token").read_text().strip()
        except OSError:
            token = ""
    mqtt = ports.get("mqtt")
    return Target(url.rstrip("/"), token, mqtt if isinstance(mqtt, int) else None)


def quote(part: str, safe: str = "") -> str:
    return urllib.parse.quote(part, safe=safe)


class Api:
    def __init__(self, target: Target, timeout: float = TIMEOUT_S) -> None:
        self.target = target
        self.timeout = timeout

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        """The ``data`` of the answer; raises ``Refused`` or ``Unreachable``."""
        url = f"{self.target.url}/api/v1{path}"
        if query:
            given = {k: v for k, v in query.items() if v is not None}
            if given:
                url += "?" + urllib.parse.urlencode(given)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.target.token:
            request.add_header("Authorization", f"Bearer {self.target.token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                raw = response.read()
                status = response.status
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            status = exc.code
        except urllib.error.URLError as exc:
            reason = getattr(exc.reason, "strerror", None) or str(exc.reason)
            raise Unreachable(f"cannot reach the broker at {self.target.url}: {reason}") from None
        except (TimeoutError, OSError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise Unreachable(f"cannot reach the broker at {self.target.url}: {reason}") from None
        return self._unwrap(status, raw)

    def _unwrap(self, status: int, raw: bytes) -> Any:
        try:
            envelope = json.loads(raw)
            success = envelope["success"]
        except (ValueError, TypeError, KeyError):
            raise Unreachable(
                f"{self.target.url} answered HTTP {status} without the admin API's JSON "
                f"envelope: is it a FlowMQ broker's HTTP port?"
            ) from None
        if success:
            return envelope.get("data")
        error = envelope.get("error") or {}
        message = str(error.get("message") or f"HTTP {status}")
        code = str(error.get("code") or "")
        if status == 401:
            message += " (give the admin token with --token or FLOWMQ_TOKEN)"
        raise Refused(message, status, code)
