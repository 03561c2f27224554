"""The HTTP API and the console apply the same ACLs as the Kafka listener (issue 31): every
unauthorized attempt of the issue's probe, as a table of (interface, operation, principal) ->
expected answer, run against a real `Server(..., http=, sasl_credentials=, acl=)` and a real
console app (`create_app(..., allow_write=True, auth=HttpAuth.load(...))`) over real HTTP.

Principals (ACL below): `reader` may read orders.public only (the issue's user), `nobody`
exists with no grant at all, `viewer` may describe the topic secret and the group billing,
`member` may read orders.public and the groups workers and billing, `owner` may do everything
to every ordinary topic and group (so not read, and never write, an internal topic).

Expected answers: "STATUS ERROR" (the JSON error's name; for a console page, the page's error
says what it may not do to which kind of resource), or "200 shows: A, B" (what a listing
lists, each name once: topic names, GROUP/TOPIC rows of a group listing, group names, the
topics of the messages found; "-" for nothing)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from httpclient import Answer, Client

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytest.importorskip("jinja2", reason="the server extra (jinja2) is missing")
from mqcore.server import Server  # noqa: E402
from mqcore.server.auth import add_user  # noqa: E402
from mqcore.server.http import HttpServer, create_app  # noqa: E402
from mqcore.server.httpauth import HttpAuth  # noqa: E402

ACL = """
owner   all   *
owner   all   group:*
reader  read  orders.public
viewer  describe  secret
viewer  describe  group:billing
member  read  orders.public
member  read  group:workers
member  read  group:billing
"""
USERS = ("owner", "reader", "viewer", "member", "nobody")
WHEN = "time=2026-01-01T00:00"
PRODUCE, RESEND, RESET = (f"POST /ui/actions/{a}" for a in ("produce", "resend", "reset-offsets"))
SHARE = "/v1/share-groups/workers/members"
TOPIC_REFUSED, GROUP_REFUSED = "403 TopicAuthorizationError", "403 GroupAuthorizationError"
REJECT = json.dumps({"acknowledgements": [["secret", 0, 0, "reject"]]})

# (interface, operation, principal, expected answer). `http` is `mqcore serve --http` (the JSON
# API), `console` the console with write actions on, both with credentials and the ACL above;
# `open` is the console without credentials (everyone may do everything, except write an
# internal topic). {secret_id}, {secret_uid}, {owner_member} and {forged} are filled in from
# the store: a message of `secret` (its store ID, its unique ID), the share member `owner`
# joined, a message of orders.public whose origin headers name __consumer_offsets.
ATTEMPTS: list[tuple[str, str, str, str]] = [
    # topics: listed only where describable; anything more of one needs describe
    ("http", "GET /v1/topics", "reader", "200 shows: orders.public"),
    ("http", "GET /v1/topics", "nobody", "200 shows: -"),
    ("http", "GET /v1/topics", "owner", "200 shows: orders.public, secret"),
    ("http", "GET /v1/topics/secret", "reader", TOPIC_REFUSED),
    ("http", "GET /v1/topics/no.such.topic", "reader", TOPIC_REFUSED),
    ("http", "GET /v1/topics/__consumer_offsets", "reader", TOPIC_REFUSED),
    ("http", "GET /v1/topics/__consumer_offsets", "owner", TOPIC_REFUSED),
    # messages: read, whether or not the message (or the topic) exists
    ("http", "GET /v1/topics/secret/partitions/0/messages", "reader", TOPIC_REFUSED),
    ("http", "GET /v1/topics/secret/partitions/0/messages", "viewer", TOPIC_REFUSED),
    ("http", "GET /v1/topics/__consumer_offsets/partitions/0/messages", "reader", TOPIC_REFUSED),
    ("http", "GET /v1/topics/__consumer_offsets/partitions/0/messages", "owner", TOPIC_REFUSED),
    ("http", "GET /v1/topics/secret/partitions/0/offsets/0", "nobody", TOPIC_REFUSED),
    ("http", "GET /v1/topics/secret/partitions/0/offsets/999", "nobody", TOPIC_REFUSED),
    ("http", "GET /v1/messages/{secret_id}", "reader", TOPIC_REFUSED),
    ("http", "GET /v1/unique-ids/{secret_uid}", "reader", "200 shows: -"),
    ("http", "GET /v1/unique-ids/{secret_uid}", "owner", "200 shows: secret"),
    ("http", "GET /v1/topics/secret/by-key?key=k-secret", "reader", TOPIC_REFUSED),
    ("http", "GET /v1/topics/secret/by-time", "reader", TOPIC_REFUSED),
    ("http", "GET /v1/topics/secret/search?contains=s", "nobody", TOPIC_REFUSED),
    # consumer groups: group describe, and each partition's topic describe
    ("http", "GET /v1/groups", "reader", "200 shows: -"),
    ("http", "GET /v1/groups", "viewer", "200 shows: billing/secret"),
    ("http", "GET /v1/groups", "owner", "200 shows: billing/orders.public, billing/secret"),
    ("http", "GET /v1/groups/billing", "reader", GROUP_REFUSED),
    ("http", "GET /v1/groups/no-such-group", "reader", GROUP_REFUSED),
    # share groups: describe to see, read (and the topics' read) to join; a member is its
    # principal's alone (another's member ID is answered as an unknown one)
    ("http", "GET /v1/share-groups", "reader", "200 shows: -"),
    ("http", "GET /v1/share-groups", "owner", "200 shows: workers"),
    ("http", "GET /v1/share-groups/workers", "reader", GROUP_REFUSED),
    ("http", f"POST {SHARE}?topics=secret", "reader", GROUP_REFUSED),
    ("http", f"POST {SHARE}?topics=secret", "member", TOPIC_REFUSED),
    ("http", f"POST {SHARE}/{{owner_member}}/acknowledge {REJECT}", "reader", GROUP_REFUSED),
    ("http", f"POST {SHARE}/{{owner_member}}/acknowledge {REJECT}", "member",
     "404 UnknownGroupError"),
    ("http", f"POST {SHARE}/{{owner_member}}/poll", "member", "404 UnknownGroupError"),
    ("http", f"POST {SHARE}/{{owner_member}}/commit", "member", "404 UnknownGroupError"),
    ("http", f"DELETE {SHARE}/{{owner_member}}", "member", "404 UnknownGroupError"),
    # the console's pages
    ("console", "GET /ui/", "reader", "200 shows: orders.public"),
    ("console", "GET /ui/", "nobody", "200 shows: -"),
    ("console", "GET /ui/topics/secret", "reader", TOPIC_REFUSED),
    ("console", "GET /ui/topics/secret/rows", "reader", TOPIC_REFUSED),
    ("console", "GET /ui/topics/secret/rows?contains=s", "viewer", TOPIC_REFUSED),
    ("console", "GET /ui/topics/__consumer_offsets", "owner", TOPIC_REFUSED),
    ("console", "GET /ui/topics/secret/partitions/0/offsets/0", "reader", TOPIC_REFUSED),
    ("console", "GET /ui/lookup?q=secret/0/0", "reader", TOPIC_REFUSED),
    ("console", "GET /ui/lookup?q={secret_id}", "reader", TOPIC_REFUSED),
    ("console", "GET /ui/lookup?q={secret_uid}", "reader", "200 shows: -"),
    ("console", "GET /ui/lookup?q=k-secret", "reader", "200 shows: -"),
    ("console", "GET /ui/lookup?q=k-secret", "owner", "200 shows: secret"),
    ("console", "GET /ui/lookup?q=k-secret&topic=secret", "reader", TOPIC_REFUSED),
    ("console", "GET /ui/groups", "reader", "200 shows: -"),
    ("console", "GET /ui/groups", "owner", "200 shows: billing, workers"),
    ("console", "GET /ui/groups/billing", "reader", GROUP_REFUSED),
    ("console", "GET /ui/groups/workers", "reader", GROUP_REFUSED),
    ("console", "GET /ui/groups/workers", "viewer", GROUP_REFUSED),
    # the console's write actions: produce and resend need write on the topic written (never
    # an internal one) and read on the copy resent; a reset needs the group's read and each
    # topic's read (Kafka's OffsetCommit, which kafka-consumer-groups --reset-offsets sends)
    ("console", f"{PRODUCE} topic=secret&value=x", "reader", TOPIC_REFUSED),
    ("console", f"{PRODUCE} topic=__consumer_offsets&value=x", "owner", TOPIC_REFUSED),
    ("console", f"{RESEND} topic=secret&partition=0&offset=0", "reader", TOPIC_REFUSED),
    ("console", f"{RESEND} topic=orders.public&partition=0&offset={{forged}}", "owner",
     TOPIC_REFUSED),
    ("console", f"{RESET} group=billing&{WHEN}", "reader", GROUP_REFUSED),
    ("console", f"{RESET} group=billing&topic=secret&{WHEN}", "member", TOPIC_REFUSED),
    ("console", f"{RESET} group=billing&{WHEN}", "viewer", GROUP_REFUSED),
    # without credentials everything is open, but an internal topic is never written
    ("open", "GET /v1/topics/secret/partitions/0/messages", "-", "200 shows: secret"),
    ("open", "GET /v1/topics/__consumer_offsets/partitions/0/messages", "-",
     "200 shows: __consumer_offsets"),
    ("open", "GET /v1/groups", "-", "200 shows: billing/orders.public, billing/secret"),
    ("open", f"{PRODUCE} topic=__consumer_offsets&value=x", "-", "400 InternalTopicError"),
    ("open", f"{RESEND} topic=orders.public&partition=0&offset={{forged}}", "-",
     "400 InternalTopicError"),
]  # fmt: skip


@dataclass
class World:
    """The servers and what the operations name."""

    urls: dict[str, str]
    names: dict[str, str]
    store: mqcore.Store


def fill(store: mqcore.Store) -> dict[str, str]:
    """orders.public and secret with a keyed message each, group billing committed on both,
    a message of orders.public whose origin headers name __consumer_offsets."""
    store.create_topic("orders.public")
    store.create_topic("secret")
    store.append("orders.public", b"public", key=b"k-public")
    md = store.append("secret", b"s3cret", key=b"k-secret")
    for topic in ("orders.public", "secret"):
        c = store.consumer("billing", topic)
        c.poll()
        c.commit()
        c.close()
    forged = store.append(
        "orders.public", b"forged", key=b"f",
        headers=[("mq.origin.topic", b"__consumer_offsets"), ("mq.origin.partition", b"0")],
    )  # fmt: skip
    secret = store.get("secret", 0, md.offset)
    assert secret is not None and secret.unique_id is not None
    return {"secret_id": secret.msg_id, "secret_uid": secret.unique_id,
            "forged": str(forged.offset)}  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("acl")
    creds, acl = tmp / "users", tmp / "acl"
    for user in USERS:
        add_user(creds, user, user + "-pw")
    acl.write_text(ACL)
    with mqcore.open(str(tmp / "store"), flush="os") as store:
        names = fill(store)
        auth = HttpAuth.load(str(creds), str(acl))
        with (
            Server(store, "127.0.0.1:0", http="127.0.0.1:0", sasl_credentials=creds,
                   acl=acl) as server,
            HttpServer(create_app(store, allow_write=True, auth=auth)) as console,
            HttpServer(create_app(store, allow_write=True)) as open_console,
        ):  # fmt: skip
            assert server.http_server is not None
            urls = {"http": server.http_server.url, "console": console.url,
                    "open": open_console.url}  # fmt: skip
            owner = Client(urls["http"], "owner", "owner-pw")
            joined = owner.request("POST", f"{SHARE}?topics=secret&explicit_ack=true")
            assert joined.status == 200, joined.text
            names["owner_member"] = member = joined.json()["member_id"]
            held = owner.request("POST", f"{SHARE}/{member}/poll?max_records=10")
            assert [m["value"] for m in held.json()["messages"]] == ["s3cret"], held.text
            yield World(urls, names, store)


def attempt(world: World, interface: str, operation: str, principal: str) -> Answer:
    """Run one row's operation as `principal` over real HTTP."""
    client = Client(world.urls[interface])
    if principal != "-":
        client = Client(world.urls[interface], principal, principal + "-pw")
    method, _, rest = named(operation, world.names).partition(" ")
    path, _, body = rest.partition(" ")
    if method == "GET":
        return client.get(path)
    if path.startswith("/ui/actions/"):
        fields = dict(pair.split("=", 1) for pair in body.split("&"))
        return client.post_form(path, {"csrf": token_of(client), **fields})
    return client.request(method, path, body.encode() or None)


