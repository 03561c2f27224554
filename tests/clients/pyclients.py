"""Debian 12's Python Kafka clients against `mqcore serve`, run by Debian's own interpreter
(`/usr/bin/python3 -I`, so the packages in /usr/lib/python3/dist-packages are the ones
imported, not the venv's newer ones) for tests/test_clients_python.py: kafka-python 2.0.2
(python3-kafka) and confluent-kafka 1.7.0 over librdkafka 2.0.2 (python3-confluent-kafka).

    pyclients.py LIBRARY produce|consume|group -brokers B -topic T -count N
                 [-codec C] [-partition P] [-group G] [-timeout S]

LIBRARY is kafka-python or confluent. The commands and what they print are those of
tests/clients/*.go: produce sends N messages (key "k<i>", value "<library> <i>", header
"i"=<i>) to partition P, one {"partition":P,"offset":O} per message; consume reads partition P
from offset 0 by assign; group subscribes as a member of group G and commits what it read;
both print {"partition","offset","key","value"} per message and stop after N. An error or the
timeout ends the run with status 1 and the error on stderr.
"""

import argparse
import json
import sys
import time

# every message compresses well (tests/clients/harness.py: PADDING)
PADDING = b"." * 200


def emit(partition, offset, key=None, value=None):
    record = {"partition": partition, "offset": offset}
    if key is not None or value is not None:
        record.update(key=(key or b"").decode(), value=(value or b"").decode())
    print(json.dumps(record), flush=True)


def messages(args):
    """The N (key, value, headers) a producer sends."""
    return [
        (b"k%d" % i, b"%s %d %s" % (args.library.encode(), i, PADDING), [("i", b"%d" % i)])
        for i in range(args.count)
    ]


def kafka_python(args):
    import kafka

    servers = [args.brokers]
    if args.command == "produce":
        codec = None if args.codec == "none" else args.codec
        producer = kafka.KafkaProducer(
            bootstrap_servers=servers, compression_type=codec, acks="all", linger_ms=20
        )
        futures = [
            producer.send(args.topic, value=v, key=k, headers=h, partition=args.partition)
            for k, v, h in messages(args)
        ]
        for f in futures:
            md = f.get(timeout=args.timeout)
            emit(md.partition, md.offset)
        producer.close()
        return
    group = args.group if args.command == "group" else None
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=servers,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    if group is None:
        consumer.assign([kafka.TopicPartition(args.topic, args.partition)])
        consumer.seek_to_beginning()
    else:
        consumer.subscribe([args.topic])
    take(
        args,
        lambda: [m for ms in consumer.poll(500).values() for m in ms],
        lambda m: (m.partition, m.offset, m.key, m.value),
        consumer.commit if group else None,
    )
    consumer.close()


def confluent(args):
    import confluent_kafka

    if args.command == "produce":
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": args.brokers, "compression.codec": args.codec, "linger.ms": 20}
        )
        acks = []
        for k, v, h in messages(args):
            producer.produce(
                args.topic,
                v,
                k,
                partition=args.partition,
                headers=h,
                on_delivery=lambda err, m: acks.append((err, m)),
            )
        producer.flush(args.timeout)
        for err, m in acks:
            if err is not None:
                raise SystemExit(f"delivery: {err}")
            emit(m.partition(), m.offset())
        if len(acks) != args.count:
            raise SystemExit(f"{len(acks)} of {args.count} delivered")
        return
    group = args.group if args.command == "group" else "mqcore-test-assign"
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": args.brokers,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    if args.command == "group":
        consumer.subscribe([args.topic])
    else:
        consumer.assign([confluent_kafka.TopicPartition(args.topic, args.partition, 0)])

    def poll():
        m = consumer.poll(0.5)
        if m is not None and m.error() is not None:
            raise SystemExit(f"consume: {m.error()}")
        return [] if m is None else [m]

    commit = (lambda: consumer.commit(asynchronous=False)) if args.command == "group" else None
    take(args, poll, lambda m: (m.partition(), m.offset(), m.key(), m.value()), commit)
    consumer.close()


def take(args, poll, fields, commit):
    """Poll until N messages were printed (committing after each poll that got some) or the
    timeout passes."""
    deadline = time.monotonic() + args.timeout
    seen = 0
    while seen < args.count:
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {seen} of {args.count} messages")
        got = poll()
        for m in got:
            emit(*fields(m))
        seen += len(got)
        if got and commit is not None:
            commit()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("library", choices=["kafka-python", "confluent"])
    parser.add_argument("command", choices=["produce", "consume", "group"])
    parser.add_argument("-brokers", "--brokers", required=True)
    parser.add_argument("-topic", "--topic", required=True)
    parser.add_argument("-count", "--count", type=int, required=True)
    parser.add_argument("-codec", "--codec", default="none")
    parser.add_argument("-partition", "--partition", type=int, default=0)
    parser.add_argument("-group", "--group")
    parser.add_argument("-timeout", "--timeout", type=float, default=60)
    args = parser.parse_args()
    try:
        (kafka_python if args.library == "kafka-python" else confluent)(args)
    except Exception as e:  # the test shows what the client said
        raise SystemExit(f"{args.library} {args.command}: {type(e).__name__}: {e}") from None
    sys.exit(0)


if __name__ == "__main__":
    main()
