"""The web console in headless Chromium (Debian's chromium and chromium-driver, driven by
selenium) against a real broker process: sign in, create a stream, publish to it, watch its
count rise, read the message back, delete the stream; a screenshot of every page."""

from __future__ import annotations

import json
import re
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.broker_process import start_broker

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
TOKEN = "console-test-token"
STREAM = "console.test"
TOPIC = "console/test"
# Markup on purpose: the console must show it as text, never render it.
PAYLOAD = "hello from the console <b>not bold</b>"
WAIT = 15  # s; the console refreshes the shown page every 3 s
RATE = re.compile(r"[0-9]+\.[0-9]")

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
    "chromium-driver; .ci/run installs them)",
)


@pytest.fixture
def broker(tmp_path):
    broker = start_broker(tmp_path / "data", "--admin-token", TOKEN)
    yield broker
    broker.stop()


@pytest.fixture
def browser(tmp_path):
    # Imported here: a missing selenium fails this test, not the collection of the suite.
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert CHROMEDRIVER.exists(), "chromium is installed but chromium-driver is not"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,900",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # A driver path given: selenium does not look for (or download) one.
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()
    shutil.rmtree(tmp_path / "chromium-profile", ignore_errors=True)


class Console:
    """The console as a person uses it: find, type, click, wait for what shows."""

    def __init__(self, driver, shots: Path) -> None:
        from selenium.common.exceptions import (
            NoSuchElementException,
            StaleElementReferenceException,
        )
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver = driver
        self.shots = shots
        self.by = By
        self.alert_is_present = expected_conditions.alert_is_present
        # A refresh replaces the tables every 3 s: an element found just before may be stale.
        self.wait = WebDriverWait(
            driver,
            WAIT,
            poll_frequency=0.1,
            ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
        )

    def find(self, css: str):
        return self.wait.until(lambda d: d.find_element(self.by.CSS_SELECTOR, css))

    def all(self, css: str):
        return self.driver.find_elements(self.by.CSS_SELECTOR, css)

    def text_of(self, css: str, expected: str, what: str):
        def shows(driver):
            found = driver.find_elements(self.by.CSS_SELECTOR, css)
            return found and expected in found[0].text and found[0].text

        return self.wait.until(shows, f"{what}: {expected!r} not in {css}")

    def gone(self, css: str, what: str) -> None:
        self.wait.until(lambda d: not d.find_elements(self.by.CSS_SELECTOR, css), what)

    def fill(self, form: str, **values: str) -> None:
        for name, value in values.items():
            field = self.find(f"form#{form} [name={name}]")
            field.clear()
            field.send_keys(value)
        self.find(f"form#{form} button[type=submit]").click()

    def go(self, tab: str) -> None:
        self.find(f"#tab-{tab}").click()
        self.wait.until(lambda d: "active" in self.find(f"#tab-{tab}").get_attribute("class"))

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        assert self.driver.save_screenshot(str(path)), name
        return path


def acls_served(base: str) -> bool:
    try:
        api(base, "GET", "/acls")
        return True
    except urllib.error.HTTPError as exc:
        assert exc.code == 404, exc.code
        return False


