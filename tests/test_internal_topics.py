"""Internal topics (names starting with `__`): ordinary appends are refused, as Kafka refuses
produce requests to them, and the readers of internal records skip a record they cannot parse
and report it instead of failing (log/internal.py, docs/consume.md "Internal topics")."""

from __future__ import annotations

import json
import logging
import struct

import pytest
from conftest import file_bytes, run_cli

import mqcore
from mqcore import compression as codecs
from mqcore._ext.batch import encode_batch
from mqcore.consume.offsets import OFFSETS_TOPIC, encode_key
from mqcore.errors import InternalTopicError, InvalidTopicError
from mqcore.log.trace import TRACE_TOPIC
from mqcore.produce.delay import DELAY_STATE_TOPIC, DELAY_TOPIC
from mqcore.produce.transactions import HALF_TOPIC, OP_TOPIC

QUIET = {"flush": "os", "transaction_check_interval_ms": 0, "delay_tick_ms": 0}


def open_store(path: str, **options: object) -> mqcore.Store:
    return mqcore.open(path, **{**QUIET, **options})


def write_raw(
    store: mqcore.Store,
    topic: str,
    value: bytes | None,
    key: bytes | None = None,
    headers: list[tuple[str, bytes | None]] | None = None,
    partition: int = 0,
) -> int:
    """Append one record below the store's API (the codec, then the partition's own append),
    as a Kafka tool or an older mqcore could have written it; returns its offset."""
    part = store.log.partition(topic, partition)
    batch = encode_batch(
        [value],
        [key],
        [headers or []],
        None,
        1_700_000_000_000,
        codecs.codec_id("none"),
        index=part.config.key_index,
    )
    return part.append(batch)


# -- refusal -------------------------------------------------------------------------------------


def test_every_public_append_to_an_internal_topic_is_refused(store_path):
    with open_store(store_path, auto_create_topics=True) as store:
        store.create_topic("t")
        c = store.consumer("g", "t")
        store.append("t", b"x")
        c.poll()
        c.commit()  # creates __consumer_offsets
        c.close()
        before = file_bytes(store_path)
        ends = {t: store.end_offset(t, 0) for t in store.topics()}
        for topic in (OFFSETS_TOPIC, "__retry.g", "__brand_new", HALF_TOPIC, DELAY_TOPIC):
            calls = [
                lambda t=topic: store.append(t, b"junk"),
                lambda t=topic: store.append(t, b"junk", key=b"k", partition=None),
                lambda t=topic: store.append_batch(t, [b"a", b"b"]),
                lambda t=topic: store.append_batch(t, [b"a"], keys=[b"k"], partition=None),
                lambda t=topic: store.append(t, b"junk", delay_ms=1000),
                lambda t=topic: store.append_batch(t, [b"a"], deliver_at=1),
                lambda t=topic: store.producer().append(t, b"junk"),
                lambda t=topic: store.create_topic(t),
            ]
            for call in calls:
                with pytest.raises(InternalTopicError, match=f"{topic}.*internal") as err:
                    call()
                assert isinstance(err.value, InvalidTopicError)
            txn = store.begin()
            with pytest.raises(InternalTopicError, match=topic):
                txn.append(topic, b"junk")
            txn.rollback()
        assert "__brand_new" not in store.topics()
        assert {t: store.end_offset(t, 0) for t in store.topics()} == ends
    after = file_bytes(store_path)
    for name, data in before.items():  # the log files of the internal topics did not change
        if name.startswith("__") and name.endswith(".log"):
            assert after[name] == data, name


def test_cli_produce_refuses_an_internal_topic(store_path):
    with open_store(store_path) as store:
        store.create_topic("t")
        c = store.consumer("g", "t")
        c.commit({("t", 0): 0})
        c.close()
    before = file_bytes(store_path)
    for argv in (
        ("produce", store_path, OFFSETS_TOPIC, "--value", "junk"),
        ("produce", store_path, "__new", "--create", "--value", "junk"),
    ):
        code, out, err = run_cli(*argv)
        assert code == 1 and out == "", (code, out, err)
        assert err.count("\n") == 1 and "internal" in err and argv[2] in err, err
    assert file_bytes(store_path) == before


def test_mqcore_own_writers_still_write_internal_topics(store_path):
    """Offsets, retry and dead-letter copies, transactions, delays and trace all write their
    internal topics through the store's internal path."""
    with open_store(store_path, trace=True) as store:
        store.create_topic("t")
        store.append("t", b"a")
        c = store.consumer("g", "t", retry_backoff_ms=[0], max_reconsume_times=1)
        (m,) = c.poll()
        c.nack(m)
        (r,) = c.poll()
        c.nack(r)
        c.commit()
        c.close()
        with store.begin() as txn:
            txn.append("t", b"b")
        store.append("t", b"c", deliver_at=0)
        assert store.deliver_due() == 1
        for topic in (OFFSETS_TOPIC, "__retry.g", "__dlq.g", HALF_TOPIC, OP_TOPIC, DELAY_TOPIC,
                      DELAY_STATE_TOPIC, TRACE_TOPIC):  # fmt: skip
            assert store.end_offset(topic, 0) > 0, topic
        assert [x.value for x in store.read("t", 0, 0)] == [b"a", b"b", b"c"]


# -- readers skip and report what they cannot parse -----------------------------------------------


def reported(store: mqcore.Store, topic: str) -> list[int]:
    return sorted(r.offset for r in store.skipped_records() if r.topic == topic)


