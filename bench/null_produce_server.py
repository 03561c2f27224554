"""A `mqcore serve` whose Produce handler acknowledges without appending: the baseline that
shows what the client and the protocol cost on their own (bench/test_server.py).

    python bench/null_produce_server.py STORE

Prints the bootstrap address on its first line, then serves until killed.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from mqcore.server import Server
from mqcore.server.producewire import ProduceAnswer, ProducedPartition, ProducedTopic
from mqcore.server.protocol import Api


def main(path: str) -> None:
    server = Server(path, listen="127.0.0.1:0", flush="os").start()
    assert server.broker is not None
    next_offset = [0]

    def acknowledge(found: Api, body: Any, session: Any) -> ProduceAnswer:
        """What Broker.produce answers, with the append left out."""
        answer = ProduceAnswer([])
        for t in body.topic_data:
            parts = []
            for p in t.partition_data:
                parts.append(ProducedPartition(p.index, base_offset=next_offset[0]))
                next_offset[0] += 1
            answer.topics.append(ProducedTopic(t.name, parts))
        return answer

    server.broker.handlers[0] = acknowledge
    print(server.bootstrap, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1])
