"""One member of a consumer group in its own OS process, for tests/test_server_groups.py and
tests/test_server_consumer_protocol.py: an unmodified confluent-kafka consumer subscribed to
TOPIC in GROUP on BOOTSTRAP. It prints "assigned P,P,..." whenever its assignment changed
(seen between polls), and "msg PARTITION OFFSET VALUE" for each message it processed, before
committing that message's offset synchronously (commits follow processing). It closes
(leaving the group) when its stdin closes; the test may SIGKILL it instead.

    python group_member.py BOOTSTRAP GROUP TOPIC SESSION_TIMEOUT_MS [PROTOCOL [STALL_AFTER]]

PROTOCOL is librdkafka's group.protocol: "classic" (the default; SESSION_TIMEOUT_MS is its
session timeout) or "consumer" (KIP-848: the coordinator sets the session timeout, and
SESSION_TIMEOUT_MS is ignored). With STALL_AFTER, the member stops committing once it has
processed that many messages and goes on processing: what a crash finds between processing
and committing, made certain.
"""

from __future__ import annotations

import sys
import threading

import confluent_kafka as ck


def config(bootstrap: str, group: str, session_ms: str, protocol: str) -> dict[str, object]:
    conf: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    if protocol == "consumer":
        conf["group.protocol"] = "consumer"
    else:
        conf.update({"session.timeout.ms": int(session_ms), "heartbeat.interval.ms": 300})
    return conf


def main() -> None:
    bootstrap, group, topic, session_ms = sys.argv[1:5]
    protocol = sys.argv[5] if len(sys.argv) > 5 else "classic"
    stall_after = int(sys.argv[6]) if len(sys.argv) > 6 else -1
    done = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    consumer = ck.Consumer(config(bootstrap, group, session_ms, protocol))
    consumer.subscribe([topic])
    shown: list[int] | None = None
    processed = 0
    try:
        while not done.is_set():
            m = consumer.poll(0.2)
            now = sorted(p.partition for p in consumer.assignment())
            if now != shown:
                print("assigned " + ",".join(map(str, now)), flush=True)
                shown = now
            if m is None:
                continue
            if m.error() is not None:
                print(f"error {m.error()}", flush=True)
                continue
            print(f"msg {m.partition()} {m.offset()} {m.value().decode()}", flush=True)
            processed += 1
            if 0 <= stall_after < processed:
                continue
            try:
                consumer.commit(message=m, asynchronous=False)
            except ck.KafkaException as e:
                print(f"commit-failed {m.partition()} {m.offset()} {e}", flush=True)
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
