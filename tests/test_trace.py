"""Message trace kept in the store's `__trace` topic (log/trace.py)."""

from __future__ import annotations

import pytest

import mqcore
from mqcore.errors import InvalidConfigError
from mqcore.log.trace import TRACE_TOPIC, TraceEvent, Tracer, sample_rate


def test_appends_are_traced_and_survive_reopen(tmp_path):
    with mqcore.open(str(tmp_path), trace=True) as store:
        store.create_topic("t", partitions=2)
        md = store.append("t", b"v", key=b"k")
        bmd = store.append_batch("t", [b"a", b"b"], partition=1)
    with mqcore.open(str(tmp_path)) as store:
        (ev,) = store.trace(md.unique_id)
        assert (ev.event, ev.topic, ev.partition, ev.offset) == ("appended", "t", md.partition, 0)
        second = store.trace(bmd.unique_id(1))
        assert [(e.event, e.partition, e.offset) for e in second] == [("appended", 1, 1)]
        assert store.read(TRACE_TOPIC, 0, 0, 10)[0].key == md.unique_id.encode()


def test_no_trace_topic_when_tracing_is_off(tmp_path):
    with mqcore.open(str(tmp_path)) as store:
        store.create_topic("t")
        md = store.append("t", b"v")
        assert store.trace(md.unique_id) == []
        assert TRACE_TOPIC not in store.topics()


def test_sampling_is_per_unique_id_and_near_the_rate(tmp_path):
    with mqcore.open(str(tmp_path)) as store:
        tracer = Tracer(store.log, 0.25)
        ids = [f"0190e3a0-0000-7000-8000-{i:012x}" for i in range(4000)]
        chosen = [u for u in ids if tracer.sampled(u)]
        assert 800 < len(chosen) < 1200
        assert all(tracer.sampled(u) for u in chosen)  # the same answer every time
        tracer.record([TraceEvent(u, "delivered", 1, "t", 0, i, "g") for i, u in enumerate(ids)])
        assert store.end_offset(TRACE_TOPIC) == len(chosen)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "yes", None])
def test_bad_trace_option_is_refused(tmp_path, bad):
    with pytest.raises(InvalidConfigError, match="trace"):
        sample_rate(bad)
    with pytest.raises(InvalidConfigError, match="trace"):
        mqcore.open(str(tmp_path), trace=bad)
