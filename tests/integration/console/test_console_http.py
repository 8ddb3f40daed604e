"""The web console over plain HTTP: served at ``/`` with its security headers, assets without
a token while data still needs one, nothing fetched from outside, every file shipped."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from flowmq_admin.app import create_app
from flowmq_admin.console import ASSET_PREFIX, STATIC_DIR, load_assets

ROOT = Path(__file__).resolve().parents[3]
CONSOLE_FILES = sorted(p for p in STATIC_DIR.rglob("*") if p.is_file())


@pytest.fixture
async def client():
    # No backend: nothing the console serves may need one.
    app = create_app(backend=None, token="secret")  # type: ignore[arg-type]
    async with TestClient(TestServer(app)) as client:
        yield client


def assert_console_headers(response) -> None:
    csp = response.headers["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'"  # no inline script, no eval, no CDN
    assert directives["style-src"] == "'self'"
    assert directives["connect-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in csp
    assert response.headers["X-Content-Type-Options"] == "nosniff"


async def test_root_serves_the_page_with_a_strict_csp(client):
    response = await client.get("/")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/html")
    assert_console_headers(response)
    page = await response.text()
    assert "<title>FlowMQ console</title>" in page
    # Every script is a file of the console's own; none is inline.
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page, re.S)
    assert scripts and all(
        'src="/console/' in attrs and not body.strip() for attrs, body in scripts
    )
    assert not re.search(r"\son[a-z]+\s*=", page), "inline event handler"
    assert not re.search(r"\sstyle\s*=", page), "inline style"


async def test_dashboard_redirects_to_the_console(client):
    response = await client.get("/dashboard", allow_redirects=False)
    assert response.status == 302 and response.headers["Location"] == "/"
    followed = await client.get("/dashboard")
    assert followed.status == 200 and str(followed.url).endswith("/")


async def test_every_asset_is_served_without_a_token_and_data_still_needs_one(client):
    page = await (await client.get("/")).text()
    assets = load_assets()
    referenced = set(re.findall(r'(?:src|href)="(/console/[^"]+)"', page))
    assert referenced and referenced <= {ASSET_PREFIX + name for name in assets}
    for name, asset in assets.items():
        if name == "index.html":
            continue
        response = await client.get(ASSET_PREFIX + name)
        assert response.status == 200, name
        assert response.headers["Content-Type"] == asset.content_type
        assert_console_headers(response)
        assert await response.read() == (STATIC_DIR / name).read_bytes()
    for path in ("/api/v1/streams", "/api/v1/users", "/api/v1/clients", "/api/v1/namespaces"):
        response = await client.get(path)
        assert response.status == 401, path
        assert (await response.json())["error"]["code"] == "unauthorized"


async def test_only_the_console_files_are_served(client):
    for path in (
        "/console/",
        "/console/nothing.js",
        "/console/../app.py",
        "/console/%2e%2e/__init__.py",
        "/console/..%2f__init__.py",
        "/console/__init__.py",
        "/console/index.html/",
    ):
        response = await client.get(path)
        assert response.status == 404, path
        assert (await response.json())["error"]["code"] == "not_found"


async def test_no_console_without_the_admin_role():
    app = create_app(backend=None, token="secret", admin=False)  # type: ignore[arg-type]
    async with TestClient(TestServer(app)) as client:
        for path in ("/", "/dashboard", "/console/js/main.js"):
            assert (await client.get(path, allow_redirects=False)).status == 404, path


def test_module_imports_resolve_to_shipped_files():
    assets = load_assets()
    for path in CONSOLE_FILES:
        if path.suffix != ".js":
            continue
        for target in re.findall(r'from\s+"(\./[^"]+)"', path.read_text()):
            resolved = (path.parent / target).resolve().relative_to(STATIC_DIR).as_posix()
            assert resolved in assets, f"{path.name} imports missing {target}"


# An address outside the broker: a scheme, a protocol-relative URL, a CDN, a web font.
EXTERNAL = re.compile(r"https?://|[\"'(=]\s*//[\w.-]|//cdn|@import|url\(\s*[\"']?(?!data:)[^)\s]")


def test_console_files_reference_no_external_url():
    assert CONSOLE_FILES
    for path in CONSOLE_FILES:
        text = path.read_text()
        found = EXTERNAL.search(text)
        assert found is None, (
            f"{path.relative_to(STATIC_DIR)}: {text[found.start() - 40 : found.end() + 40]!r}"
        )
    # The scan itself finds what it is there for.
    for bad in ('src="https://cdn.example/x.js"', "fetch('//cdn.example')", "url(http://x/f.woff)"):
        assert EXTERNAL.search(bad), bad


def test_every_console_file_ships_in_the_package():
    """The package-data globs in pyproject.toml match every file of the console, so the
    wheel and the editable install both carry it."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["flowmq_admin"]
    package = STATIC_DIR.parent.parent
    shipped = {p for pattern in patterns for p in package.glob(pattern) if p.is_file()}
    assert set(CONSOLE_FILES) <= shipped, set(CONSOLE_FILES) - shipped
