"""The operations console (issue 22) in a real browser: headless Chromium driven by Selenium
against a console served over HTTP on a free port, from a store on disk.

What the pages show is compared with the Store's own answers to the same question
(find_by_key, search, read, trace, group_lag), read here through the Python API, never with
figures written into the test. The tests read the DOM (docs/console.md "DOM contract"); each
also saves a screenshot of its page under its tmp_path, and into $MQCORE_CONSOLE_SCREENSHOTS
with a stable name when that is set (how docs/console/*.png are made).

Chromium and its driver come from Debian (`make test-tools` installs chromium and
chromium-driver as root); without them every test here skips and says so. One browser serves
the module; every wait is an explicit WebDriverWait on the DOM (mostly `table#results`'s
data-state), never a sleep.
"""

from __future__ import annotations

import datetime
import os
import re
import selectors
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import child_env

import mqcore

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
    pytest.skip(
        f"no {CHROMIUM} or {CHROMEDRIVER}: `make test-tools` installs Debian's chromium and "
        "chromium-driver (as root)",
        allow_module_level=True,
    )
pytest.importorskip("selenium", reason="selenium is missing (pip install 'mqcore[test]')")
pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytest.importorskip("jinja2", reason="the server extra (jinja2) is missing")

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import (  # noqa: E402
    NoAlertPresentException,
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

from mqcore.server.console import browse  # noqa: E402
from mqcore.server.http import HttpServer, create_app  # noqa: E402

UTC = datetime.timezone.utc
T0 = 1_789_999_980_000  # ms, a whole minute (2026-09-21T14:13:00Z): datetime-local can say it
WAIT = 30  # seconds an explicit wait may take on a loaded 2-core machine before it fails
ORDERS = 600  # over 3 partitions
KEYS = 40
PAGING = 10_000
SCAN_MESSAGES = 1_000_000  # a regex over these takes many 0.3 s chunks
TAGS = ("paid", "shipped", "refund")
XSS_VALUES = (
    b"<img src=x onerror=alert(1)>",
    b"<script>window.__xss = 1; alert(2)</script>",
    b'"><svg onload=alert(3)>',
)
XSS_KEY = b"<b onmouseover=alert(4)>key</b>"


# -- the data -----------------------------------------------------------------------------------


def order_value(i: int) -> bytes:
    status = TAGS[i % 3]
    extra = b" needle" if i % 37 == 0 else b""
    return b"order %d status %s%s" % (i, status.encode(), extra)


def build_store(path: str) -> None:
    """orders (3 partitions, keys, tags, headers, timestamps a second apart, traced, read by a
    consumer group and a share group), paging (10,000 messages), xss (values that are markup),
    scan (1M short values in a plain topic: the long scan)."""
    with mqcore.open(path, trace=True, flush="os") as store:
        store.create_topic("orders", partitions=3)
        for p in range(3):
            idx = list(range(p, ORDERS, 3))
            store.append_batch(
                "orders",
                [order_value(i) for i in idx],
                [b"cust-%d" % (i % KEYS) for i in idx],
                [[("trace-id", b"t-%06d" % i), ("source", b"test")] for i in idx],
                partition=p,
                timestamps=[T0 + i * 1000 for i in idx],
                tags=[TAGS[i % 3] for i in idx],
            )
        consumer = store.consumer("billing", "orders")
        polled = 0
        while polled < ORDERS // 2:
            polled += len(consumer.poll(100))
        consumer.commit()
        consumer.close()
        with store.share_consumer("workers", "orders", explicit_ack=True) as share:
            for m in share.poll(30)[:10]:
                share.acknowledge(m)
        store.create_topic("xss")
        for value in XSS_VALUES:
            store.append("xss", value, key=XSS_KEY, headers=[("h", value)], timestamp=T0)
    with mqcore.open(path, flush="os") as store:  # untraced: no event per paging/scan message
        store.create_topic("paging", unique_ids=False)
        for lo in range(0, PAGING, 1000):
            values = [b"page message %d" % i for i in range(lo, lo + 1000)]
            store.append_batch("paging", values, timestamps=[T0 + i for i in range(lo, lo + 1000)])
        store.create_topic("scan", unique_ids=False, key_index=False)
        for lo in range(0, SCAN_MESSAGES, 5000):
            values = [b"line %d of a long scan" % i for i in range(lo, lo + 5000)]
            store.append_batch("scan", values, partition=0)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("console") / "store")
    build_store(path)
    return path


