"""A `mqcore serve` whose Produce handler acknowledges without appending: the baseline that
shows what the client and the protocol cost on their own (bench/test_server.py).

    python bench/null_produce_server.py STORE

Prints the bootstrap address on its first line, then serves until killed.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from kio.schema.errors import ErrorCode

from mqcore.server import Server
from mqcore.server.common import NO_TIME
from mqcore.server.protocol import Api, build


def main(path: str) -> None:
    server = Server(path, listen="127.0.0.1:0", flush="os").start()
    assert server.broker is not None
    next_offset = [0]

    def acknowledge(found: Api, body: Any, session: Any) -> Any:
        m = found.module
        topics = []
        for t in body.topic_data:
            parts = []
            for p in t.partition_data:
                parts.append(build(
                    m.PartitionProduceResponse, index=p.index, error_code=ErrorCode.none,
                    base_offset=next_offset[0], log_append_time=None, log_start_offset=0,
                    record_errors=(), error_message=None,
                ))  # fmt: skip
                next_offset[0] += 1
            topics.append(
                build(m.TopicProduceResponse, name=t.name, partition_responses=tuple(parts))
            )
        return build(found.response, responses=tuple(topics), throttle_time=NO_TIME)

    server.broker.handlers[0] = acknowledge
    print(server.bootstrap, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1])
