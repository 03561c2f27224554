"""Drive one hot path in a loop so a sampling profiler can attribute its time.

    .venv/bin/py-spy record --native -r 1000 -o append.svg -- \
        .venv/bin/python bench/profile_paths.py append-1k
    perf record -F 4999 -g -- .venv/bin/python bench/profile_paths.py get-100
    mkfifo /tmp/perf.ctl && perf record -F 4999 -g -D -1 --control fifo:/tmp/perf.ctl -- \
        .venv/bin/python bench/profile_paths.py append-1k --perf-ctl /tmp/perf.ctl

Paths: append-1k, append-100 (append_batch of 1000 messages, flush="os"), get-100, get-1000
(random store.get on the 200k-message lookup store built with batches of 100 or 1000),
time-100, time-1000 (offset_for_time), read-100, arrow-100 (whole-partition scans). Prints the
mean time per operation; `--breakdown` instead times the pieces of the append, get or
offset_for_time path alone, interleaved, and prints their medians. `--perf-ctl FIFO` writes
`enable`/`disable` to perf's control FIFO around the timed loop, so a `perf record -D -1` sees
the loop and not the setup (building the data, priming the page cache).
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
from mqcore._ext.batch import encode_batch
from mqcore._ext.crc32c import crc32c
from mqcore._ext.scan import first_offset_at_or_after, read_record
from mqcore.storage.partition import MAX_DECOMPRESSED

PERF_CTL: list[str] = []  # perf's control FIFO, when --perf-ctl names one
# as bench/test_append.py: a batch of 1000 x 1 KiB with generated IDs stays one batch
MAX_BATCH = 2 << 20


def perf_control(command: str) -> None:
    """Send `enable` or `disable` to perf record's control FIFO, if there is one."""
    for path in PERF_CTL:
        with open(path, "w", encoding="ascii") as fifo:
            fifo.write(command + "\n")


def timed(label: str, fn: Callable[[], object], count: int) -> float:
    """Run fn `count` times; print and return the mean seconds per call."""
    perf_control("enable")
    start = time.perf_counter()
    for _ in range(count):
        fn()
    per = (time.perf_counter() - start) / count
    perf_control("disable")
    print(f"{label:40s} {per * 1e6:10.1f} us")
    return per


def print_medians(times: dict[str, list[float]]) -> None:
    """One line per piece: its median and minimum time."""
    for label, ts in times.items():
        ts.sort()
        print(f"{label:50s} median {ts[len(ts) // 2] * 1e6:7.2f} us   min {ts[0] * 1e6:7.2f} us")


def interleaved(
    pieces: dict[str, Callable[[int], object]], args: list[int], ratio_to: str | None = None
) -> None:
    """Time every piece on every argument, one after the other, and print the medians.

    The order rotates by one piece per argument: the piece that runs first meets the
    argument's data cold, and a fixed order would charge that to the same piece every time.
    With `ratio_to`, also print each piece's median of per-round ratios (that piece's time /
    this one's): steadier on a drifting host than a ratio of medians taken apart.
    """
    times: dict[str, list[float]] = {label: [] for label in pieces}
    order = list(pieces.items())
    for i, a in enumerate(args):
        k = i % len(order)
        for label, fn in order[k:] + order[:k]:
            start = time.perf_counter()
            fn(a)
            times[label].append(time.perf_counter() - start)
    if ratio_to is not None:
        base = times[ratio_to]
        for label, ts in times.items():
            if label != ratio_to:
                per_round = sorted(b / t for b, t in zip(base, ts, strict=True))
                print(f"{ratio_to} / {label}: median per-round ratio "
                      f"{per_round[len(per_round) // 2]:.2f}")  # fmt: skip
    print_medians(times)


