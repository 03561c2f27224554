"""Drive one hot path in a loop so a sampling profiler can attribute its time.

    .venv/bin/py-spy record --native -r 1000 -o append.svg -- \
        .venv/bin/python bench/profile_paths.py append-1k
    perf record -F 4999 -g -- .venv/bin/python bench/profile_paths.py get-100

Paths: append-1k, append-100 (append_batch of 1000 messages, flush="os"), get-100, get-1000
(random store.get on the 200k-message lookup store built with batches of 100 or 1000),
time-100 (offset_for_time), read-100, arrow-100 (whole-partition scans). Prints the mean time per
operation; `--breakdown` also times the pieces of the append path (encode, CRC, write) alone.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable

from benchdata import (
    LOOKUP_MESSAGES,
    LOOKUP_TOPIC,
    SEED,
    SEGMENT_BYTES,
    T0_MS,
    LookupData,
    build_lookup_data,
    prime_page_cache,
    values_of,
)

import mqcore
from mqcore._ext.batch import decode_messages, encode_batch
from mqcore._ext.crc32c import crc32c


def timed(label: str, fn: Callable[[], object], count: int) -> float:
    """Run fn `count` times; print and return the mean seconds per call."""
    start = time.perf_counter()
    for _ in range(count):
        fn()
    per = (time.perf_counter() - start) / count
    print(f"{label:40s} {per * 1e6:10.1f} us")
    return per


def profile_append(directory: str, size: int, count: int, breakdown: bool) -> None:
    """append_batch in a loop; with `breakdown`, each round also times its pieces alone, one
    after the other, so drifting machine conditions hit every piece alike (medians printed)."""
    batches = [values_of(1000, size, SEED + i) for i in range(8)]
    encoded = [encode_batch(b, now_ms=T0_MS).tobytes() for b in batches]
    store = mqcore.open(os.path.join(directory, "store"), flush="os")
    store.create_topic("t", segment_bytes=SEGMENT_BYTES)
    if not breakdown:
        prime_page_cache(directory, count * len(encoded[0]))
        cycle = itertools.cycle(range(8))
        timed(
            f"store.append_batch 1000 x {size} B",
            lambda: store.append_batch("t", batches[next(cycle)], partition=0),
            count,
        )
        store.close()
        return
    raw_fd = os.open(os.path.join(directory, "raw.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    enc_fd = os.open(os.path.join(directory, "enc.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    pieces: dict[str, Callable[[int], object]] = {
        "crc32c over the encoded batch": lambda i: crc32c(encoded[i]),
        "encode_batch (varints + copy + CRC)": lambda i: encode_batch(batches[i], now_ms=T0_MS),
        "raw os.write of the encoded bytes": lambda i: os.write(raw_fd, encoded[i]),
        "encode_batch + write_to (no store)": lambda i: encode_batch(
            batches[i], now_ms=T0_MS
        ).write_to(enc_fd),
        "store.append_batch (flush=os)": lambda i: store.append_batch("t", batches[i], partition=0),
    }
    prime_page_cache(directory, 3 * count * len(encoded[0]))
    times: dict[str, list[float]] = {label: [] for label in pieces}
    for r in range(count):
        for label, fn in pieces.items():
            start = time.perf_counter()
            fn(r % 8)
            times[label].append(time.perf_counter() - start)
    for label, ts in times.items():
        ts.sort()
        print(f"{label:40s} median {ts[len(ts) // 2] * 1e6:8.1f} us   min {ts[0] * 1e6:8.1f} us")
    os.close(raw_fd)
    os.close(enc_fd)
    store.close()


def get_breakdown(data: LookupData, offsets: list[int]) -> None:
    """Time store.get and its pieces alone, interleaved per offset (medians): the index floor,
    the pread(s) of the batch from there, decoding the record out of those bytes, and the
    SQLite primary-key SELECT for comparison."""
    store = data.store
    seg = store._partition(LOOKUP_TOPIC, 0).segments[0]  # the bench store has one segment

    def span(o: int) -> tuple[int, int]:
        """(floor position, bytes from there to the end of the batch holding `o`)."""
        pos = seg.position_for(o)
        buf = os.pread(seg.fd, 1 << 20, pos)
        at = 0
        while True:
            size = 12 + int.from_bytes(buf[at + 8 : at + 12], "big")
            last = int.from_bytes(buf[at : at + 8], "big") + int.from_bytes(
                buf[at + 23 : at + 27], "big"
            )
            if last >= o:
                return pos, at + size
            at += size

    spans = {o: span(o) for o in offsets}
    chunks = {o: os.pread(seg.fd, spans[o][1], spans[o][0]) for o in offsets}

    def read_span(o: int) -> bytes:
        """The pread(s) read_record makes: 16 KiB, and the rest when the batch ends later."""
        pos, size = spans[o]
        head = os.pread(seg.fd, 16384, pos)
        return head if size <= 16384 else os.pread(seg.fd, size, pos)

    def decode(o: int) -> object:
        out: list[object] = []
        decode_messages(chunks[o], 0, LOOKUP_TOPIC, 0, o, 1, out, False, 1 << 28, None, 0, o)
        assert out and out[0].offset == o  # type: ignore[attr-defined]
        return out

    execute = data.sqlite.execute
    pieces: dict[str, Callable[[int], object]] = {
        "store.get": lambda o: store.get(LOOKUP_TOPIC, 0, o),
        "offset index floor (LogSegment.position_for)": seg.position_for,
        "pread(s) of the batch from the floor": read_span,
        "decode_messages of those bytes (no CRC)": decode,
        "SQLite SELECT value WHERE id=?": lambda o: execute(
            "SELECT value FROM t WHERE id=?", (o,)
        ).fetchone(),
    }
    times: dict[str, list[float]] = {label: [] for label in pieces}
    for o in offsets:
        for label, fn in pieces.items():
            start = time.perf_counter()
            fn(o)
            times[label].append(time.perf_counter() - start)
    for label, ts in times.items():
        ts.sort()
        print(f"{label:46s} median {ts[len(ts) // 2] * 1e6:7.2f} us   min {ts[0] * 1e6:7.2f} us")


def profile_lookup(directory: str, path: str, batch: int, count: int, breakdown: bool) -> None:
    data = build_lookup_data(directory, batch)
    try:
        run_lookup(data, path, batch, count, breakdown)
    finally:
        data.store.close()
        data.sqlite.close()


def run_lookup(data: LookupData, path: str, batch: int, count: int, breakdown: bool) -> None:
    rng = random.Random(SEED)
    store = data.store
    if path == "get" and breakdown:
        get_breakdown(data, [rng.randrange(LOOKUP_MESSAGES) for _ in range(count)])
    elif path == "get":
        offsets = [rng.randrange(LOOKUP_MESSAGES) for _ in range(count)]
        it = iter(offsets)
        timed(
            f"store.get (batches of {batch})", lambda: store.get(LOOKUP_TOPIC, 0, next(it)), count
        )
    elif path == "time":
        stamps = iter([rng.randint(data.first_ts, data.last_ts) for _ in range(count)])
        timed(
            f"store.offset_for_time (batches of {batch})",
            lambda: store.offset_for_time(LOOKUP_TOPIC, 0, next(stamps)),
            count,
        )
    elif path == "read":

        def scan() -> None:
            offset = 0
            while msgs := store.read(LOOKUP_TOPIC, 0, offset, 500):
                offset = msgs[-1].offset + 1

        timed(f"full scan with read(500) (batches of {batch})", scan, count)
    else:
        timed(
            f"full scan with read_arrow (batches of {batch})",
            lambda: store.read_arrow(LOOKUP_TOPIC, 0, 0, None),
            count,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "path",
        choices=[
            "append-1k",
            "append-100",
            "get-100",
            "get-1000",
            "time-100",
            "time-1000",
            "read-100",
            "arrow-100",
        ],
    )
    parser.add_argument("--count", type=int, default=0, help="operations (default per path)")
    parser.add_argument("--breakdown", action="store_true")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="mqcore-profile-")
    try:
        kind, _, arg = args.path.partition("-")
        if kind == "append":
            size = 1024 if arg == "1k" else 100
            profile_append(
                directory, size, args.count or (150 if size == 1024 else 1000), args.breakdown
            )
        else:
            defaults = {"get": 50_000, "time": 2000, "read": 20, "arrow": 20}
            profile_lookup(directory, kind, int(arg), args.count or defaults[kind], args.breakdown)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