def test_console_round_trip_in_chromium(broker, browser, tmp_path):
    shots = tmp_path / "screenshots"
    shots.mkdir()
    ui = Console(browser, shots)
    taken = []

    # Sign in: a wrong token shows the API's error envelope; the right one opens the console.
    browser.get(broker.http + "/dashboard")
    assert browser.current_url == broker.http + "/"
    ui.find("#token").send_keys("not-the-token")
    ui.find("#signin-button").click()
    ui.text_of("#signin-error", "unauthorized: invalid admin token", "wrong token")
    taken.append(ui.shot("signin"))
    ui.find("#token").clear()
    ui.find("#token").send_keys(TOKEN)
    ui.find("#signin-button").click()
    ui.text_of("#nodes-value", "1 / 1", "overview: this node up")
    assert browser.execute_script("return sessionStorage.getItem('flowmq.token')") == TOKEN
    ui.text_of("#node", broker.ports["node_id"], "header: node id")
    ui.text_of("#rate-in-detail", "since start", "overview: message counters from /metrics")
    ui.text_of("#storage-detail", "0 streams", "overview: storage")
    taken.append(ui.shot("overview"))

    # The ACLs tab is there exactly when the broker serves /api/v1/acls.
    assert bool(ui.all("#tab-acls")) == acls_served(broker.http)

    # Create a stream; creating it again shows the API's error.
    ui.go("streams")
    ui.fill("stream-create", name=STREAM, partitions="1")
    row = f'#streams-list tr[data-name="{STREAM}"]'
    ui.text_of(f"{row} td.messages", "0", "new stream listed with no messages")
    ui.text_of("#banner", f"Created stream {STREAM} ({TOPIC})", "create notice")
    ui.fill("stream-create", name=STREAM)
    ui.text_of("#banner", "already_exists", "duplicate stream refused")

    # Publish a test message to the stream's topic.
    ui.go("publish")
    ui.fill("publish-form", topic=TOPIC, payload=PAYLOAD)
    ui.text_of("#banner", f"Published to {TOPIC}: 1 destination(s)", "publish notice")
    ui.text_of("#publish-result", STREAM, "publish result names the stream")
    taken.append(ui.shot("publish"))

    # Its count rises on the streams page; and again, with the page left open, when another
    # message comes in (the console refreshes the live counts).
    ui.go("streams")
    ui.wait.until(lambda d: ui.find(f"{row} td.messages").text == "1", "count rose to 1")
    api(broker.http, "POST", f"/topics/{TOPIC.replace('/', '%2F')}/messages", {"payload": "2nd"})
    ui.wait.until(lambda d: ui.find(f"{row} td.messages").text == "2", "count rose to 2")
    taken.append(ui.shot("streams"))

    # Browse it: the payload shows as text at offset 0.
    ui.find(f"{row} td.name a").click()
    ui.text_of("#records tbody td.value", PAYLOAD, "record payload shown as text")
    assert not ui.all("#records tbody td.value b"), "payload markup was rendered"
    assert ui.find("#records tbody td.offset").text == "0"
    ui.text_of("#stream-summary", "2 messages", "stream summary")
    assert [c.text for c in ui.all("#records tbody td.value")] == [PAYLOAD, "2nd"]
    taken.append(ui.shot("stream-browser"))

    # Message rates: the overview reads /metrics at each refresh; a message published
    # between two reads shows as a rate above zero.
    ui.go("overview")
    ui.text_of("#rate-in-detail", "2 since start", "published count from /metrics")
    ui.wait.until(lambda d: RATE.fullmatch(ui.find("#rate-in-value").text), "first rate")
    api(broker.http, "POST", f"/topics/{TOPIC.replace('/', '%2F')}/messages", {"payload": "3rd"})
    ui.wait.until(lambda d: float(ui.find("#rate-in-value").text) > 0, "rate above zero")
    ui.text_of("#storage-detail", "3 messages in 1 stream", "overview storage")
    taken.append(ui.shot("overview-rates"))

    # The other pages render with this broker's data.
    for tab, css, text in (
        ("queues", "#queues-list", "No queues"),
        ("groups", "#groups-list", "No consumer groups"),
        ("clients", "#clients-list", "No client connections"),
        ("users", "#users-list", "No users"),
    ):
        ui.go(tab)
        ui.text_of(css, text, f"{tab} page")
        taken.append(ui.shot(tab))
    if ui.all("#tab-acls"):
        ui.go("acls")
        ui.find("#acls-list")
        taken.append(ui.shot("acls"))

    # Delete the stream (confirmed): gone from the list.
    ui.go("streams")
    ui.find(f"{row} td.actions button.danger").click()
    ui.wait.until(ui.alert_is_present(), "delete asks to confirm").accept()
    ui.gone(row, "deleted stream still listed")
    ui.text_of("#streams-list", "No streams in this namespace.", "empty list")
    taken.append(ui.shot("streams-after-delete"))
    assert api(broker.http, "GET", "/streams") == []

    # The page ran without a script error or a Content-Security-Policy refusal.
    problems = [
        entry["message"]
        for entry in browser.get_log("browser")
        if entry["level"] == "SEVERE" and "Failed to load resource" not in entry["message"]
    ]
    assert problems == [], problems

    # Signing out forgets the token.
    ui.find("#signout").click()
    ui.find("#token")
    assert browser.execute_script("return sessionStorage.getItem('flowmq.token')") is None

    for path in taken:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000, path


def api(base: str, method: str, path: str, body: dict | None = None):
    request = urllib.request.Request(
        f"{base}/api/v1{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)["data"]
