"""Kafka's read_committed over the wire (issue 34, "Fetch over the wire with the
aborted-transactions list"): `mqcore serve` over a store whose partitions hold transactions
(kafka-python-built transactional batches and markers, appended as a replica copies them:
tests/test_txn_log.py's model), read by consumers we did not write. A read_committed consumer
(kafka-python, confluent-kafka/librdkafka) gets exactly the committed records below the last
stable offset and skips the aborted ones from the Fetch response's AbortedTransactions; a
read_uncommitted one gets every record; neither sees a marker; ListOffsets' latest is the last
stable offset for read_committed.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest
from test_txn_log import TOPIC, Model, random_ops

import mqcore
from mqcore.query.ids import encode_msg_id

WAIT = 60.0


def filled(store: mqcore.Store, seed: int = 3) -> Model:
    """Two partitions of transactions, the second ending with one still open."""
    store.create_topic(TOPIC, partitions=2)
    models = []
    for p in range(2):
        model = Model()
        replica = store.log.replica(TOPIC, p)
        for batch in random_ops(random.Random(seed + p), model, 80):
            replica.append_as_follower(batch)
        models.append(model)
    open_model = models[1]
    replica = store.log.replica(TOPIC, 1)
    replica.append_as_follower(open_model.data(7, 3, True))  # producer 7: never ended
    assert store.last_stable_offset(TOPIC, 1) == open_model.lso < open_model.end
    return models  # type: ignore[return-value]


def kafka_python_read(bootstrap: str, partition: int, level: str, until: int) -> list[Any]:
    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(TOPIC, partition)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=level,
                             enable_auto_commit=False, auto_offset_reset="earliest")  # fmt: skip
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[Any] = []
        deadline = time.monotonic() + WAIT
        while consumer.position(tp) < until and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got += [(m.offset, m.value) for m in records]
        assert consumer.position(tp) >= until, (level, consumer.position(tp), until)
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize("level", ["read_committed", "read_uncommitted"])
def test_kafka_python_reads_each_isolation_level(
    store: mqcore.Store, kafka_server: Any, level: str
) -> None:
    models = filled(store)
    for p, model in enumerate(models):
        if level == "read_committed":
            want, until = model.committed(), model.lso
        else:
            want, until = model.uncommitted(), model.end
        got = kafka_python_read(kafka_server.bootstrap, p, level, until)
        assert got == want, (p, level)


def test_librdkafka_reads_committed_and_ends_at_the_last_stable_offset(
    store: mqcore.Store, kafka_server: Any
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    models = filled(store)
    for level in ("read_committed", "read_uncommitted"):
        consumer = Consumer({"bootstrap.servers": kafka_server.bootstrap, "group.id": "g",
                             "isolation.level": level, "enable.auto.commit": False,
                             "enable.partition.eof": True})  # fmt: skip
        try:
            for p, model in enumerate(models):
                lo, hi = consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=20)
                # ListOffsets' latest: the last stable offset for read_committed (Kafka's)
                assert hi == (model.lso if level == "read_committed" else model.end)
                consumer.assign([TopicPartition(TOPIC, p, 0)])
                got: list[Any] = []
                deadline = time.monotonic() + WAIT
                while time.monotonic() < deadline:
                    m = consumer.poll(0.2)
                    if m is None:
                        continue
                    if m.error() is not None:  # partition EOF: at the LSO / the end
                        break
                    got.append((m.offset(), m.value()))
                want = model.committed() if level == "read_committed" else model.uncommitted()
                assert got == want, (p, level)
        finally:
            consumer.close()


def test_list_offsets_latest_is_the_last_stable_offset_for_read_committed(
    store: mqcore.Store, kafka_server: Any
) -> None:
    from kafka import KafkaConsumer, TopicPartition

    models = filled(store)
    tps = [TopicPartition(TOPIC, p) for p in range(2)]
    for level, want in (("read_committed", [m.lso for m in models]),
                        ("read_uncommitted", [m.end for m in models])):  # fmt: skip
        consumer = KafkaConsumer(bootstrap_servers=kafka_server.bootstrap, isolation_level=level)
        try:
            ends = consumer.end_offsets(tps)
        finally:
            consumer.close()
        assert [ends[tp] for tp in tps] == want, level


def test_the_http_api_reads_either_isolation_level(store: mqcore.Store) -> None:
    """The HTTP API's partition read, message get and search take isolation_level (default
    read_uncommitted): read_committed answers exactly the committed records below the last
    stable offset; a bad level is a 400 naming it."""
    import base64
    import json
    import urllib.error
    import urllib.request

    from mqcore.server import Server

    models = filled(store)
    with Server(store, listen="127.0.0.1:0", http="127.0.0.1:0") as server:
        assert server.http_server is not None
        url = server.http_server.url

        def get(path: str) -> Any:
            with urllib.request.urlopen(url + path, timeout=WAIT) as r:
                return json.load(r)

        def value(m: dict[str, Any]) -> bytes:
            v = m["value"]
            return base64.b64decode(v["base64"]) if isinstance(v, dict) else v.encode()

        for p, model in enumerate(models):
            for level, want in (("read_committed", model.committed()),
                                ("read_uncommitted", model.uncommitted())):  # fmt: skip
                got = get(f"/v1/topics/{TOPIC}/partitions/{p}/messages?limit=10000"
                          f"&isolation_level={level}")  # fmt: skip
                assert [(m["offset"], value(m)) for m in got["messages"]] == want, (p, level)
                found = get(f"/v1/topics/{TOPIC}/search?partition={p}&limit=10000"
                            f"&isolation_level={level}")  # fmt: skip
                assert [(m["offset"], value(m)) for m in found["messages"]] == want, (p, level)
            visible = dict(model.committed())
            hidden = [o for o, _ in model.uncommitted() if o < model.lso and o not in visible]
            aborted = hidden[0] if hidden else None
            if aborted is not None:
                with pytest.raises(urllib.error.HTTPError) as missing:
                    get(f"/v1/topics/{TOPIC}/partitions/{p}/offsets/{aborted}"
                        "?isolation_level=read_committed")  # fmt: skip
                assert missing.value.code == 404
                missing.value.close()
                assert get(f"/v1/topics/{TOPIC}/partitions/{p}/offsets/{aborted}")["message"]
            # the index lookups: by key (each record's key is its value) and by store ID
            everything = dict(model.uncommitted())
            for offset in list(everything)[::9]:
                key = base64.b64encode(everything[offset]).decode()
                for level, want in (("read_committed", visible),
                                    ("read_uncommitted", everything)):  # fmt: skip
                    hits = get(f"/v1/topics/{TOPIC}/by-key?partition={p}&key_base64={key}"
                               f"&isolation_level={level}")["messages"]  # fmt: skip
                    assert [h["offset"] for h in hits] == [offset] * (offset in want)
                    msg_id = encode_msg_id(TOPIC, p, offset)
                    try:
                        got = get(f"/v1/messages/{msg_id}?isolation_level={level}")["message"]
                    except urllib.error.HTTPError as e:
                        assert e.code == 404
                        e.close()
                        got = None
                    assert (got is not None) == (offset in want), (p, offset, level)
        with pytest.raises(urllib.error.HTTPError) as bad:
            get(f"/v1/topics/{TOPIC}/partitions/0/messages?isolation_level=committed")
        assert bad.value.code == 400 and b"isolation_level" in bad.value.read()
        bad.value.close()


def test_the_console_reads_either_isolation_level(store: mqcore.Store) -> None:
    """The console's browser and lookup take isolation_level (default read_uncommitted, as
    every reader): the rows a read_committed page shows are exactly the committed records;
    a message's page says whether a read_committed consumer gets it."""
    import html
    import re
    import urllib.error
    import urllib.parse
    import urllib.request

    pytest.importorskip("jinja2", reason="the server extra (jinja2) is missing")
    from mqcore.server.http import HttpServer, create_app

    models = filled(store)
    row = re.compile(r'<tr class="message" data-partition="(\d+)" data-offset="(\d+)"')

    with HttpServer(create_app(store)) as server:

        def get(path: str) -> str:
            with urllib.request.urlopen(server.url + path, timeout=WAIT) as r:
                return r.read().decode()

        def browse(query: str) -> list[int]:
            """Every row of a browser query, its chunks followed by cursor as the page does."""
            page = get(f"/ui/topics/{TOPIC}?{query}")
            rows_url = html.unescape(re.search(r'data-rows-url="([^"]+)"', page)[1])  # type: ignore[index]
            offsets: list[int] = []
            for _ in range(1000):  # bounded: each chunk moves the cursor on
                answer = json.loads(get(rows_url))
                offsets += [int(o) for _, o in row.findall(answer["html"])]
                if answer["reason"] != "timeout":
                    return offsets
                split = urllib.parse.urlsplit(rows_url)
                fields = dict(urllib.parse.parse_qsl(split.query))
                fields["cursor"] = answer["cursor"]
                rows_url = f"{split.path}?{urllib.parse.urlencode(fields)}"
            raise AssertionError("the browser query did not end")

        for p, model in enumerate(models):
            committed = [o for o, _ in model.committed()]
            everything = [o for o, _ in model.uncommitted()]
            assert browse(f"partition={p}&limit=1000&isolation_level=read_committed") == committed
            assert browse(f"partition={p}&limit=1000") == everything
            assert (
                browse(f"partition={p}&limit=1000&isolation_level=read_uncommitted") == everything
            )
            assert browse(f"partition={p}&limit=1000&contains=-&isolation_level=read_committed"
                          ) == committed  # fmt: skip
            hidden = [o for o in everything if o not in set(committed)]
            for offset in hidden[:3] + committed[:3]:
                shown = offset in committed
                page = get(f"/ui/topics/{TOPIC}/partitions/{p}/offsets/{offset}")
                assert ('id="committed">visible<' in page) == shown, (p, offset)
                for level in ("read_committed", "read_uncommitted"):
                    found = get(f"/ui/lookup?q={TOPIC}/{p}/{offset}&isolation_level={level}")
                    count = int(re.search(r'id="count">(\d+)<', found)[1])  # type: ignore[index]
                    assert count == (1 if shown or level == "read_uncommitted" else 0)
        with pytest.raises(urllib.error.HTTPError) as bad:
            get(f"/ui/topics/{TOPIC}?isolation_level=committed")
        assert bad.value.code == 400 and "isolation_level" in bad.value.read().decode()
        bad.value.close()
