"""The operations console (mqcore.server.console, `mqcore console`) without a browser: a real
HttpServer over a real store on disk, asked with urllib. What a page shows is compared with
the Store's own answers and with brute force over every message read back with Store.read;
the browser's rows are gathered chunk by chunk as its script does (cursor after cursor).
The Selenium tests drive the same pages in Chromium."""

from __future__ import annotations

import base64
import dataclasses
import html
import http.cookiejar
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytest.importorskip("jinja2", reason="the server extra (jinja2) is missing")
from mqcore.errors import GroupNotEmptyError, GroupTypeError  # noqa: E402
from mqcore.server.auth import add_user  # noqa: E402
from mqcore.server.http import HttpServer, create_app  # noqa: E402
from mqcore.server.httpauth import HttpAuth  # noqa: E402

TAGS = ["paid", "shipped", "refund"]
XSS_IMG = "<img src=x onerror=alert(1)>"
XSS_SCRIPT = "<script>alert('x')</script>"
ROW = re.compile(
    r'<tr class="message" data-partition="(\d+)" data-offset="(\d+)"(?: data-topic="([^"]*)")?'
)


class Client:
    """GET and POST against one server, as a browser: its cookies kept, its Origin sent
    with a POST; answers (status, body text, headers)."""

    def __init__(self, url: str, user: str | None = None, password: str | None = None):
        self.url = url
        self.opener = urllib.request.build_opener(
            NoRedirect, urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )
        self.auth = None
        if user is not None:
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.auth = f"Basic {token}"

    def request(
        self, path: str, data: dict[str, str] | None = None
    ) -> tuple[int, str, dict[str, str]]:
        body = None if data is None else urllib.parse.urlencode(data).encode()
        req = urllib.request.Request(self.url + path, data=body)
        if body is not None:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
            req.add_header("Origin", self.url)
        if self.auth:
            req.add_header("Authorization", self.auth)
        try:
            with self.opener.open(req, timeout=30) as r:
                return r.status, r.read().decode(), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), dict(e.headers)

    def page(self, path: str) -> str:
        status, body, _ = self.request(path)
        assert status == 200, body
        return body

    def rows(self, topic: str, **form: Any) -> tuple[list[tuple[int, int]], list[dict[str, Any]]]:
        """Every row of a browser query, chunk after chunk and page after page as the
        script fetches them, and each chunk's status."""
        query = {k: str(v) for k, v in form.items()}
        found: list[tuple[int, int]] = []
        chunks = []
        cursor = None
        while True:
            q = dict(query, **({"cursor": cursor} if cursor else {}))
            status, body, _ = self.request(f"/ui/topics/{topic}/rows?" + urllib.parse.urlencode(q))
            assert status == 200, body
            answer = json.loads(body)
            chunks.append(answer)
            found += [(int(p), int(o)) for p, o, _ in ROW.findall(answer["html"])]
            assert len(ROW.findall(answer["html"])) == answer["count"]
            cursor = answer["cursor"]
            if answer["reason"] == "exhausted" or cursor is None:
                return found, chunks


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


def form_token(page: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', page)
    assert m, "no write form on the page"
    return m[1]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mqcore.Store]:
    path = tmp_path_factory.mktemp("console") / "store"
    with mqcore.open(str(path), trace=True) as s:
        s.create_topic("orders", partitions=3)
        s.create_topic("events")
        for i in range(900):
            value = f'{{"n": {i}, "text": "order {i}"}}'.encode()
            if i == 17:
                value = XSS_IMG.encode()
            if i == 18:
                value = XSS_SCRIPT.encode()
            s.append(
                "orders", value, key=f"cust-{i % 13}".encode(), partition=i % 3,
                tag=TAGS[i % 3], properties={"amount": i % 50},
                timestamp=1_790_000_000_000 + i * 1000,
            )  # fmt: skip
        s.append("events", b"\x00\x01\xffbinary", key=XSS_SCRIPT.encode(), tag="bin")
        s.append("events", b"cust-3 in events", key=b"cust-3")
        c = s.consumer("billing", "orders", max_reconsume_times=0)
        polled = c.poll()
        c.nack(polled[0])  # straight to __dlq.billing
        c.commit()
        c.close()
        s.flush()
        yield s


@pytest.fixture(scope="module")
def client(store: mqcore.Store) -> Iterator[Client]:
    with HttpServer(create_app(store)) as server:
        yield Client(server.url)


