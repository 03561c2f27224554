"""Instructions per operation of the hot store paths, counted by valgrind's callgrind: a
figure that does not move with the host's load (the wall-clock benchmarks on this shared VM
move by tens of percent between runs; bench/README.md "Issue 18").

    python bench/instructions.py SRC [SRC ...]       # e.g. a checkout of the older commit's src
    python bench/instructions.py --only serve_produce SRC [SRC ...]
    python bench/instructions.py --only get_cold_batch100,find_by_key_cold SRC [SRC ...]

For each tree (its `src/` put first on PYTHONPATH) and each path, the process runs twice under
callgrind, with LOW and HIGH operations after the same set-up; (Ir(HIGH) - Ir(LOW)) / (HIGH -
LOW) is the cost of one operation, set-up and interpreter start cancelled out.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

LOW, HIGH = 500, 3500
# the cold modes read a store built beforehand (outside callgrind, by the same tree) with 1000
# batches: every counted operation is the first read of its batch by a freshly opened handle
COLD_LOW, COLD_HIGH = 100, 900
COLD_BATCHES = 1000

BUILD_COLD = r"""
import sys
import mqcore
mode, path = sys.argv[1], sys.argv[2]
size = 100 if mode == "get_cold_batch100" else 1000
with mqcore.open(path, flush="os") as s:
    s.create_topic("t", segment_bytes=1 << 30)
    v = b"y" * 100
    for i in range(0, size * 1000, size):
        s.append_batch("t", [v] * size, keys=[b"k%d" % j for j in range(i, i + size)], partition=0)
"""

COLD_CHILD = r"""
import random, sys
import mqcore
mode, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
size = 100 if mode == "get_cold_batch100" else 1000
rng = random.Random(1)
offsets = [b * size + rng.randrange(size) for b in rng.sample(range(1000), n)]
s = mqcore.open(path, read_only=True)
s.get("t", 0, 0)  # the open's lazy parts (segment, mapping, key table) before the counted reads
s.find_by_key("t", b"k0")
if mode == "find_by_key_cold":
    for o in offsets: s.find_by_key("t", b"k%d" % o, limit=1)
else:
    for o in offsets: s.get("t", 0, o)
s.close()
"""

CHILD = r"""
import random, sys, tempfile
import mqcore
mode, n = sys.argv[1], int(sys.argv[2])
s = mqcore.open(tempfile.mkdtemp(), flush="os")
s.create_topic("t", segment_bytes=1 << 30)
v = b"y" * 100
if mode in ("get", "get_by_id", "find_by_key", "find_by_key_all", "read"):
    for i in range(0, 100_000, 1000):
        s.append_batch("t", [b"v%07d" % j for j in range(i, i + 1000)],
                       keys=[b"k%d" % (j % 5000) for j in range(i, i + 1000)], partition=0)
    last = s.append("t", b"x", partition=0).msg_id
if mode in ("poll_sql", "poll_plain", "read_python_sql"):  # test_consume.py's layout
    regions = ("eu", "us", "apac", "latam")
    for i in range(0, 100_000, 1000):
        s.append_batch("t", [b"x" * 200] * 1000, partition=0,
                       tags=["red" if j % 4 == 0 else "blue" for j in range(i, i + 1000)],
                       properties=[{"region": regions[j % 4], "n": str(j)}
                                   for j in range(i, i + 1000)])
    where = "region = 'eu'"
    c = s.consumer("g", "t", where=where if mode == "poll_sql" else None)
    c.poll(1)  # joins the group: the set-up, not the counted polls