def append_loop(directory: str, batches: list[list[bytes]], batch_bytes: int, count: int) -> None:
    """`count` store.append_batch calls into a new store in `directory` (removed afterwards),
    past its first two appends, inside page cache primed for them."""
    store = mqcore.open(os.path.join(directory, "store"), flush="os")
    try:
        store.create_topic("t", segment_bytes=SEGMENT_BYTES)
        prime_page_cache(directory, (count + 2) * batch_bytes)
        cycle = itertools.cycle(range(len(batches)))
        for _ in range(2):  # the first appends map the new segment's indexes: milliseconds
            store.append_batch("t", batches[next(cycle)], partition=0)
        timed(
            f"store.append_batch 1000 x {len(batches[0][0])} B",
            lambda: store.append_batch("t", batches[next(cycle)], partition=0),
            count,
        )
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


def profile_append(directory: str, size: int, count: int, breakdown: bool, repeat: int) -> None:
    """append_batch in a loop (`repeat` times, each into a fresh store, so a long profile
    neither rolls segments nor outgrows the primed page cache); with `breakdown`, each round
    times the pieces alone instead, one after the other, so drifting machine conditions hit
    every piece alike (medians printed)."""
    batches = [values_of(1000, size, SEED + i) for i in range(8)]
    encoded = [encode_batch(b, now_ms=T0_MS).tobytes() for b in batches]
    if not breakdown:
        for r in range(repeat):
            append_loop(os.path.join(directory, f"run{r}"), batches, len(encoded[0]), count)
        return
    store = mqcore.open(os.path.join(directory, "store"), flush="os")
    store.create_topic("t", segment_bytes=SEGMENT_BYTES, max_message_bytes=MAX_BATCH)
    store.create_topic("plain", segment_bytes=SEGMENT_BYTES, max_message_bytes=MAX_BATCH,
                       unique_ids=False, key_index=False)  # fmt: skip
    raw_fd = os.open(os.path.join(directory, "raw.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    enc_fd = os.open(os.path.join(directory, "enc.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    pre_fd = os.open(os.path.join(directory, "pre.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    # batches encoded once, kept alive: write_to alone is the writev of their one glue piece
    pre_encoded = [encode_batch(b, now_ms=T0_MS) for b in batches]
    pieces: dict[str, Callable[[int], object]] = {
        "crc32c over the encoded batch": lambda i: crc32c(encoded[i]),
        "encode_batch (varints + copy + CRC)": lambda i: encode_batch(batches[i], now_ms=T0_MS),
        "encode_batch, values referenced (no copy)": lambda i: encode_batch(
            batches[i], now_ms=T0_MS, gather_threshold=1
        ),
        "raw os.write of the encoded bytes": lambda i: os.write(raw_fd, encoded[i]),
        "write_to of a pre-encoded batch (writev)": lambda i: pre_encoded[i].write_to(pre_fd),
        "encode_batch + write_to (no store)": lambda i: encode_batch(
            batches[i], now_ms=T0_MS
        ).write_to(enc_fd),
        "store.append_batch (flush=os)": lambda i: store.append_batch("t", batches[i], partition=0),
        "store.append_batch, plain topic (flush=os)": lambda i: store.append_batch(
            "plain", batches[i], partition=0
        ),
    }
    prime_page_cache(directory, 5 * count * len(encoded[0]))  # five of the pieces write
    interleaved(pieces, [r % 8 for r in range(count)], ratio_to="raw os.write of the encoded bytes")
    for fd in (raw_fd, enc_fd, pre_fd):
        os.close(fd)
    store.close()


def get_breakdown(data: LookupData, offsets: list[int]) -> None:
    """Time store.get and its pieces alone, interleaved per offset (medians): the layers above
    the kernel, the index floor, taking the segment view, the read_record kernel with the
    verified-batch memo warm (as in the benchmark, which repeats its offsets) and cold (the
    first get in a batch: CRC of the whole batch and sampling its record positions), and the
    SQLite primary-key SELECT for comparison."""
    store = data.store
    part = store.log.partition(LOOKUP_TOPIC, 0)
    seg = part.segments[0]  # the bench store has one segment
    size = seg.size
    view = seg.view(0, size)
    floors = {o: seg.position_for(o) for o in offsets}
    memo = seg.verified_batches
    for o in offsets:  # warm the memo, as the benchmark's warm-up round does
        store.get(LOOKUP_TOPIC, 0, o)
    cold: dict[int, bytes] = {}

    def kernel(o: int) -> object:
        m = read_record(view, floors[o], o, LOOKUP_TOPIC, 0, True, memo, seg.log_path)
        assert m is not None and m.offset == o
        return m

    def kernel_cold(o: int) -> object:
        cold.clear()
        return read_record(
            view, floors[o], o, LOOKUP_TOPIC, 0, True, cold, seg.log_path, MAX_DECOMPRESSED
        )

    execute = data.sqlite.execute
    pieces: dict[str, Callable[[int], object]] = {
        "store.get (memo warm)": lambda o: store.get(LOOKUP_TOPIC, 0, o),
        "Partition.get (memo warm)": lambda o: part.get(o, True),
        "offset index floor (LogSegment.position_for)": seg.position_for,
        "LogSegment.view(0, size)": lambda o: seg.view(0, size),
        "read_record kernel, memo warm": kernel,
        "read_record kernel, no CRC, no memo": lambda o: read_record(
            view, floors[o], o, LOOKUP_TOPIC, 0, False, None, seg.log_path
        ),
        "read_record kernel, memo cold (CRC + sampling)": kernel_cold,
        "SQLite SELECT value WHERE id=?": lambda o: execute(
            "SELECT value FROM t WHERE id=?", (o,)
        ).fetchone(),
    }
    interleaved(pieces, offsets)


def time_breakdown(data: LookupData, stamps: list[int]) -> None:
    """offset_for_time and its pieces alone, interleaved per timestamp (medians): the time
    index floor, the record-timestamp kernel with and without the CRC check of the batches it
    walks, and SQLite's index seek."""
    store = data.store
    part = store.log.partition(LOOKUP_TOPIC, 0)
    seg = part.segments[0]
    size = seg.size
    view = seg.view(0, size)
    floors = {ts: seg.position_for_time(ts) for ts in stamps}
    execute = data.sqlite.execute
    sql = "SELECT id FROM t WHERE ts >= ? ORDER BY ts, id LIMIT 1"
    pieces: dict[str, Callable[[int], object]] = {
        "store.offset_for_time": lambda ts: store.offset_for_time(LOOKUP_TOPIC, 0, ts),
        "time index floor (LogSegment.position_for_time)": seg.position_for_time,
        "first_offset_at_or_after, CRC checked": lambda ts: first_offset_at_or_after(
            view, floors[ts], ts, True
        ),
        "first_offset_at_or_after, no CRC": lambda ts: first_offset_at_or_after(
            view, floors[ts], ts, False
        ),
        "SQLite ts-index seek": lambda ts: execute(sql, (ts,)).fetchone(),
    }
    interleaved(pieces, stamps)


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
    elif path == "time" and breakdown:
        time_breakdown(data, [rng.randint(data.first_ts, data.last_ts) for _ in range(count)])
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
    parser.add_argument("--repeat", type=int, default=1, help="append loops, each in a new store")
    parser.add_argument("--perf-ctl", metavar="FIFO", help="perf record's --control FIFO")
    args = parser.parse_args()
    if args.perf_ctl:
        PERF_CTL.append(args.perf_ctl)
    directory = tempfile.mkdtemp(prefix="mqcore-profile-")
    try:
        kind, _, arg = args.path.partition("-")
        if kind == "append":
            size = 1024 if arg == "1k" else 100
            # defaults stay below one 64 MiB segment and inside the primed page cache
            count = args.count or (60 if size == 1024 else 500)
            profile_append(directory, size, count, args.breakdown, args.repeat)
        else:
            defaults = {"get": 50_000, "time": 2000, "read": 20, "arrow": 20}
            profile_lookup(directory, kind, int(arg), args.count or defaults[kind], args.breakdown)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