def everything(store: mqcore.Store, topic: str) -> list[Any]:
    return [m for p in store.available_partitions(topic) for m in store.read(topic, p, 0, 10**6)]


# -- pages --------------------------------------------------------------------------------------


def test_overview_shows_each_topic_and_group_as_the_store_has_them(
    store: mqcore.Store, client: Client
) -> None:
    page = client.page("/ui/")
    assert '<nav id="nav">' in page and 'id="error"' not in page
    for topic in ("orders", "events"):
        row = re.search(rf'<tr data-topic="{topic}">(.*?)</tr>', page, re.S)
        assert row, topic
        cells = dict(re.findall(r'<td class="([a-z-]+)[^"]*"[^>]*>(.*?)</td>', row[1], re.S))
        msgs = everything(store, topic)
        assert int(cells["partitions"]) == store.partitions(topic)
        assert int(cells["messages"]) == len(msgs)
        first = min(m.timestamp for m in msgs)
        assert cells["first-ts"].startswith(
            datetime.fromtimestamp(first / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        )
    lags = store.group_lag()
    for group, parts in lags.items():
        row = re.search(rf'<tr data-group="{group}" data-kind="consumer">(.*?)</tr>', page, re.S)
        assert row
        assert re.search(r'class="lag num">(\d+)<', row[1])[1] == str(  # type: ignore[index]
            sum(p.lag or 0 for p in parts)
        )


def test_groups_pages_show_committed_end_and_lag_per_partition(
    store: mqcore.Store, client: Client
) -> None:
    for path in ("/ui/groups", "/ui/groups/billing"):
        page = client.page(path)
        for p in store.group_lag("billing")["billing"]:
            row = re.search(
                rf'data-group="billing" data-kind="consumer" data-topic="{p.topic}" '
                rf'data-partition="{p.partition}">(.*?)</tr>', page, re.S,
            )  # fmt: skip
            assert row, (path, p)
            assert f'class="committed num">{p.committed}<' in row[1]
            assert f'class="lag num">{p.lag}<' in row[1]
    status, body, _ = client.request("/ui/groups/nobody")
    assert status == 404 and 'id="error"' in body


def brute(store: mqcore.Store, pred: Any, partition: int | None = None) -> list[tuple[int, int]]:
    return sorted(
        (m.partition, m.offset)
        for m in everything(store, "orders")
        if (partition is None or m.partition == partition) and pred(m)
    )


@pytest.mark.parametrize(
    ("form", "pred"),
    [
        ({"tag": "paid"}, lambda m: m.tag == "paid"),
        ({"where": "amount > 40"}, lambda m: int(m.properties["amount"]) > 40),
        ({"contains": "order 1"}, lambda m: b"order 1" in m.value),
        ({"regex": r"order [0-9]*7\b"}, lambda m: re.search(rb"order [0-9]*7\b", m.value)),
        ({"tag": "refund", "partition": 2}, lambda m: m.tag == "refund" and m.partition == 2),
        (
            {"from": "time", "time": "2026-09-21T14:15:00", "to": "2026-09-21T14:20:00"},
            lambda m: 1_790_000_100_000 <= m.timestamp < 1_790_000_400_000,
        ),
    ],
)
def test_browser_rows_are_what_brute_force_finds(
    store: mqcore.Store, client: Client, form: dict[str, Any], pred: Any
) -> None:
    assert (
        datetime.fromisoformat("2026-09-21T14:15:00+00:00").timestamp() * 1000 == 1_790_000_100_000
    )
    found, chunks = client.rows("orders", limit=37, **form)
    assert len(found) == len(set(found))  # every message once, across pages
    assert sorted(found) == brute(store, pred)
    assert chunks[-1]["reason"] == "exhausted"
    assert sum(c["scanned_records"] for c in chunks) > 0


def test_browser_page_shows_the_topic_settings_and_partitions_as_the_cli_does(
    store: mqcore.Store, client: Client
) -> None:
    """What `mqcore config TOPIC` and `mqcore stats` print, on the topic's page."""
    page = client.page("/ui/topics/orders")
    config = store.topic_config("orders")
    shown = dict(re.findall(r'<tr data-setting="([a-z_]+)"><td class="name">[a-z_]+</td>'
                            r'<td class="value">(.*?)</td>', page))  # fmt: skip
    assert shown.keys() == set(dataclasses.asdict(config))
    assert shown["retention_ms"] == str(config.retention_ms)
    assert shown["cleanup_policy"] == html.escape(str(config.cleanup_policy))
    for p in range(3):
        row = re.search(rf'<tr data-partition="{p}">(.*?)</tr>', page, re.S)
        assert row, p
        cells = dict(re.findall(r'<td class="([a-z]+)">(\d+)</td>', row[1]))
        assert int(cells["start"]) == store.start_offset("orders", p)
        assert int(cells["end"]) == store.end_offset("orders", p)
        assert int(cells["segments"]) == len(store.segment_offsets("orders", p))


def test_browser_key_filter_uses_the_key_index(store: mqcore.Store, client: Client) -> None:
    found, chunks = client.rows("orders", key="cust-4", limit=10)
    assert sorted(found) == brute(store, lambda m: m.key == b"cust-4")
    assert all(c["indexed"] for c in chunks)
    answer = store.find_by_key("orders", "cust-4", limit=10)
    assert found[:10] == [(m.partition, m.offset) for m in answer.messages]


def test_browser_from_offset_and_from_end(store: mqcore.Store, client: Client) -> None:
    found, _ = client.rows("orders", partition=1, **{"from": "offset"}, offset=250)
    assert found == [(1, o) for o in range(250, store.end_offset("orders", 1))]
    status, body, _ = client.request("/ui/topics/orders/rows?from=end&partition=0&limit=5")
    answer = json.loads(body)
    end = store.end_offset("orders", 0)
    assert [(int(p), int(o)) for p, o, _ in ROW.findall(answer["html"])] == [
        (0, o) for o in range(end - 5, end)
    ]


def test_browser_page_shell_and_paging_links(client: Client) -> None:
    page = client.page("/ui/topics/orders?tag=paid&limit=5")
    for needle in ('form id="query"', 'id="run"', 'id="reason"', 'id="scanned-bytes"',
                   'id="scanned-records"', 'id="progress" hidden', 'id="cancel"',
                   'id="next" aria-disabled="true"', 'id="prev" aria-disabled="true"',
                   'id="tz">UTC<', 'data-state="running"'):  # fmt: skip
        assert needle in page, needle
    rows_url = html.unescape(re.search(r'data-rows-url="([^"]+)"', page)[1])  # type: ignore[index]
    assert "tag=paid" in rows_url
    back = client.page("/ui/topics/orders?tag=paid&limit=5&cursor=c1-1-9&hist=-,c1-0-30")
    prev = html.unescape(re.search(r'id="prev" href="([^"]+)"', back)[1])  # type: ignore[index]
    assert dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(prev).query)) == {
        "tag": "paid", "limit": "5", "cursor": "c1-0-30", "hist": "-"
    }  # fmt: skip
    zoned = client.page("/ui/topics/orders?tz=Europe/Paris&from=time&time=2026-09-21T16:15")
    assert 'id="tz">Europe/Paris<' in zoned


