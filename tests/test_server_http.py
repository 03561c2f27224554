"""The HTTP query API (`mqcore serve --http`, mqcore.server.http) over real HTTP: a running
Server, asked with urllib.request. Each answer is compared with the Store's own answer to the
same question and, where cheap, with brute force over every message read back with
Store.read; JSON messages are decoded here (base64 by the standard library) so a wrong encoding
cannot agree with itself."""

from __future__ import annotations

import base64
import json
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytest.importorskip("starlette", reason="the server extra (starlette) is missing")
from mqcore.errors import InvalidConfigError  # noqa: E402
from mqcore.server import Server  # noqa: E402
from mqcore.server.http import HttpServer, create_app  # noqa: E402

T0 = 1_790_000_000_000  # ms, 2026-09: plausible, and within any age the topic accepts
TAGS = ["paid", "shipped", "refund"]
BINARY_KEY = b"\xff\x00bin"
UID = "01a216f5-d23b-7d3f-81a8-29efc9219a9d"  # a unique ID no message has


class Api:
    """GET against one HTTP server: (status, decoded JSON body)."""

    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params: Any) -> tuple[int, Any]:
        query = "?" + urllib.parse.urlencode(params) if params else ""
        return self.raw(path + query)

    def raw(self, path_and_query: str, method: str = "GET") -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path_and_query, method=method)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.headers["content-type"] == "application/json"
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = e.read()
            assert e.headers["content-type"] == "application/json", body
            return e.code, json.loads(body)

    def ok(self, path: str, **params: Any) -> Any:
        status, body = self.get(path, **params)
        assert status == 200, body
        return body


def fill(store: mqcore.Store) -> None:
    """300 messages over 3 partitions: text, binary and absent keys and values, tags,
    properties, timestamps not in offset order."""
    store.create_topic("orders", partitions=3)
    for i in range(300):
        key = None if i % 11 == 0 else BINARY_KEY if i % 7 == 0 else b"cust-%d" % (i % 13)
        value = bytes([i % 256, 0xFE, 0xFF]) if i % 5 == 0 else b"order %d amount %d" % (i, i)
        store.append(
            "orders", value, key=key, partition=i % 3, timestamp=T0 + (i * 7919) % 1000,
            tag=TAGS[i % 3], properties={"amount": str(i), "region": "eu" if i % 2 else "us"},
            headers=[("h", bytes([i % 256]))],
        )  # fmt: skip


@pytest.fixture
def api(store: mqcore.Store) -> Iterator[Api]:
    fill(store)
    with Server(store, listen="127.0.0.1:0", http="127.0.0.1:0") as server:
        assert server.http_server is not None
        yield Api(server.http_server.url)


def as_bytes(v: Any) -> bytes | None:
    """A JSON key/value back to bytes: a string is UTF-8, {"base64": ...} is the bytes."""
    if v is None:
        return None
    if isinstance(v, dict):
        assert set(v) == {"base64"}
        return base64.b64decode(v["base64"], validate=True)
    assert isinstance(v, str)
    return v.encode("utf-8")


def fields(m: Any) -> tuple[Any, ...]:
    """What a message says, from a Store Message or from its JSON object."""
    if isinstance(m, dict):
        headers = [(as_bytes(k).decode(), as_bytes(v)) for k, v in m["headers"]]  # type: ignore[union-attr]
        return (m["topic"], m["partition"], m["offset"], m["timestamp"], as_bytes(m["key"]),
                as_bytes(m["value"]), headers, m["msg_id"], m["unique_id"], m["tag"],
                m["properties"])  # fmt: skip
    return (m.topic, m.partition, m.offset, m.timestamp, m.key, m.value, list(m.headers),
            m.msg_id, m.unique_id, m.tag, m.properties)  # fmt: skip


def everything(store: mqcore.Store, topic: str = "orders") -> list[mqcore.Message]:
    """Every message of `topic` in (partition, offset) order: the brute-force truth."""
    return [m for p in range(store.partitions(topic)) for m in store.read(topic, p, 0, 1 << 20)]


def same_result(body: Any, r: Any) -> None:
    """An HTTP query result says what the Store's QueryResult says."""
    assert [fields(m) for m in body["messages"]] == [fields(m) for m in r]
    assert (body["reason"], body["cursor"], body["scanned_records"], body["complete"]) == (
        r.reason, r.cursor, r.scanned_records, r.complete)  # fmt: skip


# -- stats ---------------------------------------------------------------------------------------


