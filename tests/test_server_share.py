"""Share groups over `mqcore serve --http` (issue 21): members in other processes, driven with
a plain HTTP client (urllib), one of them killed with SIGKILL while it holds records."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from crashchild import run_child

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytest.importorskip("starlette", reason="the server extra (starlette) is missing")
from mqcore.server import Server  # noqa: E402


def call(url: str, method: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def served(store: mqcore.Store) -> Iterator[tuple[mqcore.Store, str]]:
    store.create_topic("jobs", partitions=2)
    for p in range(2):
        store.append_batch("jobs", [b"job %d-%d" % (p, i) for i in range(50)], partition=p)
    with Server(store, listen="127.0.0.1:0", http="127.0.0.1:0") as server:
        assert server.http_server is not None
        yield store, server.http_server.url + "/v1/share-groups"


# a member in its own process: joins, polls once, prints what it holds, waits to be killed
HOLDER = r"""
import json, sys, urllib.request
base = sys.argv[1]
def post(path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())
member = post("/w/members?topics=jobs&explicit_ack=true&record_lock_ms=1000")["member_id"]
got = post(f"/w/members/{member}/poll?max_records=30")["messages"]
print(" ".join(f"{m['partition']}:{m['offset']}" for m in got), flush=True)
sys.stdin.read()
"""


def test_a_member_process_killed_holding_records_loses_them_to_the_others(
    served: tuple[mqcore.Store, str],
) -> None:
    """The killed member's records go to another member once their locks expire (1 s),
    with delivery count 2; the others were never delivered twice."""
    store, base = served
    child = run_child(HOLDER, base, kill_when=lambda lines: len(lines) >= 1)
    held = {tuple(map(int, x.split(":"))) for x in child.lines[0].split()}
    assert len(held) == 30
    sc = store.share_consumer("w", "jobs", explicit_ack=True)
    seen: dict[tuple[int, int], int] = {}
    while len(seen) < 100:
        msgs = sc.poll(100, timeout_ms=10_000)  # waits for the next lock expiry, not longer
        assert msgs, sorted(set(held) - set(seen))
        for m in msgs:
            seen[(m.partition, m.offset)] = m.delivery_count
            sc.acknowledge(m)
    assert {k for k, n in seen.items() if n == 2} == held
    assert all(n == 1 for k, n in seen.items() if k not in held)
    sc.commit()
    status, lag = call(base + "/w", "GET")
    assert status == 200 and (lag["available"], lag["in_flight"]) == (0, 0)
    sc.close()


def test_members_over_http_share_the_work_and_commit(served: tuple[mqcore.Store, str]) -> None:
    store, base = served
    members = [call(base + "/g/members?topics=jobs&explicit_ack=true", "POST")[1]["member_id"]
               for _ in range(3)]  # fmt: skip
    done: list[tuple[int, int]] = []
    progress = True
    while progress:
        progress = False
        for member in members:
            status, body = call(f"{base}/g/members/{member}/poll?max_records=7", "POST")
            assert status == 200, body
            msgs = body["messages"]
            acks = [[m["topic"], m["partition"], m["offset"], "accept"] for m in msgs]
            status, body = call(
                f"{base}/g/members/{member}/acknowledge", "POST", {"acknowledgements": acks}
            )
            assert (status, body) == (200, {"acknowledged": len(acks)})
            assert call(f"{base}/g/members/{member}/commit", "POST")[0] == 200
            done += [(m["partition"], m["offset"]) for m in msgs]
            assert all(m["delivery_count"] == 1 for m in msgs)
            progress |= bool(msgs)
    assert sorted(done) == [(p, o) for p in range(2) for o in range(50)]
    for member in members:
        assert call(f"{base}/g/members/{member}", "DELETE")[0] == 200
    (lag,) = store.share_group_lag("g")["g"][:1]
    assert lag.start == 50
    status, listing = call(base, "GET")
    assert status == 200 and [g["group"] for g in listing["share_groups"]] == ["g"]


def test_bad_share_requests_get_clear_errors(served: tuple[mqcore.Store, str]) -> None:
    _, base = served
    status, body = call(base + "/g/members", "POST")
    assert status == 400 and "topics=" in body["message"]
    status, body = call(base + "/g/members?topics=jobs&explicit_ack=yes", "POST")
    assert status == 400 and "explicit_ack must be true or false" in body["message"]
    status, body = call(base + "/g/members?topics=nope", "POST")
    assert status == 404 and body["error"] == "UnknownTopicError"
    status, body = call(base + "/g/members/g-share-99/poll", "POST")
    assert status == 404 and "no member" in body["message"]
    member = call(base + "/g/members?topics=jobs&explicit_ack=true", "POST")[1]["member_id"]
    for bad in (b"not json", b'{"acknowledgements": [["jobs", 0, "x", "accept"]]}'):
        req = urllib.request.Request(f"{base}/g/members/{member}/acknowledge", data=bad,
                                     method="POST")  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        assert e.value.code == 400
    status, body = call(
        f"{base}/g/members/{member}/acknowledge", "POST",
        {"acknowledgements": [["jobs", 0, 0, "accept"]]},
    )  # fmt: skip
    assert (status, body["error"]) == (409, "InvalidRecordStateError"), body


def test_a_consumer_group_name_is_refused_as_a_share_group(
    served: tuple[mqcore.Store, str],
) -> None:
    store, base = served
    with store.consumer("orders", "jobs") as c:
        c.poll(5)
        c.commit()
    status, body = call(base + "/orders/members?topics=jobs", "POST")
    assert (status, body["error"]) == (409, "GroupTypeError"), body
    assert "'orders' is a consumer group" in body["message"]


def test_waiting_polls_are_bounded_and_cheap_requests_still_answered(store: mqcore.Store) -> None:
    """50 members long-poll an empty topic with max_share_polls=2: two wait, on threads of their
    own, the other 48 are answered at once with nothing (before, each held one of the 40
    threads every request is served from, so a cheap request waited behind them); a cheap
    request is answered meanwhile, and an append reaches a waiting poll."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from mqcore.server.http import HttpServer, create_app

    store.create_topic("quiet")
    with HttpServer(create_app(store, max_share_polls=2)) as http:
        base = http.url + "/v1/share-groups"
        polls = http.app.state.share_polls
        members = [call(base + "/q/members?topics=quiet", "POST")[1]["member_id"]
                   for _ in range(50)]  # fmt: skip
        with ThreadPoolExecutor(max_workers=50) as pool:
            answers = [
                pool.submit(call, f"{base}/q/members/{m}/poll?timeout_ms=30000", "POST")
                for m in members
            ]
            deadline = time.monotonic() + 30
            while sum(a.done() for a in answers) < 48 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert (polls.waiting, polls.shortened) == (2, 48)
            waiting = [a for a in answers if not a.done()]
            quick = [a.result(30) for a in answers if a.done()]
            assert len(quick) == 48 and all(r == (200, {"messages": []}) for r in quick)
            assert len(waiting) == 2
            assert call(http.url + "/v1/topics", "GET")[0] == 200  # while two wait
            got = []
            for value in (b"first", b"second"):  # each append reaches one waiting poll
                store.append("quiet", value)
                store.flush()
                deadline = time.monotonic() + 30
                while len([a for a in waiting if a.done()]) <= len(got):
                    assert time.monotonic() < deadline, "no waiting poll was answered"
                    time.sleep(0.01)
                done = [a.result() for a in waiting if a.done()]
                got = [m["value"] for _, body in done for m in body["messages"]]
            assert sorted(got) == ["first", "second"]
        assert threading.active_count() < 100