@pytest.mark.parametrize(
    "query",
    [
        "from=bogus",
        "from=time&time=yesterday",
        "from=time",
        "from=offset&offset=3",
        "tz=Nowhere/Zone",
        "tz=../../etc/passwd",
        "partition=99",
        "partition=-1",
        "limit=0",
        "limit=abc",
        "cursor=garbage",
        "hist=nonsense",
        "colour=red",
        "order=bogus",
        "from=end&order=partition",
        "from=end&tail=c1-0-5",
        "from=time&time=2026-09-21T16:15&cursor=c1-0-5",
        "where=amount%20%3E%3E%203",
        "regex=%28",
    ],
)
def test_bad_query_strings_answer_400_with_a_visible_error(client: Client, query: str) -> None:
    status, body, _ = client.request("/ui/topics/orders?" + query)
    assert status == 400, body
    assert '<div id="error" class="error"' in body
    status, body, _ = client.request("/ui/topics/orders/rows?" + query)
    assert status == 400 and json.loads(body)["message"]


def test_unknown_topic_and_message_are_404_pages(client: Client) -> None:
    for path in ("/ui/topics/nope", "/ui/topics/orders/partitions/0/offsets/999999",
                 "/ui/no/such/page"):  # fmt: skip
        status, body, _ = client.request(path)
        assert status == 404 and 'id="error"' in body, path
    status, body, _ = client.request("/ui/topics/orders/partitions/x/offsets/1")
    assert status == 400


# -- lookup -------------------------------------------------------------------------------------


def lookup_rows(page: str) -> list[tuple[str, int, int]]:
    return [(t, int(p), int(o)) for p, o, t in ROW.findall(page)]