def test_topics_and_topic_stats_equal_the_stores(api: Api, store: mqcore.Store) -> None:
    listed = api.ok("/v1/topics")["topics"]
    assert [t["topic"] for t in listed] == store.topics()
    for t in listed:
        assert t["internal"] == t["topic"].startswith("__")
        assert t["partitions"] == [
            {"partition": p, "start_offset": store.start_offset(t["topic"], p),
             "end_offset": store.end_offset(t["topic"], p)}
            for p in store.available_partitions(t["topic"])
        ]  # fmt: skip
    one = api.ok("/v1/topics/orders")
    assert one["config"] == asdict(store.topic_config("orders"))
    assert [(p["partition"], p["end_offset"], p["segments"]) for p in one["partitions"]] == [
        (p, store.end_offset("orders", p), len(store.segment_offsets("orders", p)))
        for p in range(3)
    ]
    assert sum(p["end_offset"] for p in one["partitions"]) == 300


def test_groups_and_their_lag_equal_group_lag(api: Api, store: mqcore.Store) -> None:
    assert api.ok("/v1/groups") == {"groups": []}
    c = store.consumer("billing", "orders")
    c.poll(max_records=40)
    c.commit()
    c.close()
    truth = store.group_lag()
    body = api.ok("/v1/groups")
    assert [g["group"] for g in body["groups"]] == sorted(truth) == ["billing"]
    one = api.ok("/v1/groups/billing")
    assert one == body["groups"][0]
    assert one["partitions"] == [p.to_json() for p in truth["billing"]]
    assert one["lag"] == sum(
        store.end_offset("orders", p["partition"]) - p["committed"] for p in one["partitions"]
    )
    assert sum(p["committed"] for p in one["partitions"]) == 40


# -- lookups -------------------------------------------------------------------------------------


def test_every_message_by_offset_by_store_id_and_by_unique_id(
    api: Api, store: mqcore.Store
) -> None:
    all_messages = everything(store)
    assert len(all_messages) == 300
    for m in all_messages:
        by_place = api.ok(f"/v1/topics/orders/partitions/{m.partition}/offsets/{m.offset}")
        assert fields(by_place["message"]) == fields(m)
    for m in all_messages[::17]:
        assert fields(api.ok(f"/v1/messages/{m.msg_id}")["message"]) == fields(m)
        assert m.unique_id is not None
        r = store.find_by_unique_id(m.unique_id)
        same_result(api.ok(f"/v1/unique-ids/{m.unique_id}"), r)
        assert [x.offset for x in r] == [m.offset]


def test_binary_keys_and_values_round_trip(api: Api, store: mqcore.Store) -> None:
    """Bytes that are not UTF-8 come back as {"base64": ...}, text as a string; a binary key
    is asked for with key_base64."""
    body = api.ok("/v1/topics/orders/by-key", key_base64=base64.b64encode(BINARY_KEY).decode())
    assert body["messages"] and all(m["key"] == {"base64": "/wBiaW4="} for m in body["messages"])
    truth = [m for m in everything(store) if m.key == BINARY_KEY]
    assert [fields(m) for m in body["messages"]] == [fields(m) for m in truth]
    first = api.ok("/v1/topics/orders/partitions/0/offsets/0")["message"]
    assert first["value"] == {"base64": base64.b64encode(bytes([0, 0xFE, 0xFF])).decode()}
    assert first["key"] is None
    text = api.ok("/v1/topics/orders/partitions/1/offsets/0")["message"]
    assert (text["key"], text["value"]) == ("cust-1", "order 1 amount 1")


def test_by_key_equals_find_by_key_and_brute_force(api: Api, store: mqcore.Store) -> None:
    all_messages = everything(store)
    for key in [b"cust-3", b"cust-12", b"nobody"]:
        body = api.ok("/v1/topics/orders/by-key", key=key.decode())
        same_result(body, store.find_by_key("orders", key, limit=100))
        assert [fields(m) for m in body["messages"]] == [
            fields(m) for m in all_messages if m.key == key
        ]
    lo, hi = T0 + 200, T0 + 700
    body = api.ok("/v1/topics/orders/by-key", key="cust-4", start=lo, end=hi, partition=1)
    same_result(body, store.find_by_key("orders", b"cust-4", start=lo, end=hi, partition=1))
    assert [fields(m) for m in body["messages"]] == [
        fields(m) for m in all_messages
        if m.key == b"cust-4" and m.partition == 1 and lo <= m.timestamp < hi
    ]  # fmt: skip


def test_by_time_equals_range_and_brute_force(api: Api, store: mqcore.Store) -> None:
    lo, hi = T0 + 100, T0 + 350
    body = api.ok("/v1/topics/orders/by-time", start=lo, end=hi, limit=1000)
    same_result(body, store.range("orders", lo, hi, limit=1000))
    assert [fields(m) for m in body["messages"]] == [
        fields(m) for m in everything(store) if lo <= m.timestamp < hi
    ]
    assert body["complete"] and body["cursor"] is None


