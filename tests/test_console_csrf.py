"""The console and the JSON API against cross-site requests (issue 31): raw HTTP requests with
forged Host, Origin and Referer headers, as a DNS-rebinding page's browser would send them
(evil.example resolving to 127.0.0.1), and CSRF tokens that belong to another user's or
another browser's session. A refused write leaves the store as it was."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from httpclient import Client

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytest.importorskip("jinja2", reason="the server extra (jinja2) is missing")
from mqcore.server.auth import add_user  # noqa: E402
from mqcore.server.http import HttpServer, create_app  # noqa: E402
from mqcore.server.httpauth import HttpAuth  # noqa: E402

EVIL = "evil.example"
PRODUCE = {"topic": "orders", "value": "forged"}


@pytest.fixture
def writable(store: mqcore.Store) -> mqcore.Store:
    store.create_topic("orders")
    return store


@pytest.fixture
def console(writable: mqcore.Store) -> Iterator[HttpServer]:
    with HttpServer(create_app(writable, allow_write=True, allowed_hosts=["mq.example"])) as s:
        yield s


def port_of(server: HttpServer) -> int:
    return server.address[1]


def test_a_rebinding_pages_host_is_refused_on_every_request(
    console: HttpServer, writable: mqcore.Store
) -> None:
    """Host evil.example (the name the page's browser thinks it talks to): refused before
    anything is read or written, pages, JSON API and write actions alike."""
    client = Client(console.url)
    token = client.form_token()
    evil = f"{EVIL}:{port_of(console)}"
    for path in ("/ui/", "/ui/topics/orders", "/v1/topics", "/v1/share-groups"):
        answer = client.get(path, Host=evil)
        assert (answer.status, answer.error) == (421, "HTTPError"), path
        assert f"{EVIL!r} is not a name this server answers to" in answer.json()["message"]
    forged = client.post_form(
        "/ui/actions/produce", {"csrf": token, **PRODUCE}, Host=evil, Origin=f"http://{evil}"
    )
    assert forged.status == 421
    assert client.get("/ui/", Host="").status == 421  # an empty Host is no name of ours
    assert writable.end_offset("orders") == 0


def test_the_served_names_are_answered(console: HttpServer) -> None:
    """The listen address, localhost on loopback, and the names given as allowed_hosts (any
    port, any case, a trailing dot)."""
    client = Client(console.url)
    port = port_of(console)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST.", "mq.example:443"):
        assert client.get("/ui/", Host=host).status == 200, host


def test_a_foreign_origin_or_referer_is_refused_on_every_write(
    console: HttpServer, writable: mqcore.Store
) -> None:
    client = Client(console.url)
    token = client.form_token()
    form = {"csrf": token, **PRODUCE}
    client.origin = None
    for headers in (
        {"Origin": f"http://{EVIL}"},
        {"Origin": "null"},
        {"Origin": f"http://127.0.0.1:{port_of(console) + 1}"},
        {"Referer": f"http://{EVIL}/attack.html"},
    ):
        answer = client.post_form("/ui/actions/produce", form, **headers)
        assert (answer.status, answer.error) == (403, "HTTPError"), headers
        assert "cross-origin" in answer.json()["message"]
    answer = client.post_form("/ui/actions/produce", form)  # neither header: not a browser's
    assert answer.status == 403 and "Origin" in answer.text
    assert writable.end_offset("orders") == 0
    referer = client.post_form("/ui/actions/produce", form, Referer=console.url + "/ui/")
    assert referer.status == 303
    assert client.post_form("/ui/actions/produce", form, Origin=console.url).status == 303
    assert writable.end_offset("orders") == 2


def test_a_share_group_write_from_a_foreign_page_is_refused(
    console: HttpServer, writable: mqcore.Store
) -> None:
    """The JSON API's POST and DELETE: a browser's Origin, when there is one, must be ours;
    a client that sends none (curl, a program) is answered as before."""
    client = Client(console.url)
    client.origin = f"http://{EVIL}"
    join = "/v1/share-groups/workers/members?topics=orders"
    assert client.request("POST", join).status == 403
    assert writable.share_group_lag() == {}
    client.origin = None
    member = client.request("POST", join).json()["member_id"]
    client.origin = f"http://{EVIL}"
    assert client.request("DELETE", f"/v1/share-groups/workers/members/{member}").status == 403
    client.origin = console.url
    assert client.request("DELETE", f"/v1/share-groups/workers/members/{member}").status == 200


def test_a_token_serves_only_its_own_browser_session(
    console: HttpServer, writable: mqcore.Store
) -> None:
    """Without authentication the token is bound to the browser's session cookie: another
    browser's token (one a page got hold of) does not work with this browser's cookie."""
    mine, theirs = Client(console.url), Client(console.url)
    their_token = theirs.form_token()
    my_token = mine.form_token()
    assert mine.cookies and mine.cookies != theirs.cookies and my_token != their_token
    answer = mine.post_form("/ui/actions/produce", {"csrf": their_token, **PRODUCE})
    assert answer.status == 403 and "CSRF" in answer.text
    mine.cookies.clear()  # no session cookie: no token is valid
    assert mine.post_form("/ui/actions/produce", {"csrf": my_token, **PRODUCE}).status == 403
    assert writable.end_offset("orders") == 0


def test_with_authentication_a_token_is_its_users_only(
    writable: mqcore.Store, tmp_path: Path
) -> None:
    """alice's token, even with alice's session cookie, does not let bob write: the token is
    bound to the principal as well as to the browser session."""
    creds = tmp_path / "users"
    add_user(creds, "alice", "wonder")
    add_user(creds, "bob", "builder")
    auth = HttpAuth.load(str(creds))
    with HttpServer(create_app(writable, allow_write=True, auth=auth)) as server:
        alice, bob = Client(server.url, "alice", "wonder"), Client(server.url, "bob", "builder")
        token = alice.form_token()
        bob.cookies = dict(alice.cookies)
        answer = bob.post_form("/ui/actions/produce", {"csrf": token, **PRODUCE})
        assert answer.status == 403 and "CSRF" in answer.text
        assert writable.end_offset("orders") == 0
        assert bob.submit("/ui/actions/produce", PRODUCE).status == 303
        assert alice.submit("/ui/actions/produce", PRODUCE).status == 303
    assert writable.end_offset("orders") == 2


def test_cli_console_allowed_host(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    with mqcore.open(path) as s:
        s.create_topic("t")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqcore.cli", "console", path, "--http", "127.0.0.1:0",
         "--allowed-host", "mq.example", "--allowed-host", "other.example"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"(http://127\.0\.0\.1:\d+)/ui/", line)
        assert m, line
        client = Client(m[1])
        assert client.get("/ui/", Host="mq.example").status == 200
        assert client.get("/ui/", Host="other.example:8080").status == 200
        assert client.get("/ui/", Host=EVIL).status == 421
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_an_ipv6_listener_answers_its_address_in_brackets(writable: mqcore.Store) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        server = HttpServer(create_app(writable, allow_write=True), "[::1]:0").start()
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    try:
        port = port_of(server)
        client = Client(server.url)
        assert client.get("/ui/").status == 200  # Host [::1]:PORT
        assert client.get("/ui/", Host=f"[0:0::1]:{port}").status == 200
        assert client.get("/ui/", Host=f"localhost:{port}").status == 200
        assert client.get("/ui/", Host=f"{EVIL}:{port}").status == 421
        token = client.form_token()
        form = {"csrf": token, **PRODUCE}
        assert client.post_form("/ui/actions/produce", form).status == 303  # Origin [::1]
        assert writable.end_offset("orders") == 1
    finally:
        server.stop()


def test_mqcore_serve_answers_the_host_names_it_is_given(writable: mqcore.Store) -> None:
    """Server(http_allowed_hosts=) reaches the HTTP app: a name given is answered, another
    refused (421), as `mqcore serve --allowed-host` does."""
    from mqcore.server import Server

    with Server(writable, "127.0.0.1:0", http="127.0.0.1:0",
                http_allowed_hosts=("mq.example",)) as srv:  # fmt: skip
        assert srv.http_server is not None
        client = Client(srv.http_server.url)
        port = srv.http_server.address[1]
        assert client.get("/v1/topics", Host=f"mq.example:{port}").status == 200
        assert client.get("/v1/topics", Host=f"{EVIL}:{port}").status == 421


def test_a_servers_advertised_host_is_a_name_its_http_api_answers_to(tmp_path: Path) -> None:
    """`mqcore serve --advertised-host NAME --http ...`: the other brokers of a cluster (and
    clients told the name) reach the HTTP API by that name, so it is answered; another name
    still is not."""
    from mqcore.server import Server

    with Server(tmp_path / "s", "127.0.0.1:0", create=True, http="127.0.0.1:0",
                advertised_host="broker1.example") as server:  # fmt: skip
        assert server.http_server is not None
        client = Client(server.http_server.url)
        port = port_of(server.http_server)
        assert client.get("/v1/topics", Host=f"broker1.example:{port}").status == 200
        assert client.get("/v1/topics", Host=f"{EVIL}:{port}").status == 421