def test_lookup_recognises_what_was_pasted(store: mqcore.Store, client: Client) -> None:
    m = store.get("orders", 2, 40)
    assert m is not None and m.unique_id
    cases = {
        m.msg_id: "store-id",
        m.unique_id: "unique-id",
        "orders/2/40": "offset",
    }
    for q, kind in cases.items():
        page = client.page("/ui/lookup?" + urllib.parse.urlencode({"q": q}))
        assert f'<span id="kind">{kind}</span>' in page, q
        assert ("orders", 2, 40) in lookup_rows(page), q
    page = client.page("/ui/lookup?q=cust-3")
    assert '<span id="kind">key</span>' in page
    every = sorted(
        (m.topic, m.partition, m.offset)
        for t in ("orders", "events")
        for m in everything(store, t)
        if m.key == b"cust-3"
    )
    assert sorted(lookup_rows(page)) == every
    assert {t for t, _, _ in every} == {"orders", "events"}
    page = client.page("/ui/lookup?q=cust-3&topic=events")
    assert {t for t, _, _ in lookup_rows(page)} == {"events"}
    status, body, _ = client.request("/ui/lookup?q=m1-notanid")
    assert status == 400 and 'id="error"' in body


# -- message detail -----------------------------------------------------------------------------


def test_detail_shows_value_headers_ids_and_trace(store: mqcore.Store, client: Client) -> None:
    (dead,) = store.read("__dlq.billing", 0, 0)
    origin = store.get_by_id(dead.header("mq.origin").decode())  # type: ignore[union-attr]
    assert origin is not None
    page = client.page(f"/ui/topics/orders/partitions/{origin.partition}/offsets/{origin.offset}")
    assert f'<code id="store-id">{origin.msg_id}</code>' in page
    assert f'data-copy="{origin.unique_id}"' in page
    assert '<span id="value-format">json</span>' in page
    value = html.unescape(re.search(r'<pre id="value">(.*?)</pre>', page, re.S)[1])  # type: ignore[index]
    assert json.loads(value) == json.loads(origin.value)
    assert '<span id="timestamp-type">CreateTime</span>' in page
    events = re.findall(r'<li class="event" data-event="([a-z_]+)"', page)
    assert events == [e.event for e in store.trace(origin.unique_id)]  # type: ignore[arg-type]
    assert {"appended", "nacked", "dead_lettered"} <= set(events)
    headers = re.findall(r'<tr><td class="name">(.*?)</td><td class="value">(.*?)</td></tr>',
                         page.split('id="headers"')[1])  # fmt: skip
    assert [k for k, _ in headers] == [k for k, _ in origin.headers]
    # a dead-lettered copy shows its origin headers
    page = client.page("/ui/topics/__dlq.billing/partitions/0/offsets/0")
    assert '<td class="name">mq.origin.topic</td><td class="value">orders</td>' in page
    # binary as hex, and a format asked for
    page = client.page("/ui/topics/events/partitions/0/offsets/0")
    assert '<span id="value-format">hex</span>' in page and "00 01 ff" in page
    page = client.page(
        f"/ui/topics/orders/partitions/{origin.partition}/offsets/{origin.offset}?format=text"
    )
    assert '<span id="value-format">text</span>' in page
    status, body, _ = client.request("/ui/topics/events/partitions/0/offsets/0?format=pdf")
    assert status == 400 and 'id="error"' in body


def test_message_contents_are_escaped_everywhere(store: mqcore.Store, client: Client) -> None:
    hostile = [
        m for m in everything(store, "orders") if m.value in (XSS_IMG.encode(), XSS_SCRIPT.encode())
    ]
    assert len(hostile) == 2
    pages = [client.page(f"/ui/topics/orders/partitions/{m.partition}/offsets/{m.offset}")
             for m in hostile]  # fmt: skip
    pages.append(client.page("/ui/topics/events/partitions/0/offsets/0"))  # key <script>
    pages.append(
        client.page("/ui/lookup?" + urllib.parse.urlencode({"q": XSS_SCRIPT, "topic": "events"}))
    )
    _, chunks = client.rows("orders", contains="<", limit=10)
    pages += [c["html"] for c in chunks]
    text = "\n".join(pages)
    assert XSS_IMG not in text and "<script>alert" not in text
    assert html.escape(XSS_IMG, quote=True) in text
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in text
    assert text.count("<script") == text.count('<script src="/ui/static/console.js"></script>')
    _, _, headers = client.request("/ui/")
    assert (
        "script-src" in headers["content-security-policy"]
        or "default-src 'self'" in headers["content-security-policy"]
    )