def named(operation: str, names: dict[str, str]) -> str:
    """The operation with {NAME}s filled in (a JSON body's braces left alone)."""
    for name, value in names.items():
        operation = operation.replace("{" + name + "}", value)
    return operation


def token_of(client: Client) -> str:
    """The principal's CSRF token from the overview's produce form (and its session cookie);
    "" when the page refuses it, so the action is refused for that too."""
    page = client.get("/ui/")
    m = re.search(r'name="csrf" value="([^"]+)"', page.text)
    return m[1] if m else ""


def shown(answer: Answer) -> list[str]:
    """What a listing lists: topic names, GROUP/TOPIC of a consumer group listing's
    partitions, group names, the topics of found messages (JSON or a console page)."""
    if answer.headers.get("content-type", "").startswith("application/json"):
        doc = answer.json()
        if "topics" in doc:
            return [t["topic"] for t in doc["topics"]]
        if "groups" in doc:
            return [f"{g['group']}/{p['topic']}" for g in doc["groups"] for p in g["partitions"]]
        if "share_groups" in doc:
            return [g["group"] for g in doc["share_groups"]]
        return [m["topic"] for m in doc["messages"]]
    if 'id="topics"' in answer.text:  # the overview: its topics (groups have their own rows)
        return re.findall(r'<tr data-topic="([^"]+)"', answer.text)
    if 'id="lookup"' in answer.text:
        return sorted(set(re.findall(r'data-topic="([^"]+)"', answer.text)))
    return re.findall(r'<tr data-group="([^"]+)"', answer.text)