if mode.startswith("time_batch"):  # the lookup benchmark's layout: 10 records per ms
    size = int(mode[len("time_batch"):])
    for i in range(0, 100_000, size):
        s.append_batch("t", [v] * size, partition=0,
                       timestamps=[1_700_000_000_000 + j // 10 for j in range(i, i + size)])
    for i in range(0, 100_000, size):  # every batch read once: what is counted is the steady state
        s.offset_for_time("t", 0, 1_700_000_000_000 + i // 10)
rng = random.Random(1)
offsets = [rng.randrange(100_000) for _ in range(n)]
if mode == "append":
    for _ in range(n): s.append("t", v, partition=0)
elif mode == "append_keyed":
    for _ in range(n): s.append("t", v, key=b"k")
elif mode == "append_batch100":
    vals = [v] * 100
    for _ in range(n // 10): s.append_batch("t", vals, partition=0)
elif mode.startswith("append_batch1000"):  # bench/test_append.py's batches: n // 100 of 1000
    plain = mode.endswith("_plain")
    s.create_topic("w", segment_bytes=1 << 30, max_message_bytes=2 << 20,
                   **({"unique_ids": False, "key_index": False} if plain else {}))
    vals = [b"y" * (1024 if "_1k" in mode else 100)] * 1000
    for _ in range(n // 100): s.append_batch("w", vals, partition=0)
elif mode == "get":
    for o in offsets: s.get("t", 0, o)
elif mode == "get_by_id":
    for _ in range(n): s.get_by_id(last)
elif mode == "find_by_key":
    for o in offsets: s.find_by_key("t", b"k%d" % (o % 5000), limit=1)
elif mode == "find_by_key_all":  # every one of the key's 20 messages
    for o in offsets: s.find_by_key("t", b"k%d" % (o % 5000))
elif mode == "read":
    for o in offsets: s.read("t", 0, o, 10)
elif mode.startswith("time_batch"):
    for o in offsets: s.offset_for_time("t", 0, 1_700_000_000_000 + o // 10)
elif mode == "spark_task":  # n // 100 Spark tasks, each reading 10,000 records of ~200 B
    import random as _r
    from pyspark.sql.datasource import InputPartition
    from mqcore.spark.source import MqcoreDataSource, kafka_spark_schema
    s.create_topic("logs", segment_bytes=1 << 30, unique_ids=False)
    lines = [b"%06d " % i + bytes(_r.Random(i).choices(b"abcdefgh ", k=190)) for i in range(1000)]
    for i in range(10):
        s.append_batch("logs", lines, keys=[b"cust-%06d" % j for j in range(1000)], partition=0)
    s.close()
    src = MqcoreDataSource({"path": s.path, "subscribe": "logs"})
    reader = src.reader(kafka_spark_schema())
    for _ in range(n // 100):  # a task: its slot as Spark hands it over, then every batch
        (part,) = reader.partitions()
        for batch in reader.read(InputPartition(part.value)):
            pass
elif mode == "poll_sql":  # 50 matches of 25 %: 200 records examined per poll
    for o in offsets:
        c.seek(0, o % 99_000 // 4 * 4)
        assert len(c.poll(50)) == 50
elif mode == "poll_plain":  # the same 200 records without a filter
    for o in offsets:
        c.seek(0, o % 99_000 // 4 * 4)
        assert len(c.poll(200)) == 200
elif mode == "read_python_sql":  # the same 200 records read, the selector in Python
    from mqcore.query.engine import selector_view
    from mqcore.query.selector import compile_selector
    sel = compile_selector(where)
    for o in offsets:
        msgs = s.read("t", 0, o % 99_000 // 4 * 4, 200)
        assert sum(1 for m in msgs if sel.matches(selector_view(m))) == 50
elif mode == "serve_produce":  # n // 100 Produce requests of 1000 x 1 KiB over a socket
    import datetime, io, socket, struct
    from kio.schema.produce.v9 import request as pr
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.serial import entity_writer
    from mqcore._ext.encode import encode_batch
    from mqcore.server import Server
    s.create_topic("w", segment_bytes=1 << 30, max_message_bytes=2 << 20, unique_ids=False)
    out = io.BytesIO()
    entity_writer(RequestHeader)(out, RequestHeader(request_api_key=0, request_api_version=9,
                                                    correlation_id=1, client_id="i"))
    records = encode_batch([bytes([i % 256]) * 1024 for i in range(1000)], now_ms=1).tobytes()
    entity_writer(pr.ProduceRequest)(out, pr.ProduceRequest(
        transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=30),
        topic_data=(pr.TopicProduceData(name="w", partition_data=(
            pr.PartitionProduceData(index=0, records=records),)),)))
    frame = struct.pack(">i", out.tell()) + out.getvalue()
    srv = Server(s, listen="127.0.0.1:0")
    srv.start()
    with socket.create_connection(srv.address) as sock:
        for _ in range(n // 100):
            sock.sendall(frame)
            size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
            sock.recv(size, socket.MSG_WAITALL)
    srv.stop()
s.close()
"""

MODES: tuple[str, ...] = (
    "append", "append_keyed", "append_batch100", "append_batch1000",
    "append_batch1000_plain", "append_batch1000_1k", "append_batch1000_1k_plain", "get",
    "get_by_id", "find_by_key", "find_by_key_all", "read", "serve_produce", "time_batch100",
    "time_batch1000", "spark_task", "get_cold_batch100", "get_cold_batch1000",
    "find_by_key_cold", "poll_sql", "poll_plain",
)  # fmt: skip
COLD_MODES = ("get_cold_batch100", "get_cold_batch1000", "find_by_key_cold")
# also available with --only: read_python_sql (the Python evaluator over read(); about 20
# minutes under callgrind on this VM, and poll_sql before issue 20 did the same work)
# messages per counted operation (spark_task: 100 operations are one task of 10,000 records;
# the poll modes: records examined per poll)
PER_MESSAGE = {
    "append_batch100": 10, "serve_produce": 10, "spark_task": 100,
    "poll_sql": 200, "poll_plain": 200, "read_python_sql": 200,
}  # fmt: skip
PER_MESSAGE.update(dict.fromkeys([m for m in MODES if m.startswith("append_batch1000")], 10))


def instructions(src: str, mode: str, n: int, store: str = "") -> int:
    env = dict(os.environ, PYTHONPATH=src)
    child = [CHILD, mode, str(n)] if mode not in COLD_MODES else [COLD_CHILD, mode, str(n), store]
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, "-c", *child],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = re.search(r"Collected : ([\d,]+)", proc.stderr)
    assert found, proc.stderr[-2000:]
    return int(found.group(1).replace(",", ""))


def cold_instructions(src: str, mode: str) -> float:
    """Instructions per first read of a batch, on a store this tree builds (not counted)."""
    with tempfile.TemporaryDirectory() as scratch:
        store = os.path.join(scratch, "s")
        subprocess.run(
            [sys.executable, "-c", BUILD_COLD, mode, store],
            env=dict(os.environ, PYTHONPATH=src), check=True,
        )  # fmt: skip
        high = instructions(src, mode, COLD_HIGH, store)
        low = instructions(src, mode, COLD_LOW, store)
    return (high - low) / (COLD_HIGH - COLD_LOW)


def main() -> None:
    args = sys.argv[1:]
    modes = MODES
    if args[:1] == ["--only"]:
        modes, args = tuple(args[1].split(",")), args[2:]
    trees = args or ["src"]
    print("path".ljust(18) + "".join(t[-28:].rjust(30) for t in trees))
    for mode in modes:
        if mode in COLD_MODES:
            per = [cold_instructions(t, mode) for t in trees]
        else:
            per = [(instructions(t, mode, HIGH) - instructions(t, mode, LOW)) / (HIGH - LOW)
                   for t in trees]  # fmt: skip
        unit = " /msg" if mode in PER_MESSAGE else ""
        per = [p / PER_MESSAGE.get(mode, 1) for p in per]  # batches, requests: per message
        print(mode.ljust(18) + "".join(f"{p:,.0f}{unit}".rjust(30) for p in per), flush=True)


if __name__ == "__main__":
    main()