SEARCHES: list[tuple[dict[str, Any], Any]] = [
    ({"tag": "refund"}, lambda m: m.tag == "refund"),
    ({"where": "amount > 250 AND region = 'eu'"},
     lambda m: int(m.properties["amount"]) > 250 and m.properties["region"] == "eu"),
    ({"contains": "amount 1"}, lambda m: m.value is not None and b"amount 1" in m.value),
    ({"contains_base64": base64.b64encode(b"\xfe\xff").decode()},
     lambda m: m.value is not None and b"\xfe\xff" in m.value),
    ({"regex": "^order [0-9]*7 "}, lambda m: re.match(rb"^order [0-9]*7 ", m.value or b"")),
    ({"tag": "paid", "where": "region = 'us'", "contains": "order"},
     lambda m: m.tag == "paid" and m.properties["region"] == "us" and b"order" in m.value),
]  # fmt: skip


@pytest.mark.parametrize(("params", "matches"), SEARCHES)
def test_search_equals_store_search_and_brute_force(
    api: Api, store: mqcore.Store, params: dict[str, Any], matches: Any
) -> None:
    body = api.ok("/v1/topics/orders/search", limit=1000, **params)
    kwargs = {k.removesuffix("_base64"): v for k, v in params.items()}
    if "contains_base64" in params:
        kwargs["contains"] = base64.b64decode(params["contains_base64"])
    same_result(body, store.search("orders", limit=1000, **kwargs))
    truth = [fields(m) for m in everything(store) if matches(m)]
    assert truth and [fields(m) for m in body["messages"]] == truth


def test_missing_properties_are_reported(api: Api) -> None:
    body = api.ok("/v1/topics/orders/search", where="service = payments")
    assert body["messages"] == [] and body["missing_properties"] == ["payments", "service"]


# -- paging and bounds ---------------------------------------------------------------------------


def pages(api: Api, path: str, **params: Any) -> list[Any]:
    """Every message of a query, page after page by cursor, until the result is complete."""
    found: list[Any] = []
    cursor = None
    for _ in range(1000):
        extra: dict[str, str] = {} if cursor is None else {"cursor": cursor}
        body = api.ok(path, **params, **extra)
        found += body["messages"]
        if body["complete"]:
            assert body["cursor"] is None
            return found
        cursor = body["cursor"]
        assert cursor is not None
    raise AssertionError("paging did not end")


def test_cursor_pages_equal_one_big_query(api: Api, store: mqcore.Store) -> None:
    big = store.search("orders", where="amount > 20", limit=100_000)
    paged = pages(api, "/v1/topics/orders/search", where="amount > 20", limit=7)
    assert [fields(m) for m in paged] == [fields(m) for m in big] and len(big) == 279
    scanned = pages(api, "/v1/topics/orders/search", tag="paid", max_scan=13)
    assert [fields(m) for m in scanned] == [fields(m) for m in store.search("orders", tag="paid")]
    by_key = pages(api, "/v1/topics/orders/by-key", key="cust-5", limit=2)
    assert [fields(m) for m in by_key] == [fields(m) for m in store.find_by_key("orders", "cust-5")]
    by_time = pages(api, "/v1/topics/orders/by-time", start=T0 + 500, limit=9)
    assert [fields(m) for m in by_time] == [fields(m) for m in store.range("orders", T0 + 500)]


def test_limit_is_capped_and_scan_time_bounded(store: mqcore.Store) -> None:
    """A limit above the server's cap returns the cap and a cursor; a scan stops at the
    server's time cap (here 0 s, whatever the request asks) with a cursor that resumes it."""
    fill(store)
    with HttpServer(create_app(store, max_limit=5)) as http:
        body = Api(http.url).ok("/v1/topics/orders/by-time", limit=1_000_000)
        assert len(body["messages"]) == 5 and body["reason"] == "limit" and body["cursor"]
    # a selector the scan kernel cannot run (a property against a property; `nosuch` is
    # missing, so it matches where amount > 0 does): Python filters each candidate and checks
    # the time after each one, so the 0 s cap shows on 300 messages (the kernel checks it
    # after each call of up to SCAN_CALL_RECORDS records)
    where = "amount > 0 OR amount = nosuch"
    with HttpServer(create_app(store, max_timeout=0.0)) as http:
        a = Api(http.url)
        body = a.ok("/v1/topics/orders/search", where=where, timeout=100)
        assert body["reason"] == "timeout" and body["cursor"]
        resumed = pages(a, "/v1/topics/orders/search", where=where, timeout=100)
        truth = store.search("orders", where=where)
        assert [fields(m) for m in resumed] == [fields(m) for m in truth] and len(truth) == 299