@pytest.fixture(scope="module")
def store(store_dir: str) -> Iterator[mqcore.Store]:
    """The store read-only, as `mqcore console` opens it (the tests' truth and the server's)."""
    with mqcore.open(store_dir, read_only=True) as s:
        yield s


@pytest.fixture(scope="module")
def url(store: mqcore.Store) -> Iterator[str]:
    """The console (read-only) over HTTP on a free loopback port, in this process."""
    with HttpServer(create_app(store, console=True)) as server:
        yield server.url


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    """One headless Chromium for the module (1280x800: the screenshots' size)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespaces for the sandbox
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,800",
        "--hide-scrollbars",
    ):
        options.add_argument(arg)
    browser = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    # the window's size counts the (invisible) browser frame: make the page itself 1280x800
    dx, dy = browser.execute_script(
        "return [window.outerWidth - window.innerWidth, window.outerHeight - window.innerHeight]"
    )
    browser.set_window_size(1280 + dx, 800 + dy)
    try:
        yield browser
    finally:
        browser.quit()


# -- helpers ------------------------------------------------------------------------------------


def screenshot(
    driver: WebDriver, tmp_path: Path, name: str, stable: bool = True, whole: bool = False
) -> None:
    """The page as PNG under the test's tmp_path; with $MQCORE_CONSOLE_SCREENSHOTS, also there
    under `name` (the names docs/console.md shows) when `stable`. `whole`: the page's whole
    height (up to 1600 px) rather than the 800 px window."""
    size = driver.get_window_size()
    if whole:
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(size["width"], size["height"] + min(max(height - 800, 0), 800))
    try:
        driver.save_screenshot(str(tmp_path / name))
    finally:
        if whole:
            driver.set_window_size(size["width"], size["height"])
    out = os.environ.get("MQCORE_CONSOLE_SCREENSHOTS")
    if out and stable:
        os.makedirs(out, exist_ok=True)
        shutil.copyfile(tmp_path / name, os.path.join(out, name))


def wait_for(driver: WebDriver, condition: Callable[[WebDriver], Any], what: str) -> Any:
    # polled every 50 ms (WebDriverWait's default is 500 ms: most of a page's time here)
    return WebDriverWait(driver, WAIT, poll_frequency=0.05).until(
        condition, f"waited {WAIT} s for {what}"
    )


# What chromedriver answers, now and then, instead of "stale element reference" when asked about
# an element of a page that is being replaced (SeleniumHQ/selenium#15401): the node is gone.
NODE_GONE = ("Node with given id does not belong to the document", "No node with given id found")


def left(element: WebElement) -> Callable[[WebDriver], bool]:
    """A wait condition: `element`'s page has been replaced. Selenium's `staleness_of`, but
    chromedriver's node-gone errors count as stale rather than failing the wait."""

    def gone(_: WebDriver) -> bool:
        try:
            element.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as e:
            if any(m in (e.msg or "") for m in NODE_GONE):
                return True
            raise
        return False

    return gone


def results_state(driver: WebDriver) -> str | None:
    try:
        return driver.find_element(By.CSS_SELECTOR, "table#results").get_attribute("data-state")
    except NoSuchElementException:
        return None


def wait_done(driver: WebDriver) -> None:
    """Until table#results says its rows are all there (data-state="done")."""
    wait_for(driver, lambda d: results_state(d) == "done", "table#results[data-state=done]")


def no_error(driver: WebDriver) -> None:
    errors = driver.find_elements(By.ID, "error")
    assert not errors, errors[0].text