def check(answer: Answer, expected: str) -> None:
    status, _, what = expected.partition(" ")
    assert answer.status == int(status), answer.text[:500]
    if what.startswith("shows: "):
        listed = what.removeprefix("shows: ")
        assert (", ".join(sorted(set(shown(answer)))) or "-") == listed, answer.text[:500]
        return
    if answer.error is not None:  # a JSON answer names its error
        assert answer.error == what, answer.text[:500]
        return
    kind = {"TopicAuthorizationError": "topic", "GroupAuthorizationError": "group"}.get(what)
    if kind is None:  # any other error: the console's page shows its message
        assert "InternalTopicError" not in what or "is internal" in answer.text, answer.text
        return
    assert re.search(rf"may not \w+ {kind}", answer.text), answer.text[:1500]


@pytest.mark.parametrize(("interface", "operation", "principal", "expected"), ATTEMPTS)
def test_unauthorized_attempts_are_refused(
    world: World, interface: str, operation: str, principal: str, expected: str
) -> None:
    check(attempt(world, interface, operation, principal), expected)


def test_nothing_was_written_or_taken_by_the_refused_attempts(world: World) -> None:
    """After every row: the owner's share member still holds its record (not rejected by
    another), no message was produced or resent, billing's offsets are where it committed
    them."""
    store = world.store
    assert (store.end_offset("secret"), store.end_offset("orders.public")) == (1, 2)
    assert store.end_offset("__consumer_offsets") > 0
    assert {(p.topic, p.committed) for p in store.group_lag("billing")["billing"]} == {
        ("orders.public", 1), ("secret", 1)}  # fmt: skip
    owner = Client(world.urls["http"], "owner", "owner-pw")
    lag = owner.get("/v1/share-groups/workers").json()
    assert (lag["available"], lag["in_flight"]) == (0, 1), lag