def test_static_files_are_served(client: Client) -> None:
    for name in ("console.js", "console.css"):
        status, body, _ = client.request(f"/ui/static/{name}")
        assert status == 200 and len(body) > 500
    status, _, headers = client.request("/")
    assert status == 307 and headers["location"] == "/ui/"


# -- write actions ------------------------------------------------------------------------------


def test_write_actions_are_refused_without_allow_write(store: mqcore.Store, client: Client) -> None:
    page = client.page("/ui/")
    assert "write-action" not in page
    ends = {p: store.end_offset("orders", p) for p in range(3)}
    committed = store.group_lag("billing")
    for path, form in (
        ("/ui/actions/produce", {"topic": "orders", "value": "x"}),
        ("/ui/actions/reset-offsets", {"group": "billing", "time": "2026-01-01T00:00"}),
        ("/ui/actions/resend", {"topic": "__dlq.billing", "partition": "0", "offset": "0"}),
    ):
        status, body, _ = client.request(path, form)
        assert status == 403 and "--allow-write" in body, path
    assert {p: store.end_offset("orders", p) for p in range(3)} == ends
    assert store.group_lag("billing") == committed


@pytest.fixture
def writable(tmp_path: Path) -> Iterator[mqcore.Store]:
    with mqcore.open(str(tmp_path / "w")) as s:
        s.create_topic("orders", partitions=2)
        for i in range(40):
            s.append("orders", f"v{i}".encode(), partition=i % 2,
                     timestamp=1_790_000_000_000 + i * 60_000)  # fmt: skip
        c = s.consumer("billing", "orders", max_reconsume_times=0)
        first = c.poll()[0]
        c.nack(first)
        c.commit()
        c.close()
        yield s


def test_write_actions_with_allow_write(writable: mqcore.Store) -> None:
    s = writable
    with HttpServer(create_app(s, allow_write=True)) as server:
        client = Client(server.url)
        page = client.page("/ui/")
        assert 'class="write-action"' in page
        token = form_token(page)
        # produce
        status, body, headers = client.request(
            "/ui/actions/produce",
            {"csrf": token, "topic": "orders", "partition": "1", "key": "k<1>", "value": XSS_IMG},
        )
        assert status == 303, body
        m = re.fullmatch(r"/ui/topics/orders/partitions/1/offsets/(\d+)", headers["location"])
        assert m
        made = s.get("orders", 1, int(m[1]))
        assert made is not None and (made.key, made.value) == (b"k<1>", XSS_IMG.encode())
        # reset the group's offsets to a time: offset_for_time of each partition
        status, body, headers = client.request(
            "/ui/actions/reset-offsets",
            {"csrf": token, "group": "billing", "time": "2026-09-21T14:23:20"},
        )
        assert status == 303, body and headers["location"] == "/ui/groups/billing"
        at = 1_790_000_000_000 + 10 * 60_000
        for p in s.group_lag("billing")["billing"]:
            assert p.committed == s.offset_for_time(p.topic, p.partition, at)
        # resend the dead-lettered message to where it came from
        (dead,) = s.read("__dlq.billing", 0, 0)
        detail = client.page("/ui/topics/__dlq.billing/partitions/0/offsets/0")
        assert 'id="resend"' in detail
        origin_p = int(dead.header("mq.origin.partition"))  # type: ignore[arg-type]
        before = s.end_offset("orders", origin_p)
        status, body, headers = client.request(
            "/ui/actions/resend",
            {"csrf": token, "topic": "__dlq.billing", "partition": "0", "offset": "0"},  # fmt: skip
        )
        assert status == 303, body
        copy = s.get("orders", origin_p, before)
        assert copy is not None and (copy.key, copy.value) == (dead.key, dead.value)
        assert copy.header("mq.origin") is None and copy.unique_id == dead.unique_id
        assert headers["location"].endswith(f"/partitions/{origin_p}/offsets/{before}")
        # a message that is no dead-letter copy, a missing token: refused, nothing written
        end = s.end_offset("orders", 0)
        status, body, _ = client.request(
            "/ui/actions/resend",
            {"csrf": token, "topic": "orders", "partition": "0", "offset": "0"},
        )
        assert status == 400 and "not a dead-lettered" in body
        status, body, _ = client.request("/ui/actions/produce", {"topic": "orders", "value": "x"})
        assert status == 403 and "CSRF" in body
        assert s.end_offset("orders", 0) == end