def rows(driver: WebDriver) -> list[dict[str, Any]]:
    """table#results' message rows, read in one script: place, and each cell's text."""
    found: list[dict[str, Any]] = driver.execute_script(
        """
        return Array.from(document.querySelectorAll('table#results tr.message')).map(tr => {
            const cell = c => { const e = tr.querySelector('.' + c); return e && e.textContent; };
            return {topic: cell('topic'), partition: +tr.dataset.partition,
                    offset: +tr.dataset.offset, key: cell('key'), value: cell('value'),
                    tag: cell('tag')};
        });
        """
    )
    return found


def places(driver: WebDriver) -> list[tuple[int, int]]:
    return [(r["partition"], r["offset"]) for r in rows(driver)]


def open_page(driver: WebDriver, url: str) -> None:
    driver.get(url)
    wait_for(driver, ec.presence_of_element_located((By.ID, "nav")), "nav#nav")


def run_query(driver: WebDriver, url: str, topic: str, **fields: str) -> None:
    """Open the topic's browser, fill the form's fields (by name) and press #run; wait until
    the results are done. A select is chosen by its value, anything else typed."""
    open_page(driver, f"{url}/ui/topics/{urllib.parse.quote(topic)}")
    wait_done(driver)  # the page's own first query (from the beginning), so #run starts anew
    form = driver.find_element(By.CSS_SELECTOR, "form#query")
    for name, value in fields.items():
        field = form.find_element(By.NAME, name)
        if field.tag_name == "select":
            Select(field).select_by_value(value)
        elif field.get_attribute("type") in ("datetime-local", "number"):
            # typing into these depends on the browser's locale: set the value the way the
            # picker does, then tell the page
            driver.execute_script(
                "arguments[0].value = arguments[1];"
                "arguments[0].dispatchEvent(new Event('input', {bubbles: true}));"
                "arguments[0].dispatchEvent(new Event('change', {bubbles: true}));",
                field,
                value,
            )
        else:
            field.clear()
            field.send_keys(value)
    old = driver.find_element(By.CSS_SELECTOR, "table#results")
    driver.find_element(By.ID, "run").click()
    # the form is a GET to the same page (a shareable URL): a new page, new rows
    wait_for(driver, left(old), "#run to load the query's page")
    wait_done(driver)
    no_error(driver)


def follow(driver: WebDriver, link: WebElement) -> None:
    """Click a paging link and wait for the new page's rows."""
    table = driver.find_element(By.CSS_SELECTOR, "table#results")
    link.click()
    wait_for(driver, left(table), "the next page to load")
    wait_done(driver)
    no_error(driver)


def enabled_link(driver: WebDriver, selector: str) -> WebElement | None:
    """`a#next` / `a#prev` when it leads somewhere (absent or aria-disabled at the ends)."""
    found = driver.find_elements(By.CSS_SELECTOR, selector)
    if not found or found[0].get_attribute("aria-disabled") == "true":
        return None
    return found[0]


def assert_no_alert(driver: WebDriver) -> None:
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.accept()


def number(text: str) -> int:
    """A count as the page shows it, thousands separators and units dropped (-1: none)."""
    digits = re.sub(r"[^0-9]", "", text)
    return int(digits) if digits else -1


def text_of(driver: WebDriver, element_id: str) -> str:
    text: str = driver.execute_script(
        "return document.getElementById(arguments[0]).textContent", element_id
    )
    return text