def test_granted_attempts_are_answered(world: World) -> None:
    """The grants do let through what they name: the refusals above are the ACL's, not a
    broken server's."""
    reader = Client(world.urls["http"], "reader", "reader-pw")
    assert reader.get("/v1/topics/orders.public/partitions/0/messages").status == 200
    viewer = Client(world.urls["http"], "viewer", "viewer-pw")
    assert viewer.get("/v1/topics/secret").json()["config"]["partitions"] == 1
    assert viewer.get("/v1/groups/billing").json()["partitions"][0]["topic"] == "secret"
    owner = Client(world.urls["console"], "owner", "owner-pw")
    assert "s3cret" in owner.get("/ui/topics/secret/partitions/0/offsets/0").text
    member = Client(world.urls["http"], "member", "member-pw")
    joined = member.request("POST", f"{SHARE}?topics=orders.public")
    assert joined.status == 200, joined.text
    gone = member.request("DELETE", f"{SHARE}/{joined.json()['member_id']}")
    assert gone.status == 200, gone.text


def test_the_table_names_every_endpoint(world: World) -> None:
    """Each route of the JSON API and each console page or action has a row (a new route
    without one fails here until its ACL is decided)."""
    app: Any = create_app(world.store)
    paths = {r.path for r in app.routes if r.path.startswith(("/v1/", "/ui/"))}
    paths -= {"/ui/", "/ui/static", "/ui/{rest:path}"}

    def pattern(path: str) -> re.Pattern[str]:
        return re.compile(re.sub(r"\\\{[a-z_]+\\\}", "[^/ ?]+", re.escape(path)) + r"(\?| |$)")

    operations = [named(op, world.names).split(" ", 1)[1] for _, op, _, _ in ATTEMPTS]
    untested = {p for p in paths if not any(pattern(p).match(op) for op in operations)}
    assert untested == set()
