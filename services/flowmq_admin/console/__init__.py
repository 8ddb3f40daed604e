"""The web console: static files served by the admin HTTP listener at ``/`` (docs/console.md).

Invariants:

- The console is files only. Every piece of data it shows comes from the admin API
  (``/api/v1``) and ``/metrics``, fetched by the browser with the admin token it was given at
  sign-in; so the files themselves carry nothing secret and are served without a token, and
  the API's own check on every call is what guards the data. No route here reads the backend.
- Only the files under ``static/`` that exist when the application is built are served, by
  name from a fixed table: a request cannot name a path outside it (no traversal, no
  directory listing) and the content type comes from the table, not from the request.
- Every response carries a Content-Security-Policy that lets the page run only its own
  scripts and styles and talk only to its own origin (no inline script, no CDN, no frame
  embedding), and ``X-Content-Type-Options: nosniff``, so that a message payload shown in the
  page can never run as code. The JavaScript writes data with ``textContent`` only.
- Nothing is fetched from outside at install or run time: the files ship in the package
  (``pyproject.toml`` package-data) and work offline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).with_name("static")
ASSET_PREFIX = "/console/"

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}

_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str


def load_assets(root: Path = STATIC_DIR) -> dict[str, Asset]:
    """Every servable file under ``root``, keyed by its path relative to it ('/'-separated)."""
    assets = {}
    for path in sorted(root.rglob("*")):
        content_type = _CONTENT_TYPES.get(path.suffix)
        if path.is_file() and content_type is not None:
            assets[path.relative_to(root).as_posix()] = Asset(path.read_bytes(), content_type)
    return assets


def _respond(asset: Asset) -> web.Response:
    # no-cache: revalidated on every load, so an upgraded broker's console replaces the old.
    headers = {**SECURITY_HEADERS, "Content-Type": asset.content_type, "Cache-Control": "no-cache"}
    return web.Response(body=asset.body, headers=headers)


def add_routes(app: web.Application) -> None:
    """Serve the console: ``/`` the page, ``/console/<file>`` its assets, ``/dashboard`` a
    redirect to ``/``. Outside ``/api/v1``, so not part of the OpenAPI document."""
    assets = load_assets()
    index = assets.pop("index.html")

    async def page(request: web.Request) -> web.Response:
        return _respond(index)

    async def asset(request: web.Request) -> web.Response:
        found = assets.get(request.match_info["path"])
        if found is None:
            raise web.HTTPNotFound()
        return _respond(found)

    async def dashboard(request: web.Request) -> web.Response:
        raise web.HTTPFound("/", headers=SECURITY_HEADERS)

    app.router.add_get("/", page)
    app.router.add_get("/dashboard", dashboard)
    app.router.add_get(ASSET_PREFIX + "{path:.+}", asset)