# -- errors --------------------------------------------------------------------------------------

BAD: list[tuple[str, int, str, str]] = [
    ("/v1/topics/nope", 404, "UnknownTopicError", "'nope'"),
    ("/v1/topics/nope/search?tag=a", 404, "UnknownTopicError", "'nope'"),
    ("/v1/topics/orders/partitions/9/offsets/0", 404, "UnknownPartitionError", "9"),
    ("/v1/topics/orders/partitions/0/offsets/100000", 404, "MessageNotFoundError", "100000"),
    ("/v1/topics/orders/partitions/0/offsets/-1", 400, "InvalidConfigError", "offset"),
    ("/v1/topics/orders/partitions/x/offsets/0", 400, "InvalidConfigError", "partition"),
    ("/v1/topics/orders/search?cursor=c1-0-07", 400, "InvalidConfigError", "cursor"),
    ("/v1/topics/orders/by-key?key=a&cursor=zz", 400, "InvalidConfigError", "cursor"),
    ("/v1/topics/orders/search?where=amount%20%3E", 400, "SelectorSyntaxError", "column 9"),
    ("/v1/topics/orders/search?regex=(a)%5C1", 400, "InvalidConfigError", "backreference"),
    ("/v1/topics/orders/search?limit=0", 400, "InvalidConfigError", "limit"),
    ("/v1/topics/orders/by-time?limit=0", 400, "InvalidConfigError", "limit"),
    ("/v1/topics/orders/by-key?key=a&limit=0", 400, "InvalidConfigError", "limit"),
    ("/v1/topics/orders/partitions/0/messages?limit=0", 400, "InvalidConfigError", "limit"),
    (f"/v1/unique-ids/{UID}?limit=0", 400, "InvalidConfigError", "limit"),
    ("/v1/topics/orders/search?limit=ten", 400, "InvalidConfigError", "limit"),
    ("/v1/topics/orders/search?max_scan=0", 400, "InvalidConfigError", "max_scan"),
    ("/v1/topics/orders/search?timeout=nan", 400, "InvalidConfigError", "timeout"),
    ("/v1/topics/orders/by-time?start=9&end=5", 400, "InvalidConfigError", "start"),
    ("/v1/topics/orders/by-time?limt=5", 400, "InvalidConfigError", "'limt'"),
    ("/v1/topics/orders/by-time?limit=5&limit=6", 400, "InvalidConfigError", "more than once"),
    ("/v1/topics/orders/by-key", 400, "InvalidConfigError", "key="),
    ("/v1/topics/orders/by-key?key=a&key_base64=YQ%3D%3D", 400, "InvalidConfigError", "both"),
    ("/v1/topics/orders/by-key?key_base64=%%%", 400, "InvalidConfigError", "key_base64"),
    ("/v1/topics/orders/by-key?key_base64=@@", 400, "InvalidConfigError", "key_base64"),
    ("/v1/topics/orders/by-key?key=%FF", 400, "InvalidConfigError", "UTF-8"),
    ("/v1/messages/m1-nonsense", 400, "InvalidMessageIdError", "m1-nonsense"),
    ("/v1/unique-ids/not-a-uuid", 400, "InvalidMessageIdError", "not-a-uuid"),
    ("/v1/groups/bad%20name", 404, "UnknownGroupError", "'bad name'"),  # Kafka takes any name
    ("/v1/groups/nobody", 404, "UnknownGroupError", "'nobody'"),
    ("/v1/nothing/here", 404, "HTTPError", "/v1/nothing/here"),
    ("/nothing", 404, "HTTPError", "no route"),  # (`/` redirects to the console, /ui/)
]


@pytest.mark.parametrize(("path", "status", "error", "named"), BAD)
def test_bad_input_is_a_4xx_json_error_naming_it(
    api: Api, path: str, status: int, error: str, named: str
) -> None:
    code, body = api.raw(path)
    assert (code, body["error"]) == (status, error), body
    assert named in body["message"] and "Traceback" not in body["message"]


def test_a_write_method_is_405_json(api: Api) -> None:
    code, body = api.raw("/v1/topics", method="POST")
    assert code == 405 and body["error"] == "HTTPError"


# -- serving -------------------------------------------------------------------------------------