def test_reset_offsets_is_refused_while_the_group_has_members(writable: mqcore.Store) -> None:
    """A member's next commit would undo the reset (the console let it happen before): as
    Kafka's --reset-offsets, the form is refused (409, saying why) until the members leave,
    and the committed offsets stay as they were; a share group's name is refused too."""
    s = writable
    before = {(p.partition, p.committed) for p in s.group_lag("billing")["billing"]}
    member = s.consumer("billing", "orders")
    reset = {"group": "billing", "time": "2026-09-21T14:23:20"}
    with HttpServer(create_app(s, allow_write=True)) as server:
        client = Client(server.url)
        token = form_token(client.page("/ui/"))
        status, body, _ = client.request("/ui/actions/reset-offsets", {"csrf": token, **reset})
        assert status == 409 and "&#39;billing&#39; has 1 member; stop them" in body
        assert {(p.partition, p.committed) for p in s.group_lag("billing")["billing"]} == before
        member.close()
        status, body, _ = client.request("/ui/actions/reset-offsets", {"csrf": token, **reset})
        assert status == 303, body
        assert {(p.partition, p.committed) for p in s.group_lag("billing")["billing"]} != before
        with s.share_consumer("pullers", "orders"):
            status, body, _ = client.request(
                "/ui/actions/reset-offsets",
                {"csrf": token, "group": "pullers", "topic": "orders", "time": reset["time"]},
            )
        assert status == 409 and "share group" in body
        assert "pullers" not in s.group_lag()


# -- auth ---------------------------------------------------------------------------------------


def test_basic_auth_and_write_acl(writable: mqcore.Store, tmp_path: Path) -> None:
    creds, acl = tmp_path / "users", tmp_path / "acl"
    add_user(creds, "alice", "wonder")
    add_user(creds, "bob", "builder")
    acl.write_text("alice all *\nbob read *\n")
    auth = HttpAuth.load(str(creds), str(acl))
    with HttpServer(create_app(writable, allow_write=True, auth=auth)) as server:
        status, _, headers = Client(server.url).request("/ui/")
        assert status == 401 and headers["www-authenticate"].startswith("Basic")
        assert Client(server.url).request("/v1/topics")[0] == 401  # the JSON API too
        assert Client(server.url, "alice", "wrong").request("/ui/")[0] == 401
        assert Client(server.url, "nobody", "wonder").request("/ui/")[0] == 401
        alice, bob = Client(server.url, "alice", "wonder"), Client(server.url, "bob", "builder")
        end = writable.end_offset("orders", 0)
        status, body, _ = bob.request(
            "/ui/actions/produce",
            {"csrf": form_token(bob.page("/ui/")), "topic": "orders", "partition": "0",
             "value": "b"},
        )  # fmt: skip
        assert status == 403 and "User:bob may not write topic" in body
        assert writable.end_offset("orders", 0) == end
        status, _, _ = alice.request(
            "/ui/actions/produce",
            {"csrf": form_token(alice.page("/ui/")), "topic": "orders", "partition": "0",
             "value": "a"},
        )  # fmt: skip
        assert status == 303
        assert writable.end_offset("orders", 0) == end + 1


# -- mqcore console -----------------------------------------------------------------------------


