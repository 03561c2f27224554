"""Kafka's transactions under an ACL file (issue 34; server/auth.py's `transactional-id:`
resource): a principal uses a transactional ID only with `write` on it and sees it only with
`describe`, as Kafka's authorizer rules; confluent-kafka clients over SASL/SCRAM, and raw
requests (kio-encoded) for the answers a client hides. A refused request writes nothing."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_server_acl import PASSWORD, Wire, batch

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
from kio.schema.errors import ErrorCode  # noqa: E402

from mqcore.server import Server  # noqa: E402
from mqcore.server.auth import add_user  # noqa: E402

WAIT = 60.0
ACL = """
etl    all    *                        # every ordinary topic
etl    read   group:copier
etl    write  transactional-id:etl-*   # its transactional IDs (write implies describe)
other  all    *
other  write  transactional-id:other
"""
MINUTE = datetime.timedelta(seconds=60)


@pytest.fixture
def secured(store: mqcore.Store, tmp_path: Path) -> Iterator[Server]:
    users, acl = tmp_path / "users.jsonl", tmp_path / "acl.txt"
    for user in ("etl", "other"):
        add_user(users, user, PASSWORD.format(user))
    acl.write_text(ACL)
    store.create_topic("out")
    with Server(store, "127.0.0.1:0", sasl_credentials=users, acl=acl) as srv:
        yield srv


def client(server: Server, user: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": server.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
            "sasl.password": PASSWORD.format(user), **extra}  # fmt: skip


def test_a_transactional_id_is_used_only_with_write_on_it(
    secured: Server, store: mqcore.Store
) -> None:
    from confluent_kafka import KafkaException, Producer

    p = Producer(client(secured, "etl", **{"transactional.id": "etl-1"}))
    p.init_transactions(WAIT)
    p.begin_transaction()
    p.produce("out", b"committed", partition=0)
    p.commit_transaction(WAIT)
    assert [m.value for m in store.read("out", 0, 0, 10, isolation_level="read_committed")] == [
        b"committed"]  # fmt: skip
    end = store.end_offset("out", 0)
    for user, tid in (("etl", "foreign"), ("other", "etl-1")):
        refused = Producer(client(secured, user, **{"transactional.id": tid}))
        with pytest.raises(KafkaException) as e:
            refused.init_transactions(WAIT)
        assert e.value.args[0].code() == ErrorCode.transactional_id_authorization_failed, e.value
    assert store.end_offset("out", 0) == end


def test_raw_requests_of_a_transactional_id_without_the_grant_are_refused(
    secured: Server, store: mqcore.Store
) -> None:
    from kio.index import load_payload_module
    from kio.static.constants import EntityType

    etl, other = Wire(secured.address), Wire(secured.address)
    try:
        etl.login("etl")
        other.login("other")
        init = etl.call(22, 4, transactional_id="etl-2", transaction_timeout=MINUTE,
                        producer_id=-1, producer_epoch=-1)  # fmt: skip
        assert init.error_code == ErrorCode.none
        pid, epoch = init.producer_id, init.producer_epoch
        denied = ErrorCode.transactional_id_authorization_failed
        # another principal cannot end, extend or produce in etl-2's transaction
        assert other.call(26, 3, transactional_id="etl-2", producer_id=pid,
                          producer_epoch=epoch, committed=False).error_code == denied  # fmt: skip
        assert other.call(25, 3, transactional_id="etl-2", producer_id=pid,
                          producer_epoch=epoch, group_id="g").error_code == denied  # fmt: skip
        a = load_payload_module(24, 3, EntityType.request)
        added = other.call(24, 3, v3_and_below_transactional_id="etl-2",
                           v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
                           v3_and_below_topics=(a.AddPartitionsToTxnTopic(
                               name="out", partitions=(0,)),))  # fmt: skip
        assert added.results_by_topic_v3_and_below[0].results_by_partition[0] \
            .partition_error_code == denied  # fmt: skip
        m = load_payload_module(0, 9, EntityType.request)
        data = m.PartitionProduceData(index=0, records=batch(b"forged"))
        produced = other.call(0, 9, transactional_id="etl-2", acks=-1,
                              timeout=datetime.timedelta(seconds=10),
                              topic_data=(m.TopicProduceData(name="out",
                                                             partition_data=(data,)),))  # fmt: skip
        assert produced.responses[0].partition_responses[0].error_code == denied
        assert store.end_offset("out", 0) == 0
        # describe: FindCoordinator, DescribeTransactions and ListTransactions show etl-2 to
        # the principal that may describe it only
        assert other.call(10, 3, key="etl-2", key_type=1).error_code == denied
        assert etl.call(10, 3, key="etl-2", key_type=1).error_code == ErrorCode.none
        seen = other.call(65, 0, transactional_ids=("etl-2",)).transaction_states[0]
        assert seen.error_code == denied and seen.producer_id == -1
        mine = etl.call(65, 0, transactional_ids=("etl-2",)).transaction_states[0]
        assert mine.error_code == ErrorCode.none and mine.producer_id == pid
        listed = {s.transactional_id for s in other.call(66, 1, state_filters=(),
                  producer_id_filters=(), duration_filter=-1).transaction_states}  # fmt: skip
        assert "etl-2" not in listed
        listed = {s.transactional_id for s in etl.call(66, 1, state_filters=(),
                  producer_id_filters=(), duration_filter=-1).transaction_states}  # fmt: skip
        assert "etl-2" in listed
        # a broker's own requests need CLUSTER_ACTION, which no line grants
        w = load_payload_module(27, 1, EntityType.request)
        marker = w.WritableTxnMarker(producer_id=pid, producer_epoch=epoch,
                                     transaction_result=False, coordinator_epoch=0,
                                     topics=(w.WritableTxnMarkerTopic(
                                         name="out", partition_indexes=(0,)),))  # fmt: skip
        markers = etl.call(27, 1, markers=(marker,))
        assert markers.markers[0].topics[0].partitions[0].error_code == \
            ErrorCode.cluster_authorization_failed  # fmt: skip
        assert store.end_offset("out", 0) == 0
    finally:
        etl.close()
        other.close()