def test_binds_to_loopback_unless_told(store: mqcore.Store) -> None:
    fill(store)
    with Server(store, listen="127.0.0.1:0", http=":0") as server:
        assert server.http_server is not None
        host, port = server.http_server.address
        assert host == "127.0.0.1" and port > 0
        assert Api(server.http_server.url).ok("/v1/topics")["topics"]
    with HttpServer(create_app(store)) as http:
        assert http.address[0] == "127.0.0.1"
        assert Api(http.url).ok("/v1/topics")["topics"]
    with Server(store, listen="127.0.0.1:0") as server:
        assert server.http_server is None  # no --http, no HTTP server


def test_a_bad_http_address_or_a_taken_port_is_refused(store: mqcore.Store) -> None:
    with pytest.raises(InvalidConfigError, match="HOST:PORT"):
        Server(store, listen="127.0.0.1:0", http="localhost")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        server = Server(store, listen="127.0.0.1:0", http=f"127.0.0.1:{taken.getsockname()[1]}")
        with pytest.raises(OSError):
            server.start()
        # the Kafka listener it had opened is closed again: its port takes a new listener
        again = socket.socket()
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", server.port))
        again.close()
    finally:
        taken.close()


def test_stop_then_start_serves_again(store: mqcore.Store) -> None:
    fill(store)
    http = HttpServer(create_app(store)).start()
    Api(http.url).ok("/v1/topics")
    http.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(http.url + "/v1/topics", timeout=5)
    with HttpServer(create_app(store), f"127.0.0.1:{http.port}") as again:
        assert Api(again.url).ok("/v1/topics/orders")["topic"] == "orders"


def test_messages_produced_over_kafka_are_visible_over_http(store: mqcore.Store) -> None:
    ck = pytest.importorskip("confluent_kafka")
    store.create_topic("wire", partitions=2)
    with Server(store, listen="127.0.0.1:0", http="127.0.0.1:0") as server:
        assert server.http_server is not None
        a = Api(server.http_server.url)
        p = ck.Producer({"bootstrap.servers": server.bootstrap})
        sent = []
        for i in range(50):
            key, value = b"k-%d" % (i % 4), b"\x00\xff wire %d" % i
            headers = [("n", b"%d" % i), ("bin", bytes([0, 255, i]))]
            sent.append((key, value, headers))
            p.produce("wire", key=key, value=value, headers=headers)
        assert p.flush(30) == 0
        over_http = pages(a, "/v1/topics/wire/by-time", limit=20)
        got = sorted((as_bytes(m["key"]), as_bytes(m["value"]),
                      [(k, as_bytes(v)) for k, v in m["headers"]]) for m in over_http)  # fmt: skip
        assert got == sorted(sent)
        assert [fields(m) for m in over_http] == [fields(m) for m in everything(store, "wire")]
        body = a.ok("/v1/topics/wire/by-key", key="k-2")
        assert sorted(as_bytes(m["value"]) or b"" for m in body["messages"]) == sorted(
            v for k, v, _ in sent if k == b"k-2"
        )
        found = a.ok(
            "/v1/topics/wire/search", contains_base64=base64.b64encode(b"wire 17").decode()
        )
        assert [as_bytes(m["value"]) for m in found["messages"]] == [b"\x00\xff wire 17"]


def test_a_closed_store_is_503_and_a_bug_is_500_without_its_traceback(
    store_path: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    s = mqcore.open(store_path, flush="os")
    s.create_topic("t")
    with HttpServer(create_app(s)) as http:
        a = Api(http.url)
        monkeypatch.setattr(s, "topics", lambda: 1 // 0)
        code, body = a.get("/v1/topics")
        assert (code, body["error"]) == (500, "InternalError")
        assert "ZeroDivisionError" not in json.dumps(body)
        assert "ZeroDivisionError" in caplog.text  # the server's log has it
        s.close()
        code, body = a.get("/v1/topics/t/search", tag="a")
        assert (code, body["error"]) == (503, "StoreClosedError")


def test_reading_a_partition_page_by_page_equals_store_read(api: Api, store: mqcore.Store) -> None:
    for p in range(3):
        found: list[Any] = []
        offset = 0
        while True:
            body = api.ok(f"/v1/topics/orders/partitions/{p}/messages", offset=offset, limit=30)
            assert body["end_offset"] == store.end_offset("orders", p)
            found += body["messages"]
            if not body["messages"]:
                break
            offset = body["next_offset"]
        assert [fields(m) for m in found] == [fields(m) for m in store.read("orders", p, 0, 1000)]
    code, body = api.get("/v1/topics/orders/partitions/0/messages", offset=10**6)
    assert (code, body["error"]) == (400, "OffsetOutOfRangeError")
