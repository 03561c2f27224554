"""The HTTP API's scans under load (issue 31: 60 parallel 10 s searches starved cheap requests,
10.5 s waits, and a scan whose client had gone ran on). A real HttpServer over real HTTP; the
store's search is held at a gate (a threading.Event the test opens) instead of being slow, so
nothing depends on timing: what is asserted is who got an answer and the scan counters."""

from __future__ import annotations

import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest
from httpclient import Answer, Client

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytest.importorskip("jinja2", reason="the server extra (jinja2) is missing")
from mqcore.server.http import HttpServer, create_app  # noqa: E402

WAIT = 60  # seconds any wait for a condition may take on a loaded machine before it fails
MESSAGES = 50


class Gate:
    """Stands in for Store.search: counts the calls, holds each at the gate until it opens
    (when `hold`), and with `one_at_a_time` answers at most one match a call, as if its
    time ran out just after it (reason "timeout" and the cursor after it): a long scan's
    slices, made deterministic."""

    def __init__(self, search: Callable[..., Any], hold: bool = True, one_at_a_time: bool = False):
        self.search, self.hold, self.one_at_a_time = search, hold, one_at_a_time
        self.opened = threading.Event()
        self.calls = 0
        self.changed = threading.Condition()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.changed:
            self.calls += 1
            self.changed.notify_all()
        if self.hold:
            assert self.opened.wait(WAIT), "the gate was never opened"
        if not self.one_at_a_time or kwargs["limit"] == 1:
            return self.search(*args, **kwargs)
        r = self.search(*args, **{**kwargs, "limit": 1})
        return replace(r, reason="timeout") if r.reason == "limit" else r

    def wait_for_calls(self, n: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.calls >= n, WAIT), (self.calls, n)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT} s for {what}"
        time.sleep(0.01)


@pytest.fixture
def logs(store: mqcore.Store) -> mqcore.Store:
    store.create_topic("logs")
    for i in range(MESSAGES):
        props = {"level": "ERROR" if i % 5 == 0 else "INFO"}
        store.append("logs", b"line %d" % i, key=b"k%d" % (i % 7), properties=props)
    return store


def serve(store: mqcore.Store, **options: Any) -> HttpServer:
    return HttpServer(create_app(store, **options))


SEARCH = "/v1/topics/logs/search?" + urllib.parse.urlencode({"contains": "line"})


def test_a_cheap_request_is_answered_while_scans_hold_every_slot(
    logs: mqcore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """45 searches held mid-scan (more than Starlette's 40 threads): 2 run (max_scans), the
    others wait for a slot without a thread, and a cheap request is answered meanwhile; when
    the gate opens every search gets its whole answer."""
    gate = Gate(logs.search)
    monkeypatch.setattr(logs, "search", gate)
    with serve(logs, max_scans=2, scan_wait=WAIT) as server, ThreadPoolExecutor(45) as pool:
        scans: Any = server.app.state.scans
        try:
            searches = [pool.submit(Client(server.url).get, SEARCH) for _ in range(45)]
            gate.wait_for_calls(2)
            wait_until(lambda: scans.waiting == 43, "43 searches waiting for a slot")
            cheap = Client(server.url).request("GET", "/v1/topics", timeout=WAIT)
            assert cheap.status == 200 and cheap.json()["topics"][0]["topic"] == "logs"
            assert (gate.calls, scans.running) == (2, 2)
        finally:
            gate.opened.set()
        answers: list[Answer] = [f.result(WAIT) for f in searches]
    assert {a.status for a in answers} == {200}
    assert {len(a.json()["messages"]) for a in answers} == {MESSAGES}
    assert gate.calls == 45 and scans.refused == 0


def test_a_scan_over_the_bound_is_answered_503_after_its_wait(
    logs: mqcore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console's rows share the bound: with the one slot held, a search and a chunk of
    rows are answered 503 with Retry-After once scan_wait (0 here) has passed."""
    gate = Gate(logs.search)
    monkeypatch.setattr(logs, "search", gate)
    with serve(logs, max_scans=1, scan_wait=0) as server, ThreadPoolExecutor(1) as pool:
        scans: Any = server.app.state.scans
        try:
            held = pool.submit(Client(server.url).get, SEARCH)
            gate.wait_for_calls(1)
            for path in (SEARCH, "/ui/topics/logs/rows?contains=line"):
                busy = Client(server.url).get(path)
                assert (busy.status, busy.error) == (503, "HTTPError"), busy.text
                assert busy.headers["retry-after"] == "1" and "try again" in busy.text
            assert scans.refused == 2
        finally:
            gate.opened.set()
        assert held.result(WAIT).status == 200
        assert Client(server.url).get(SEARCH).status == 200


def test_a_scan_stops_when_its_client_goes_away(
    logs: mqcore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search whose client closes its connection mid-scan runs no slice after the one
    under way: one call of the store's search, where the whole scan would take 51."""
    gate = Gate(logs.search, one_at_a_time=True)
    monkeypatch.setattr(logs, "search", gate)
    with serve(logs) as server:
        scans: Any = server.app.state.scans
        host, port = server.address
        with socket.create_connection((host, port), timeout=WAIT) as sock:
            sock.sendall(f"GET {SEARCH} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            gate.wait_for_calls(1)
        wait_until(lambda: server.open_connections == 0, "the server to see the close")
        gate.opened.set()
        wait_until(lambda: scans.running == 0, "the scan to end")
        assert (gate.calls, scans.abandoned) == (1, 1)


def test_a_scan_in_slices_answers_what_one_call_does(
    logs: mqcore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slices that each find one message (and the last one nothing) add up to the single
    call's answer: the messages, the reason, the cursor, the properties no message had."""
    where = "nosuch = 1 OR level = 'ERROR'"
    one_call = logs.search("logs", where=where)
    gate = Gate(logs.search, hold=False, one_at_a_time=True)
    monkeypatch.setattr(logs, "search", gate)
    with serve(logs) as server:
        answer = Client(server.url).get(
            "/v1/topics/logs/search?" + urllib.parse.urlencode({"where": where})
        )
        limited = Client(server.url).get(
            "/v1/topics/logs/search?" + urllib.parse.urlencode({"where": where, "limit": 3})
        )
    body = answer.json()
    assert gate.calls == len(one_call.messages) + 1 + 3
    assert [(m["partition"], m["offset"]) for m in body["messages"]] == [
        (m.partition, m.offset) for m in one_call.messages
    ]
    assert (body["reason"], body["cursor"]) == (one_call.reason, one_call.cursor)
    assert body["missing_properties"] == list(one_call.missing_properties or ()) == ["nosuch"]
    assert limited.json()["reason"] == "limit" and len(limited.json()["messages"]) == 3