def ui_time(ms: int) -> str:
    """A datetime-local value (UTC, to the second) for `ms`."""
    when = datetime.datetime.fromtimestamp(ms / 1000, UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S")


def post(url: str, data: dict[str, str]) -> tuple[int, str]:
    body = urllib.parse.urlencode(data).encode()
    req = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# -- the pages ----------------------------------------------------------------------------------


class Answering:
    """An element whose `is_enabled` answers as chromedriver did: a value or an error."""

    def __init__(self, answer: bool | Exception) -> None:
        self.answer = answer

    def is_enabled(self) -> bool:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_a_page_has_left_when_chromedriver_says_its_node_is_gone() -> None:
    """The CI failure of stop 29: chromedriver answered a replaced page's element with
    "unhandled inspector error: Node with given id does not belong to the document", and
    `staleness_of` let it fail the wait. That answer, and the stale one, mean the page left;
    any other error still fails, and a live element keeps the wait going."""
    gone = (
        'unknown error: unhandled inspector error: {"code":-32000,'
        '"message":"Node with given id does not belong to the document"}'
    )
    assert left(Answering(WebDriverException(gone)))(None)  # type: ignore[arg-type]
    assert left(Answering(StaleElementReferenceException("stale")))(None)  # type: ignore[arg-type]
    assert not left(Answering(True))(None)  # type: ignore[arg-type]
    with pytest.raises(WebDriverException, match="session deleted"):
        left(Answering(WebDriverException("session deleted")))(None)  # type: ignore[arg-type]


def test_overview_lists_topics_and_groups_as_the_store_counts_them(
    driver: WebDriver, url: str, store: mqcore.Store, tmp_path: Path
) -> None:
    open_page(driver, url + "/ui/")
    no_error(driver)
    for topic in ("orders", "paging", "xss", "scan"):
        row = driver.find_element(By.CSS_SELECTOR, f'table#topics tr[data-topic="{topic}"]')
        parts = store.available_partitions(topic)
        messages = sum(store.end_offset(topic, p) - store.start_offset(topic, p) for p in parts)
        assert row.find_element(By.CSS_SELECTOR, ".partitions").text == str(len(parts))
        assert number(row.find_element(By.CSS_SELECTOR, ".messages").text) == messages
        href = row.find_element(By.TAG_NAME, "a").get_attribute("href")
        assert href is not None and href.endswith(f"/ui/topics/{topic}")
    lag = sum(p.lag or 0 for p in store.group_lag("billing")["billing"])
    billing = driver.find_element(
        By.CSS_SELECTOR, 'table#groups tr[data-group="billing"][data-kind="consumer"]'
    )
    assert number(billing.find_element(By.CSS_SELECTOR, ".lag").text) == lag
    driver.find_element(By.CSS_SELECTOR, 'table#groups tr[data-group="workers"][data-kind="share"]')
    assert not driver.find_elements(By.CSS_SELECTOR, "form.write-action")
    screenshot(driver, tmp_path, "overview.png")


def test_search_by_key_shows_what_find_by_key_finds(
    driver: WebDriver, url: str, store: mqcore.Store, tmp_path: Path
) -> None:
    key = b"cust-7"
    run_query(driver, url, "orders", key=key.decode(), limit="100")
    truth = store.find_by_key("orders", key, limit=100)
    assert truth.complete and len(truth) == ORDERS // KEYS
    shown = rows(driver)
    assert sorted((r["partition"], r["offset"]) for r in shown) == sorted(
        (m.partition, m.offset) for m in truth
    )
    assert {r["key"] for r in shown} == {"cust-7"}
    assert text_of(driver, "reason") == "exhausted"
    screenshot(driver, tmp_path, "browser-key.png", stable=False)


def test_search_by_time_range_shows_what_search_finds(
    driver: WebDriver, url: str, store: mqcore.Store, tmp_path: Path
) -> None:
    start, end = T0 + 120_000, T0 + 180_000  # orders 120 to 179, over the 3 partitions
    run_query(
        driver, url, "orders", **{"from": "time"}, time=ui_time(start), to=ui_time(end),
        limit="100",
    )  # fmt: skip
    assert text_of(driver, "tz").strip() == "UTC"
    truth = store.search("orders", start=start, end=end, limit=100, order="time")
    assert truth.complete and len(truth) == 60
    assert places(driver) == [(m.partition, m.offset) for m in truth]
    assert text_of(driver, "reason") == "exhausted"
    # one partition, from a time on, a page of 25: what offset_for_time says is first
    run_query(driver, url, "orders", partition="1", **{"from": "time"}, time=ui_time(start),
              limit="25")  # fmt: skip
    truth = store.search("orders", partition=1, start=start, limit=25, order="time")
    assert len(truth) == 25 and truth.reason == "limit"
    assert places(driver) == [(m.partition, m.offset) for m in truth]
    assert places(driver)[0] == (1, store.offset_for_time("orders", 1, start))
    assert text_of(driver, "reason") == "limit"
    screenshot(driver, tmp_path, "browser-time.png", stable=False)


def test_search_by_content_shows_what_search_finds(
    driver: WebDriver, url: str, store: mqcore.Store, tmp_path: Path
) -> None:
    run_query(driver, url, "orders", contains="needle", limit="100")
    truth = store.search("orders", contains=b"needle", limit=100)
    assert truth.complete and len(truth) == len(range(0, ORDERS, 37))
    shown = rows(driver)
    assert sorted((r["partition"], r["offset"]) for r in shown) == sorted(
        (m.partition, m.offset) for m in truth
    )
    assert all("needle" in r["value"] for r in shown)
    assert text_of(driver, "reason") == "exhausted"
    assert number(text_of(driver, "scanned-records")) > 0
    assert driver.find_element(By.ID, "progress").get_attribute("hidden") is not None
    # a regex and a tag, each through the store's engine
    run_query(driver, url, "orders", regex=r"order [0-9]*5 status", tag="paid", limit="100")
    truth = store.search("orders", regex=r"order [0-9]*5 status", tag="paid", limit=100)
    assert truth.complete and len(truth) > 0
    assert sorted(places(driver)) == sorted((m.partition, m.offset) for m in truth)
    screenshot(driver, tmp_path, "browser.png")


def test_cursor_pages_through_10000_messages_each_offset_once(
    driver: WebDriver, url: str, store: mqcore.Store
) -> None:
    run_query(driver, url, "paging", limit="1000")
    assert enabled_link(driver, "a#prev") is None  # at the start
    pages = [places(driver)]
    while (link := enabled_link(driver, "a#next")) is not None:
        follow(driver, link)
        pages.append(places(driver))
        assert len(pages) <= PAGING // 1000 + 1, "the cursor does not reach the end"
    seen = [offset for page in pages for _, offset in page]
    assert len(seen) == store.end_offset("paging") == PAGING
    assert sorted(seen) == list(range(PAGING)), "an offset shown twice or never"
    # and back: a#prev shows the page before again
    prev = enabled_link(driver, "a#prev")
    assert prev is not None
    follow(driver, prev)
    assert places(driver) == pages[-2]


def test_bad_query_string_is_a_visible_error_not_a_500(driver: WebDriver, url: str) -> None:
    for query in ("limit=abc", "partition=9", "from=sideways", "regex=(unclosed"):
        driver.get(f"{url}/ui/topics/orders?{query}")
        error = wait_for(
            driver,
            ec.visibility_of_element_located((By.CSS_SELECTOR, "#error.error")),
            f"an error for {query}",
        )
        assert error.text.strip(), query
        assert "Traceback" not in driver.page_source
        assert "Internal Server Error" not in driver.page_source


def test_message_detail_shows_headers_ids_and_trace(
    driver: WebDriver, url: str, store: mqcore.Store, tmp_path: Path
) -> None:
    # cust-31's first message (order 31, partition 1, offset 10) was read and committed by the
    # billing group and delivered to the share group's member, which released it
    run_query(driver, url, "orders", key="cust-31", limit="100")
    assert (1, 10) in places(driver)
    first = {"partition": 1, "offset": 10}
    link = driver.find_element(
        By.CSS_SELECTOR,
        f'table#results tr.message[data-partition="{first["partition"]}"]'
        f'[data-offset="{first["offset"]}"] a',
    )
    link.click()
    wait_for(driver, ec.presence_of_element_located((By.ID, "trace")), "the detail page")
    no_error(driver)
    assert driver.current_url.endswith(
        f"/ui/topics/orders/partitions/{first['partition']}/offsets/{first['offset']}"
    )
    m = store.get("orders", first["partition"], first["offset"])
    assert m is not None and m.key is not None and m.value is not None
    assert text_of(driver, "key") == m.key.decode()
    assert text_of(driver, "value") == m.value.decode()
    assert text_of(driver, "value-format") == "text"
    assert text_of(driver, "tag") == m.tag
    assert str(len(m.value)) in text_of(driver, "size")
    shown_headers = driver.execute_script(
        "return Array.from(document.querySelectorAll('table#headers tr')).filter("
        "tr => tr.querySelector('.name')).map("
        "tr => [tr.querySelector('.name').textContent, tr.querySelector('.value').textContent])"
    )
    for name, value in m.headers:
        if name in ("trace-id", "source"):
            assert [name, (value or b"").decode()] in shown_headers
    assert m.unique_id is not None
    assert text_of(driver, "unique-id").strip() == m.unique_id
    assert text_of(driver, "store-id").strip() == m.msg_id
    copies = {
        b.get_attribute("data-copy") for b in driver.find_elements(By.CSS_SELECTOR, "button.copy")
    }
    assert {m.unique_id, m.msg_id} <= copies
    events = [
        e.get_attribute("data-event") or ""
        for e in driver.find_elements(By.CSS_SELECTOR, "ol#trace li.event")
    ]
    shares = store.share_deliveries("orders", m.partition, m.offset)
    # the trace's events, but a share group's own ones: its pull log tells each step once
    assert [e for e in events if not e.startswith("share_")] == [
        e.event for e in store.trace(m.unique_id) if e.group not in {d.group for d in shares}
    ]
    assert [e for e in events if e.startswith("share_")] == ["share_" + d.event for d in shares]
    assert events[0] == "appended"
    assert {"delivered", "committed"} <= set(events) and shares
    screenshot(driver, tmp_path, "detail.png", whole=True)


def test_lookup_recognises_ids_and_keys(
    driver: WebDriver, url: str, store: mqcore.Store, tmp_path: Path
) -> None:
    m = store.get("orders", 2, 5)
    assert m is not None and m.unique_id is not None
    for q, kind in ((m.msg_id, "store-id"), (m.unique_id, "unique-id")):
        open_page(driver, f"{url}/ui/lookup?" + urllib.parse.urlencode({"q": q}))
        wait_done(driver)
        no_error(driver)
        assert text_of(driver, "kind").strip() == kind
        assert [(r["topic"], r["partition"], r["offset"]) for r in rows(driver)] == [
            ("orders", 2, 5)
        ]
    open_page(driver, f"{url}/ui/lookup?q=cust-11")
    wait_done(driver)
    assert text_of(driver, "kind").strip() == "key"
    truth = {
        (t, msg.partition, msg.offset)
        for t in store.topics()
        if store.topic_config(t).key_index
        for msg in store.find_by_key(t, b"cust-11")
    }
    assert truth and {(r["topic"], r["partition"], r["offset"]) for r in rows(driver)} == truth
    assert driver.find_element(By.ID, "q").get_attribute("value") == "cust-11"
    screenshot(driver, tmp_path, "lookup.png")


def test_markup_in_messages_renders_as_text_and_runs_nothing(
    driver: WebDriver, url: str, store: mqcore.Store, tmp_path: Path
) -> None:
    run_query(driver, url, "xss", limit="10")
    assert_no_alert(driver)
    shown = rows(driver)
    assert [r["value"] for r in shown] == [v.decode() for v in XSS_VALUES]
    assert {r["key"] for r in shown} == {XSS_KEY.decode()}
    assert driver.execute_script("return window.__xss") is None
    # the markup is text: no element was made from it anywhere in the page
    assert driver.find_elements(By.CSS_SELECTOR, "#results img, #results script, #results svg, "
                                "#results b") == []  # fmt: skip
    screenshot(driver, tmp_path, "xss-browser.png", stable=False)
    for offset, value in enumerate(XSS_VALUES):
        open_page(driver, f"{url}/ui/topics/xss/partitions/0/offsets/{offset}")
        assert_no_alert(driver)
        assert driver.execute_script("return window.__xss") is None
        assert text_of(driver, "value") == value.decode()
        assert text_of(driver, "key") == XSS_KEY.decode()
        assert driver.find_elements(By.CSS_SELECTOR, "main img, main script, main svg") == []
    screenshot(driver, tmp_path, "xss-detail.png", stable=False)


def partition_row(driver: WebDriver, topic: str, partition: int) -> WebElement:
    """The group page's table row of one partition."""
    return driver.find_element(
        By.CSS_SELECTOR,
        f'table#group-partitions tr[data-topic="{topic}"][data-partition="{partition}"]',
    )


def test_groups_page_shows_group_lag(
    driver: WebDriver, url: str, store: mqcore.Store, tmp_path: Path
) -> None:
    open_page(driver, url + "/ui/groups/billing")
    no_error(driver)
    for lag in store.group_lag("billing")["billing"]:
        row = partition_row(driver, lag.topic, lag.partition)
        cell = {c: row.find_element(By.CSS_SELECTOR, "." + c).text for c in ("committed", "end")}
        assert int(cell["committed"]) == lag.committed
        assert int(cell["end"]) == lag.end_offset
        assert int(row.find_element(By.CSS_SELECTOR, ".lag").text) == lag.lag
    open_page(driver, url + "/ui/groups/workers")
    no_error(driver)
    for share in store.share_group_lag("workers")["workers"]:
        row = partition_row(driver, share.topic, share.partition)
        assert int(row.find_element(By.CSS_SELECTOR, ".available").text) == share.available
        assert int(row.find_element(By.CSS_SELECTOR, ".in-flight").text) == share.in_flight
    open_page(driver, url + "/ui/groups")
    no_error(driver)
    listed = {
        (r.get_attribute("data-group"), r.get_attribute("data-kind"))
        for r in driver.find_elements(By.CSS_SELECTOR, "table#groups tr[data-group]")
    }
    assert listed == {("billing", "consumer"), ("workers", "share")}
    screenshot(driver, tmp_path, "groups.png")


def test_cancel_stops_a_long_scan(
    driver: WebDriver, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole scan takes about 1.5 s, so on a slow machine it could end before the click.
    The chunks after the first therefore wait at a gate, on the server, until the cancel is
    pressed: the page is always mid-scan when it is cancelled."""
    gate = threading.Event()
    run_chunk = browse.run_chunk

    def gated(store: mqcore.Store, topic: str, q: Any, cursor: str | None, *rest: Any) -> Any:
        if cursor is not None:  # a later chunk (the first has no cursor)
            gate.wait(WAIT)
        return run_chunk(store, topic, q, cursor, *rest)

    monkeypatch.setattr(browse, "run_chunk", gated)
    try:
        # a shared URL runs its query as the page loads
        open_page(
            # a regex without a literal of two bytes: every value goes to RE2 (one with a
            # literal would let the kernel pass over them all in the first chunk)
            driver,
            f"{url}/ui/topics/scan?" + urllib.parse.urlencode({"regex": "n.[0-9]+m.t.h"}),
        )
        # at least one chunk back and the next one asked for: the scan is under way
        wait_for(
            driver,
            lambda d: results_state(d) == "running" and number(text_of(d, "scanned-records")) > 0,
            "a running scan with progress",
        )
        assert driver.find_element(By.ID, "progress").get_attribute("hidden") is None
        driver.find_element(By.ID, "cancel").click()
        wait_for(driver, lambda d: results_state(d) == "cancelled", "data-state=cancelled")
    finally:
        gate.set()
    assert text_of(driver, "reason").strip() == "cancelled"
    scanned = number(text_of(driver, "scanned-records"))
    assert 0 < scanned < SCAN_MESSAGES
    assert rows(driver) == []
    wait_for(
        driver,
        lambda d: d.find_element(By.ID, "progress").get_attribute("hidden") is not None,
        "the progress indicator to hide",
    )
    screenshot(driver, tmp_path, "cancelled.png", stable=False)


# -- `mqcore console` as a program: read-only, and --allow-write ---------------------------------


class Console:
    """`mqcore console STORE --http 127.0.0.1:0 [args]` as a subprocess; `url` from the line
    it prints."""

    def __init__(self, store_dir: str, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mqcore.cli", "console", store_dir, "--http", "127.0.0.1:0",
             *args],
            env=child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.stderr = ""
        self.url = self._read_url()

    def _read_url(self) -> str:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while sel.select(timeout=WAIT):
                line = self.proc.stdout.readline()
                if not line:
                    break
                found = re.search(r"http://127\.0\.0\.1:\d+", line)
                if found:
                    return found.group(0)
        self.stop()
        raise AssertionError(f"mqcore console printed no URL: {self.stderr}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            _, self.stderr = self.proc.communicate(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, self.stderr = self.proc.communicate()
        assert "Traceback" not in self.stderr, self.stderr


@pytest.fixture
def small_store(tmp_path: Path) -> str:
    path = str(tmp_path / "small")
    with mqcore.open(path, flush="os") as s:
        s.create_topic("t", partitions=2)
        s.append_batch("t", [b"first", b"second"], [b"k1", b"k2"], partition=0)
    return path


WRITE_ACTIONS = {
    "produce": {"topic": "t", "partition": "0", "key": "k9", "value": "written"},
    "reset-offsets": {"group": "g", "topic": "t", "time": "2026-01-01T00:00:00"},
    "resend": {"topic": "t", "partition": "0", "offset": "0"},
}


def test_write_actions_refused_without_allow_write(
    driver: WebDriver, small_store: str, tmp_path: Path
) -> None:
    console = Console(small_store)
    try:
        for page in ("/ui/", "/ui/topics/t", "/ui/topics/t/partitions/0/offsets/0", "/ui/groups"):
            open_page(driver, console.url + page)
            assert not driver.find_elements(By.CSS_SELECTOR, "form.write-action"), page
        for action, data in WRITE_ACTIONS.items():
            status, body = post(f"{console.url}/ui/actions/{action}", data)
            assert status == 403, (action, status, body)
            assert "allow-write" in body, body
    finally:
        console.stop()
    with mqcore.open(small_store, read_only=True) as s:
        assert s.end_offset("t", 0) == 2
        assert s.group_lag() == {}


def test_produce_works_with_allow_write(
    driver: WebDriver, small_store: str, tmp_path: Path
) -> None:
    console = Console(small_store, "--allow-write")
    try:
        open_page(driver, console.url + "/ui/")
        form = driver.find_element(
            By.CSS_SELECTOR, 'form.write-action[action$="/ui/actions/produce"]'
        )
        Select(form.find_element(By.NAME, "topic")).select_by_visible_text("t")
        for name in ("partition", "key", "value"):
            form.find_element(By.NAME, name).send_keys(WRITE_ACTIONS["produce"][name])
        page = driver.find_element(By.TAG_NAME, "html")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait_for(driver, left(page), "the produce form's answer")
        wait_for(driver, ec.presence_of_element_located((By.ID, "nav")), "the answer's page")
        no_error(driver)
        # the answer is the new message's detail page
        assert driver.current_url.endswith("/ui/topics/t/partitions/0/offsets/2")
        assert text_of(driver, "value") == "written"
        screenshot(driver, tmp_path, "produced.png", stable=False)
    finally:
        console.stop()
    with mqcore.open(small_store, read_only=True) as s:
        assert s.end_offset("t", 0) == 3
        m = s.get("t", 0, 2)
        assert m is not None and (m.key, m.value) == (b"k9", b"written")
