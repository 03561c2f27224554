"""Reading a partition through a consumer's filters: the fetch of `Consumer.poll` (consumer
groups) and of `ShareConsumer.poll` (share groups' new records), one implementation.

Filters (tag, SQL92 `where`) run in the scan kernel of the query layer (_ext/search.pyx): a
record whose tag does not match, or whose headers the selector's compiled program does not
find TRUE, is passed over inside the kernel, never turned into a Message. A selector the kernel
cannot evaluate (docs/query.md) runs in Python on the messages the kernel returns. With a tag,
the segment's tag column (key index) names the candidate records when the tag is rare. A
filtered fetch examines at most FILTER_SCAN_BUDGET records and returns what it found, possibly
nothing, with the offset past every examined record (RocketMQ's filtered pull).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mqcore._ext.batch import Message, decode_messages
from mqcore._ext.hashing import TAG_SEED, xxh64_hash
from mqcore.query import engine
from mqcore.storage.segment import MAX_DECOMPRESSED
from mqcore.storage.txnindex import READ_UNCOMMITTED, check_isolation

if TYPE_CHECKING:
    from mqcore.log.manager import Log
    from mqcore.storage.partition import Partition

TopicPartition = tuple[str, int]
FILTER_SCAN_BUDGET = 16_384  # records one filtered poll may examine (RocketMQ: 16,000 entries)
SCAN_CHUNK = 1024
DENSE_TAG = 16  # a tag on more than 1 in DENSE_TAG tagged records is scanned, not looked up
NO_END = (1 << 63) - 1


class FilteredFetch:
    """A consumer's filters compiled once (`spec`), and the fetch that applies them."""

    def __init__(
        self, log: Log, tag: str | None, where: str | None, isolation_level: str = READ_UNCOMMITTED
    ):
        self.log = log
        self.tag, self.where = tag, where  # as given: a remote leader compiles them again
        # read_committed: only below the last stable offset, without aborted transactions'
        # records (what a Kafka consumer at that level gets: docs/format.md "Transactions")
        self.committed = check_isolation(isolation_level)
        self.spec = engine.make_spec(None, None, tag=tag, where=where)
        self.tag_hash = None if self.spec.tag is None else xxh64_hash(self.spec.tag, TAG_SEED)

    @property
    def filtered(self) -> bool:
        return self.spec.tag is not None or self.spec.selector is not None

    def fetch(
        self, tp: TopicPartition, part: Partition, offset: int, room: int, budget: list[int]
    ) -> tuple[list[Message], int]:
        """Up to `room` messages of `part` from `offset` on that pass the filters, and the
        offset past every record examined (the next fetch's start): a filtered fetch examines
        at most `budget[0]` records (lowered by what it examined) and may return none. A
        read_committed fetch stops at the last stable offset and passes over the records of
        aborted transactions."""
        if not self.committed:
            return self._fetch(tp, part, offset, room, budget)
        stable = part.last_stable_offset
        if offset >= stable:
            return [], offset
        msgs, past = self._fetch(tp, part, offset, room, budget)
        kept = [m for m in msgs if m.offset < stable]
        if kept:
            spans = part.committed_spans(kept[0].offset, kept[-1].offset + 1)
            kept = [m for m in kept if any(a <= m.offset < b for a, b in spans)]
        return kept, min(past, stable)

    def _fetch(
        self, tp: TopicPartition, part: Partition, offset: int, room: int, budget: list[int]
    ) -> tuple[list[Message], int]:
        out: list[Message] = []
        if offset >= part.end_offset:
            return out, offset
        # the query engine's planner: sizes and ends of one moment, pinned (retention or
        # compaction may retire a segment meanwhile; its files stay open until this fetch ends)
        with engine.scan_plan(part, offset) as segs:
            for seg, size, seg_end in segs:
                table = seg.key_table() if self.tag_hash is not None else None
                view = seg.view(0, size)
                try:
                    if table is not None:
                        done, offset = self._by_tag_column(
                            tp, seg, view, seg_end, table, offset, room, out, budget
                        )
                    elif self.spec.tag is not None or self.spec.kernel_selector is not None:
                        done, offset = self._by_scan(tp, seg, view, offset, room, out, budget)
                    else:
                        done, offset = self._by_decode(tp, seg, view, offset, room, out, budget)
                finally:
                    view.release()
                if done:
                    break
        return out, offset

    def _keep(self, msgs: list[Message], room: int, out: list[Message]) -> int | None:
        """Add the messages the selector accepts to `out` (all of them when the kernel ran
        it); the next offset when it is full."""
        sel = self.spec.selector
        if sel is None or self.spec.kernel_selector is not None:
            out += msgs[: room - len(out)]
            return out[-1].offset + 1 if len(out) >= room else None
        for m in msgs:
            if sel.matches(engine.selector_view(m)):
                out.append(m)
                if len(out) >= room:
                    return m.offset + 1
        return None

    def _by_scan(
        self,
        tp: TopicPartition,
        seg: Any,
        view: memoryview,
        offset: int,
        room: int,
        out: list[Message],
        budget: list[int],
    ) -> tuple[bool, int]:
        """The scan kernel over one segment: it passes over other tags, and records its
        selector program finds not TRUE, undecoded. Returns (stop here, next offset)."""
        spec = self.spec
        filtered = spec.tag is not None or spec.selector is not None
        pos = seg.position_for(max(offset, seg.base_offset))
        while True:
            want = SCAN_CHUNK if spec.filters_in_python else room - len(out)
            r = engine.scan_chunk(
                view, pos, tp, spec, offset, NO_END, want,
                budget[0] if filtered else NO_END, self.log.verify_crc, seg.log_path,
            )  # fmt: skip
            if filtered:
                budget[0] -= r.records_scanned
            full = self._keep(r.messages, room, out)
            if full is not None:
                return True, full
            pos, offset = r.next_position, r.next_offset
            if r.reason == "end":
                return False, offset
            if filtered and budget[0] <= 0:
                return True, offset

    def _by_decode(
        self,
        tp: TopicPartition,
        seg: Any,
        view: memoryview,
        offset: int,
        room: int,
        out: list[Message],
        budget: list[int],
    ) -> tuple[bool, int]:
        """No tag: decode every record (the read path's kernel), the selector if any after.
        Returns (stop here, next offset)."""
        sel = self.spec.selector
        pos, size = seg.position_for(max(offset, seg.base_offset)), len(view)
        while pos < size:
            want = room - len(out) if sel is None else min(SCAN_CHUNK, max(1, budget[0]))
            chunk: list[Message] = []
            pos, nxt = decode_messages(
                view, pos, tp[0], tp[1], offset, want, chunk, self.log.verify_crc,
                MAX_DECOMPRESSED, seg.log_path, 0,
            )  # fmt: skip
            offset = max(offset, nxt)
            if sel is not None:
                budget[0] -= len(chunk)
            full = self._keep(chunk, room, out)
            if full is not None:
                return True, full
            if sel is not None and budget[0] <= 0:
                return True, offset
            if len(chunk) == want:  # stopped inside a batch: resume at the one holding offset
                pos = seg.position_for(offset)
        return False, offset

    def _by_tag_column(
        self,
        tp: TopicPartition,
        seg: Any,
        view: memoryview,
        seg_end: int,
        table: Any,
        offset: int,
        room: int,
        out: list[Message],
        budget: list[int],
    ) -> tuple[bool, int]:
        """The segment's tag column (key index: relative offset, batch position, tag hash, in
        offset order) names the candidate records; the kernel reads only their batches, from
        the first candidate to the last, and checks the real tag (a hash can collide).
        Records without the tag are never read. Returns (stop here, next offset)."""
        base, size = seg.base_offset, len(view)
        while True:
            want = SCAN_CHUNK if self.spec.filters_in_python else room - len(out)
            entries, examined = table.tag_entries(self.tag_hash, max(0, offset - base), want)
            budget[0] -= examined
            if len(entries) >= 64 and len(entries) * DENSE_TAG >= examined:
                # a common tag: one kernel pass over the batches is cheaper than jumping
                return self._by_scan(tp, seg, view, offset, room, out, budget)
            inside = [e for e in entries if e[1] < size]  # entries of later appends: not yet
            if not inside:
                return False, max(offset, seg_end)
            i = 0
            while i < len(inside):
                pos = inside[i][1]
                j = i
                while j + 1 < len(inside) and inside[j + 1][1] == pos:
                    j += 1
                lo, hi = max(base + inside[i][0], offset), base + inside[j][0] + 1
                r = engine.scan_chunk(
                    view, pos, tp, self.spec, lo, hi, hi - lo, NO_END, self.log.verify_crc,
                    seg.log_path,
                )  # fmt: skip
                budget[0] -= r.records_scanned
                full = self._keep(r.messages, room, out)
                if full is not None:
                    return True, full
                offset = hi
                i = j + 1
            if len(entries) < want or len(inside) < len(entries):
                return False, max(offset, seg_end)  # the column holds no more up to seg_end
            if budget[0] <= 0:
                return True, offset