def test_cli_console_serves_a_store_another_process_writes_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "held")
    env = dict(os.environ)
    with mqcore.open(path) as s:  # this process holds the writer lock throughout
        s.create_topic("orders")
        md = s.append("orders", XSS_IMG.encode(), key=b"k")
        s.flush()
        refused = subprocess.run(
            [sys.executable, "-m", "mqcore.cli", "console", path, "--http", "127.0.0.1:0",
             "--allow-write"], capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert refused.returncode == 1
        assert refused.stderr.startswith("mqcore: error:") and "Traceback" not in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        proc = subprocess.Popen(
            [sys.executable, "-m", "mqcore.cli", "console", path, "--http", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            m = re.search(r"(http://127\.0\.0\.1:\d+)/ui/", line)
            assert m, line + (proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
            client = Client(m[1])
            assert '<tr data-topic="orders">' in client.page("/ui/")
            detail = client.page(f"/ui/topics/orders/partitions/0/offsets/{md.offset}")
            assert html.escape(XSS_IMG) in detail
            # what the writer appends while the console runs shows up (a read-only open sees
            # the log as it was when it opened: each request borrows a handle reopened when
            # the store changed, mqcore.handles)
            later = [s.append("orders", b"later %d" % i, key=b"k") for i in range(3)]
            s.flush()
            for md2 in later:
                page = client.page(f"/ui/topics/orders/partitions/0/offsets/{md2.offset}")
                assert b"later %d" % (md2.offset - later[0].offset) in page.encode()
            topics = json.loads(client.page("/v1/topics"))["topics"]
            (orders,) = [t for t in topics if t["topic"] == "orders"]
            assert orders["partitions"][0]["end_offset"] == later[-1].offset + 1
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        assert "stopped" in out and "Traceback" not in err


def test_cli_console_refuses_basic_auth_without_tls_off_loopback(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    with mqcore.open(path) as s:
        s.create_topic("t")
    creds = tmp_path / "users"
    add_user(creds, "alice", "wonder")
    r = subprocess.run(
        [sys.executable, "-m", "mqcore.cli", "console", path, "--http", "0.0.0.0:0",
         "--auth-credentials", str(creds)], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1 and "TLS" in r.stderr and "Traceback" not in r.stderr


# -- mqcore serve --http ------------------------------------------------------------------------


def test_serve_http_serves_the_console_with_the_servers_users(tmp_path: Path) -> None:
    from mqcore.errors import InvalidConfigError
    from mqcore.server import Server

    creds = tmp_path / "users"
    add_user(creds, "alice", "wonder")
    store_path = str(tmp_path / "s")
    with Server(store_path, "127.0.0.1:0", http="127.0.0.1:0", sasl_credentials=creds) as server:
        assert server.store is not None and server.http_server is not None
        server.store.create_topic("orders")
        url = server.http_server.url
        assert Client(url).request("/ui/")[0] == 401
        page = Client(url, "alice", "wonder").page("/ui/")
        assert '<tr data-topic="orders">' in page and "write-action" not in page
        status, _, _ = Client(url, "alice", "wonder").request(
            "/ui/actions/produce", {"topic": "orders", "value": "x"}
        )
        assert status == 403
    with pytest.raises(InvalidConfigError, match="TLS"):
        Server(store_path, "127.0.0.1:0", http="0.0.0.0:0", sasl_credentials=creds)


def test_share_groups_and_share_deliveries_show(tmp_path: Path) -> None:
    """A share group's available and in-flight counts (store.share_group_lag) on the groups
    pages, and its deliveries of a record (the pull log) on the record's trace timeline."""
    with mqcore.open(str(tmp_path / "s")) as s:
        s.create_topic("t")
        for i in range(10):
            s.append("t", f"m{i}".encode())
        sc = s.share_consumer("workers", "t", explicit_ack=True, max_in_flight_records=4)
        got = sc.poll()
        sc.acknowledge(got[0], "accept")
        sc.commit()
        with HttpServer(create_app(s)) as server:
            client = Client(server.url)
            lag = s.share_group_lag("workers")["workers"]
            for path in ("/ui/groups", "/ui/groups/workers", "/ui/"):
                page = client.page(path)
                assert 'data-group="workers" data-kind="share"' in page, path
            page = client.page("/ui/groups/workers")
            for share in lag:
                row = re.search(
                    rf'data-topic="{share.topic}" data-partition="{share.partition}">(.*?)</tr>',
                    page, re.S,
                )  # fmt: skip
                assert row
                assert f'class="available num">{share.available}<' in row[1]
                assert f'class="in-flight num">{share.in_flight}<' in row[1]
            assert sum(x.in_flight for x in lag) > 0
            page = client.page(f"/ui/topics/t/partitions/0/offsets/{got[0].offset}")
            events = re.findall(r'<li class="event" data-event="([a-z_]+)"', page)
            expected = [e.event for e in s.share_deliveries("t", 0, got[0].offset)]
            assert events == [f"share_{e}" for e in expected]
            assert events[:2] == ["share_delivered", "share_accepted"]
        sc.close()


def test_scans_stop_at_max_scan_and_from_end_resolves_to_a_place(
    store: mqcore.Store, client: Client
) -> None:
    status, body, _ = client.request("/ui/topics/orders/rows?contains=nowhere&max_scan=100")
    answer = json.loads(body)
    assert status == 200 and answer["reason"] == "max_scan" and answer["cursor"]
    assert answer["count"] == 0 and answer["scanned_records"] >= 100
    # from=end becomes a time-order cursor placed at the newest `limit` messages of all the
    # partitions: the form and the rows URL carry it, so every later page of the query agrees
    # on it; the page shows the time of the oldest of them
    page = client.page("/ui/topics/orders?from=end&limit=4")
    everything = [m for p in range(3) for m in store.read("orders", p, 0, 1 << 20)]
    newest = sorted(everything, key=lambda m: (m.timestamp, m.partition, m.offset))[-4:]
    shown = datetime.fromtimestamp(newest[0].timestamp / 1000, timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S"
    )
    assert re.search(rf'<span id="tail" class="note">end: from {shown}\.\d{{3}}Z</span>', page)
    rows_url = html.unescape(re.search(r'data-rows-url="([^"]+)"', page)[1])  # type: ignore[index]
    tail = urllib.parse.parse_qs(urllib.parse.urlsplit(rows_url).query)["tail"][0]
    assert tail.startswith("t1-")
    found, _ = client.rows("orders", **{"from": "end"}, limit=4, tail=tail)
    assert found == [(m.partition, m.offset) for m in newest]
    # a time left in the form from an earlier from=time query does not stand in for it
    page = client.page("/ui/topics/orders?from=end&limit=4&time=2020-01-01T00:00")
    assert f"end: from {shown}" in page


def test_cli_console_over_tls_with_basic_auth(tmp_path: Path) -> None:
    """--tls-cert/--tls-key: HTTPS with the given certificate; Basic credentials are then
    accepted on any address (here loopback, as the test machine has no other)."""
    import ssl

    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    creds = tmp_path / "users"
    add_user(creds, "alice", "wonder")
    path = str(tmp_path / "s")
    with mqcore.open(path) as s:
        s.create_topic("orders")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqcore.cli", "console", path, "--http", "127.0.0.1:0",
         "--auth-credentials", str(creds), "--tls-cert", str(tmp_path / "cert.pem"),
         "--tls-key", str(tmp_path / "key.pem")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"(https://127\.0\.0\.1:\d+)/ui/", line)
        assert m, line
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        token = base64.b64encode(b"alice:wonder").decode()
        req = urllib.request.Request(m[1] + "/ui/", headers={"Authorization": f"Basic {token}"})
        with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
            assert '<tr data-topic="orders">' in r.read().decode()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(m[1] + "/ui/", context=ctx, timeout=30)
        assert e.value.code == 401
        e.value.close()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err


def test_cli_console_port_in_use_is_one_line_naming_it(tmp_path: Path) -> None:
    import socket

    path = str(tmp_path / "s")
    with mqcore.open(path) as s:
        s.create_topic("t")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        where = f"127.0.0.1:{taken.getsockname()[1]}"
        r = subprocess.run(
            [sys.executable, "-m", "mqcore.cli", "console", path, "--http", where],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [r.stderr.strip()] and where in r.stderr


def test_serve_shows_the_members_of_its_kafka_clients_groups(tmp_path: Path) -> None:
    """Beside `mqcore serve`, the group coordinator knows the members of its clients' groups:
    the group page lists them (a kafka-python consumer here)."""
    kafka = pytest.importorskip("kafka")
    from mqcore.server import Server

    with Server(
        str(tmp_path / "s"), "127.0.0.1:0", http="127.0.0.1:0", group_initial_rebalance_delay=0
    ) as server:
        assert server.store is not None and server.http_server is not None
        server.store.create_topic("orders", partitions=2)
        server.store.append("orders", b"x", partition=0)
        consumer = kafka.KafkaConsumer(
            "orders", bootstrap_servers=server.bootstrap, group_id="pickers",
            client_id="picker-1", auto_offset_reset="earliest", enable_auto_commit=False,
        )  # fmt: skip
        try:
            for _ in range(60):
                if consumer.poll(timeout_ms=500) and consumer.assignment():
                    break
            assert consumer.assignment()
            page = Client(server.http_server.url).page("/ui/groups/pickers")
            members = re.findall(r'<li class="member" data-member="([^"]+)">', page)
            assert len(members) == 1 and members[0].startswith("picker-1")
            assert '<span class="client-id">picker-1</span>' in page
            assert '<span id="group-state">Stable</span>' in page
            assert '<span class="assignment">orders: 0, 1</span>' in page  # kafka-python's
            # members and no commit: a consumer group to the store, its name not free
            assert server.store.group_type("pickers") == "consumer"
            with pytest.raises(GroupTypeError):
                server.store.share_consumer("pickers", "orders")
            with pytest.raises(GroupNotEmptyError):
                server.store.alter_group_offsets("pickers", {("orders", 0): 0})
        finally:
            consumer.close()