def test_junk_in_consumer_offsets_is_skipped_and_reported(store_path, caplog):
    with open_store(store_path) as store:
        store.create_topic("t", partitions=2)
        store.append_batch("t", [b"m%d" % i for i in range(10)], partition=0)
        store.append_batch("t", [b"n%d" % i for i in range(10)], partition=1)
        c = store.consumer("g", "t")
        c.commit({("t", 0): 4, ("t", 1): 7})
        c.close()
        junk = [
            write_raw(store, OFFSETS_TOPIC, b"junk", key=b"j"),  # key cut short
            write_raw(store, OFFSETS_TOPIC, b"\x00\x03xx", key=encode_key("g", "t", 0)),
            write_raw(store, OFFSETS_TOPIC, b"v", key=None),  # no key at all
            write_raw(store, OFFSETS_TOPIC, b"v", key=b"\x00\x01\x00\x02\xff\xfe"),  # not UTF-8
        ]
    with caplog.at_level(logging.WARNING, logger="mqcore"), open_store(store_path) as store:
        c = store.consumer("g", "t")
        assert (c.committed("t", 0), c.committed("t", 1)) == (4, 7)
        got = c.poll(100)
        assert sorted(m.value for m in got) == [b"m%d" % i for i in range(4, 10)] + [
            b"n7",
            b"n8",
            b"n9",
        ]
        c.commit()
        c.close()
        assert reported(store, OFFSETS_TOPIC) == junk
        assert all(r.partition == 0 and r.reason for r in store.skipped_records())
    for off in junk:
        assert any(f"{OFFSETS_TOPIC}-0@{off}" in r.getMessage() for r in caplog.records), off


def test_junk_in_transaction_topics_is_skipped_and_reported(store_path):
    with open_store(store_path) as store:
        store.create_topic("t")
        with store.begin("done") as txn:  # committed before the junk: stays committed once
            txn.append("t", b"a")
        txn = store.begin("open")
        txn.append("t", b"b")
        ops = [
            write_raw(store, OP_TOPIC, b"not json", key=b"x"),
            write_raw(store, OP_TOPIC, b"[1, 2]", key=b"x"),
            write_raw(store, OP_TOPIC, b'{"op": "commit"}', key=b"done"),  # no low
            write_raw(store, OP_TOPIC, b'{"op": "explode", "low": 0}', key=b"y"),
            write_raw(store, OP_TOPIC, b'{"op": "commit", "low": 0}', key=b"\xff"),
            write_raw(store, OP_TOPIC, b'{"op": "prepare", "low": 0, "targets": 5}', key=b"z"),
        ]
        halves = [
            write_raw(store, HALF_TOPIC, b"no headers"),
            write_raw(store, HALF_TOPIC, b"short", headers=[("mq.txn", b"open"),
                      ("mq.topic", b"t"), ("mq.partition", b"\x00"), ("mq.ts", None)]),
        ]  # fmt: skip
    with open_store(store_path) as store:
        assert store.open_transactions() == ["open"]
        fresh = store.begin("fresh")  # begin() works
        fresh.append("t", b"c")
        fresh.commit()
        store.set_transaction_checker(lambda info: "commit")
        assert store.check_transactions(now=2**50) == {"open": "committed"}
        assert sorted(m.value for m in store.read("t", 0, 0)) == [b"a", b"b", b"c"]
        assert reported(store, OP_TOPIC) == ops
        assert reported(store, HALF_TOPIC) == halves


def test_junk_in_delay_topics_is_skipped_and_reported(store_path):
    with open_store(store_path) as store:
        store.create_topic("t")
        store.append_batch("t", [b"a", b"b"], deliver_at=[10, 20])
        assert store.deliver_due(now=15) == 1
        store.append("t", b"c", deliver_at=30)
        timer = write_raw(store, DELAY_TOPIC, b"no headers")
        states = [
            write_raw(store, DELAY_STATE_TOPIC, b'{"t": "done"}'),
            write_raw(store, DELAY_STATE_TOPIC, b"\x00junk"),
        ]
    with open_store(store_path) as store:
        assert store.pending_delays() == 2
        assert store.deliver_due(now=100) == 2
        assert [m.value for m in store.read("t", 0, 0)] == [b"a", b"b", b"c"]
        assert reported(store, DELAY_STATE_TOPIC) == states
        assert reported(store, DELAY_TOPIC) == [timer]


def test_junk_in_the_trace_topic_is_skipped_and_reported(store_path):
    with open_store(store_path, trace=True) as store:
        store.create_topic("t")
        md = store.append("t", b"a")
        assert md.unique_id is not None
        junk = [
            write_raw(store, TRACE_TOPIC, b"{not json", key=md.unique_id.encode()),
            write_raw(store, TRACE_TOPIC, json.dumps({"event": "x"}).encode(),
                      key=md.unique_id.encode()),
        ]  # fmt: skip
        events = store.trace(md.unique_id)
        assert [e.event for e in events] == ["appended"]
        assert reported(store, TRACE_TOPIC) == junk


def test_a_reader_reports_each_junk_record_once(store_path):
    with open_store(store_path) as store:
        store.create_topic("t")
        c = store.consumer("g", "t")
        c.commit({("t", 0): 0})
        c.close()
        write_raw(store, OFFSETS_TOPIC, struct.pack(">h", 9), key=encode_key("g", "t", 0))
    with open_store(store_path) as store:
        for _ in range(3):  # before any consumer, each group_lag() replays the topic afresh
            assert [lag.committed for lag in store.group_lag("g")["g"]] == [0]
        c = store.consumer("g", "t")  # and the consumers' replay
        assert c.committed("t", 0) == 0
        c.close()
        assert len(store.skipped_records()) == 1
