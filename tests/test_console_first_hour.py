"""The console's message browser as a new user met it with real logs (issue 32): a time window
comes back in time order across partitions, "from end" shows the newest messages even when
many share one timestamp, a key combines with the scan filters, and "size on disk" is the
space the files take (the number `mqcore stats` gives), not the apparent size of preallocated
sparse files. A real HttpServer over a real store, asked as the page's script asks."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import run_cli

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytest.importorskip("jinja2", reason="the server extra (jinja2) is missing")
from test_console import Client  # noqa: E402

from mqcore.server.http import HttpServer, create_app  # noqa: E402

T0 = 1_790_000_000_000
LINES = 6527
SHARED = 72  # the last lines share one timestamp (a log written in one second)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mqcore.Store]:
    """`log`: one partition of LINES lines, a second apart but the last SHARED in one ms;
    `app`: three partitions, lines spread over them in time, many timestamps shared;
    `tiny`: 16 messages, the store left open (its files preallocated)."""
    path = tmp_path_factory.mktemp("console_first_hour") / "store"
    with mqcore.open(str(path)) as s:
        s.create_topic("log")
        s.append_batch(
            "log",
            [b"line %d" % i for i in range(LINES)],
            timestamps=[T0 + min(i, LINES - SHARED) * 1000 for i in range(LINES)],
        )
        s.create_topic("app", partitions=3)
        for i in range(900):
            s.append("app", b"event %d" % i, key=b"host-%d" % (i % 5), partition=(i * 7) % 3,
                     timestamp=T0 + (i // 4) * 10, tag="error" if i % 3 else "info")  # fmt: skip
        s.create_topic("tiny")
        for _ in range(16):
            s.append("tiny", b"x" * 100)
        yield s


@pytest.fixture(scope="module")
def client(store: mqcore.Store) -> Iterator[Client]:
    with HttpServer(create_app(store)) as server:
        yield Client(server.url)


def everything(store: mqcore.Store, topic: str) -> list[mqcore.Message]:
    return [m for p in store.available_partitions(topic) for m in store.read(topic, p, 0, 10**6)]


def by_time(msgs: list[mqcore.Message]) -> list[tuple[int, int]]:
    return [(m.partition, m.offset)
            for m in sorted(msgs, key=lambda m: (m.timestamp, m.partition, m.offset))]  # fmt: skip


def first_page(client: Client, topic: str, **form: Any) -> list[tuple[int, int]]:
    """The rows of a query's first page (limit rows at most), chunk after chunk."""
    found, chunks = client.rows(topic, **form)
    return found[: int(form.get("limit", 50))]


def test_from_end_shows_the_newest_messages_when_many_share_a_timestamp(
    client: Client,
) -> None:
    """The newest ten lines of a log whose last 72 share a timestamp are offsets 6517-6526
    (from=end used to start at the shared timestamp: 6455-6464)."""
    assert first_page(client, "log", **{"from": "end"}, limit=10) == [
        (0, o) for o in range(LINES - 10, LINES)
    ]


def test_from_end_across_partitions_is_the_newest_in_time_order(
    store: mqcore.Store, client: Client
) -> None:
    """With three partitions and shared timestamps: the newest `limit` of them all by
    (timestamp, partition, offset), oldest first, and nothing after them; before `to`, the
    newest before it."""
    msgs = everything(store, "app")
    for limit in (1, 10, 37):
        found, chunks = client.rows("app", **{"from": "end"}, limit=limit)
        assert found == by_time(msgs)[-limit:]
        assert chunks[-1]["reason"] == "exhausted"
    to = "2026-09-21T14:13:22"  # T0 + 2 s
    before = [m for m in msgs if m.timestamp < T0 + 2000]
    assert first_page(client, "app", **{"from": "end"}, to=to, limit=10) == by_time(before)[-10:]


