"""One member of a consumer group in its own OS process, for tests/test_server_groups.py: an
unmodified confluent-kafka consumer subscribed to TOPIC in GROUP on BOOTSTRAP. It prints
"assigned P,P,..." at each assignment, and "msg PARTITION OFFSET VALUE" for each message it
processed, before committing that message's offset synchronously (commits follow processing).
It closes (leaving the group) when its stdin closes; the test may SIGKILL it instead.

    python group_member.py BOOTSTRAP GROUP TOPIC SESSION_TIMEOUT_MS
"""

from __future__ import annotations

import sys
import threading

import confluent_kafka as ck


def main() -> None:
    bootstrap, group, topic, session_ms = sys.argv[1:5]
    done = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": int(session_ms),
            "heartbeat.interval.ms": 300,
        }
    )

    def on_assign(c: ck.Consumer, parts: list[ck.TopicPartition]) -> None:
        print("assigned " + ",".join(str(p.partition) for p in parts), flush=True)

    def on_revoke(c: ck.Consumer, parts: list[ck.TopicPartition]) -> None:
        print("assigned ", flush=True)

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    try:
        while not done.is_set():
            m = consumer.poll(0.2)
            if m is None:
                continue
            if m.error() is not None:
                print(f"error {m.error()}", flush=True)
                continue
            print(f"msg {m.partition()} {m.offset()} {m.value().decode()}", flush=True)
            try:
                consumer.commit(message=m, asynchronous=False)
            except ck.KafkaException as e:
                print(f"commit-failed {m.partition()} {m.offset()} {e}", flush=True)
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