def test_a_time_window_comes_back_in_time_order(store: mqcore.Store, client: Client) -> None:
    """from=time and `to`: the page's rows merged across partitions by timestamp (order
    auto); order=partition gives them partition by partition."""
    msgs = [m for m in everything(store, "app") if T0 + 500 <= m.timestamp < T0 + 1500]
    window = {"from": "time", "time": "2026-09-21T14:13:20.500", "to": "2026-09-21T14:13:21.500"}
    found, _ = client.rows("app", **window, limit=1000)
    assert found == by_time(msgs) and len(found) > 100
    paged, _ = client.rows("app", **window, limit=13)
    assert paged == by_time(msgs)
    found, _ = client.rows("app", **window, order="partition", limit=1000)
    assert found == sorted((m.partition, m.offset) for m in msgs)


def test_a_key_combines_with_scan_filters(store: mqcore.Store, client: Client) -> None:
    msgs = everything(store, "app")
    found, chunks = client.rows("app", key="host-2", tag="info", limit=1000)
    expected = [(m.partition, m.offset) for m in msgs if m.key == b"host-2" and m.tag == "info"]
    assert found == expected and found
    found, _ = client.rows("app", key="host-2", tag="info", order="time", limit=7)
    assert found == by_time([m for m in msgs if m.key == b"host-2" and m.tag == "info"])


def blocks_used(store: mqcore.Store, topic: str) -> int:
    total = 0
    for p in store.available_partitions(topic):
        directory = os.path.join(store.path, f"{topic}-{p}")
        for name in os.listdir(directory):
            total += os.stat(os.path.join(directory, name)).st_blocks * 512
    return total


def apparent_size(store: mqcore.Store, topic: str) -> int:
    directory = os.path.join(store.path, f"{topic}-0")
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory))


def test_size_on_disk_is_the_space_used_as_mqcore_stats_says(
    store: mqcore.Store, client: Client
) -> None:
    """A topic of 16 messages in a store held open: its files' apparent size is over 10 MiB
    (preallocated indexes), the blocks they use a few hundred KiB. The overview, the topic's
    partition table and `mqcore stats` all show the blocks."""
    used = blocks_used(store, "tiny")
    assert apparent_size(store, "tiny") > 10 << 20 > 2 * used
    page = client.page("/ui/")
    row = re.search(r'<tr data-topic="tiny">(.*?)</tr>', page, re.S)
    assert row and int(re.search(r'data-bytes="(\d+)"', row[1])[1]) == used  # type: ignore[index]
    page = client.page("/ui/topics/tiny")
    part = re.search(r'<tr data-partition="0">(.*?)</tr>', page, re.S)
    assert part and re.search(r'<td class="size">(\d+)</td>', part[1])[1] == str(used)  # type: ignore[index]
    rc, out, _ = run_cli("stats", store.path, "tiny", "--json")
    assert rc == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows[0]["disk_bytes"] == used == store.disk_bytes("tiny", 0)


def test_the_json_api_takes_the_order(store: mqcore.Store, client: Client) -> None:
    """/v1 by-time and search take order=time (paged by its cursors); partition order stays
    their default, as the Store's."""
    msgs = [m for m in everything(store, "app") if m.timestamp >= T0 + 700]
    found, cursor = [], None
    while True:
        query = f"start={T0 + 700}&order=time&limit=50" + (f"&cursor={cursor}" if cursor else "")
        status, body, _ = client.request("/v1/topics/app/by-time?" + query)
        assert status == 200, body
        answer = json.loads(body)
        found += [(m["partition"], m["offset"]) for m in answer["messages"]]
        if answer["complete"]:
            break
        cursor = answer["cursor"]
    assert found == by_time(msgs)
    status, body, _ = client.request(f"/v1/topics/app/search?tag=info&start={T0 + 700}&limit=900")
    assert [(m["partition"], m["offset"]) for m in json.loads(body)["messages"]] == sorted(
        (m.partition, m.offset) for m in msgs if m.tag == "info"
    )
    status, body, _ = client.request("/v1/topics/app/search?tag=info&order=random")
    assert status == 400 and "order must be" in body
