"""Bounds on partitions and all-or-nothing creation (issue 31): one call, one topic and the store
are bounded by settings, a creation past one is refused with PartitionLimitError naming it, and
a creation that fails midway (no descriptor left, a full disk) leaves nothing on disk and
nothing open, so the store goes on as before. Before, a CreateTopics of 30,000 partitions ran
the process out of descriptors and kept every one it had opened: every later call, the
background tasks and even close() failed with EMFILE."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import child_env

import mqcore
from mqcore.errors import PartitionLimitError
from mqcore.storage import durable
from mqcore.storage.logdir import LogDirectory


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def partition_dirs(store_path: str, topic: str) -> list[str]:
    return sorted(n for n in os.listdir(store_path) if n.rsplit("-", 1)[0] == topic)


def declared(store_path: str) -> list[str]:
    with open(os.path.join(store_path, "mqcore-topics.json"), encoding="utf-8") as f:
        return sorted(json.load(f)["topics"])


def test_a_topic_past_the_per_topic_bound_is_refused_naming_the_setting(store_path: str) -> None:
    with mqcore.open(store_path, flush="os", max_partitions_per_topic=8) as s:
        before = open_fds()
        with pytest.raises(PartitionLimitError, match="max_partitions_per_topic is 8") as e:
            s.create_topic("t", partitions=9)
        assert (e.value.limit, e.value.bound) == ("max_partitions_per_topic", 8)
        assert isinstance(e.value, mqcore.errors.InvalidConfigError)  # as a bad count was
        assert partition_dirs(store_path, "t") == [] and s.topics() == []
        assert open_fds() == before
        s.create_topic("t", partitions=8)
        with pytest.raises(PartitionLimitError, match="max_partitions_per_topic"):
            s.add_partitions("t", 9)
        assert s.partitions("t") == 8 and len(partition_dirs(store_path, "t")) == 8


def test_one_call_is_bounded_by_the_per_request_setting(store_path: str) -> None:
    with mqcore.open(store_path, flush="os", max_partitions_per_request=4) as s:
        with pytest.raises(PartitionLimitError, match="max_partitions_per_request is 4"):
            s.create_topic("t", partitions=5)
        s.create_topic("t", partitions=4)
        s.add_partitions("t", 8)  # 4 more in one call: allowed
        with pytest.raises(PartitionLimitError) as e:
            s.add_partitions("t", 13)
        assert e.value.limit == "max_partitions_per_request"
        assert s.partitions("t") == 8


def test_the_store_bound_counts_every_topic_and_spares_internal_ones(store_path: str) -> None:
    """Internal topics count towards the total but are never refused: a store filled to its
    bound by clients must still take a consumer's first commit."""
    with mqcore.open(store_path, flush="os", max_partitions=6) as s:
        s.create_topic("a", partitions=4)
        with pytest.raises(PartitionLimitError, match=r"holds 4 partitions.*max_partitions \(6"):
            s.create_topic("b", partitions=3)
        s.create_topic("b", partitions=2)
        s.append("a", b"m", partition=0)
        c = s.consumer("g", "a", auto_offset_reset="earliest")
        assert len(c.poll(10)) == 1
        c.commit()  # __consumer_offsets: a 7th partition, past the bound
        c.close()
        assert s.group_lag("g")["g"][0].committed == 1
        with pytest.raises(PartitionLimitError) as e:
            s.add_partitions("b", 3)
        assert (e.value.limit, e.value.bound) == ("max_partitions", 6)


def test_auto_created_topics_obey_the_bounds(store_path: str) -> None:
    with mqcore.open(
        store_path, flush="os", auto_create_topics=True, default_partitions=3, max_partitions=5
    ) as s:
        s.append("first", b"x")
        with pytest.raises(PartitionLimitError, match="max_partitions"):
            s.append("second", b"y")
        assert s.topics() == ["first"] and partition_dirs(store_path, "second") == []


def test_bad_limit_settings_are_refused(store_path: str) -> None:
    for bad in ({"max_partitions": 0}, {"max_partitions_per_topic": "8"},
                {"max_partitions_per_request": True}):  # fmt: skip
        with pytest.raises(mqcore.errors.InvalidConfigError, match=next(iter(bad))):
            mqcore.open(store_path, **bad)


# -- all or nothing --------------------------------------------------------------------------


def fail_at(monkeypatch: pytest.MonkeyPatch, suffix: str, k: int, code: int) -> None:
    """Make the k-th opening (0-based) of a file ending in `suffix` fail with `code`."""
    real = durable.open_store_file
    seen = []

    def opening(path: str, flags: int, mode: int = 0o644) -> int:
        if path.endswith(suffix):
            seen.append(path)
            if len(seen) == k + 1:
                raise OSError(code, os.strerror(code), path)
        return real(path, flags, mode)

    monkeypatch.setattr(durable, "open_store_file", opening)


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENOSPC])
@pytest.mark.parametrize(("suffix", "k"), [(".log", 0), (".index", 17), (".timeindex", 39)])
def test_a_creation_failing_at_partition_k_leaves_nothing(
    store_path: str, monkeypatch: pytest.MonkeyPatch, code: int, suffix: str, k: int
) -> None:
    with mqcore.open(store_path, flush="interval") as s:
        s.create_topic("kept", partitions=2)
        s.append("kept", b"before", partition=1)
        before = open_fds()
        with monkeypatch.context() as m:
            fail_at(m, suffix, k, code)
            with pytest.raises(OSError) as e:
                s.create_topic("big", partitions=40)
        assert e.value.errno == code
        assert open_fds() == before  # every partition opened before k was closed again
        assert partition_dirs(store_path, "big") == []
        assert s.topics() == ["kept"] and declared(store_path) == ["kept"]
        assert s.append("kept", b"after", partition=1).offset == 1
        s.create_topic("big", partitions=40)  # the name is free, and nothing is in the way
        assert len(partition_dirs(store_path, "big")) == 40
    with mqcore.open(store_path, read_only=True) as ro:
        assert ro.topics() == ["big", "kept"] and ro.stray_directories == []


def test_a_failed_topic_list_write_leaves_nothing(
    store_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with mqcore.open(store_path, flush="always") as s:
        s.create_topic("t", partitions=3)
        before = open_fds()
        real = LogDirectory.save_topics

        def full(self: LogDirectory, *a: object, **k: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(LogDirectory, "save_topics", full)
        with pytest.raises(OSError, match="No space"):
            s.create_topic("new", partitions=5)
        with pytest.raises(OSError, match="No space"):
            s.add_partitions("t", 6)
        monkeypatch.setattr(LogDirectory, "save_topics", real)
        assert open_fds() == before
        assert partition_dirs(store_path, "new") == [] and s.topics() == ["t"]
        assert partition_dirs(store_path, "t") == ["t-0", "t-1", "t-2"]
        assert s.partitions("t") == 3 and s.append("t", b"x", partition=2).offset == 0
        s.add_partitions("t", 6)
        assert s.partitions("t") == 6


def test_add_partitions_failing_midway_keeps_the_old_partitions(
    store_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with mqcore.open(store_path, flush="os") as s:
        s.create_topic("t", partitions=2)
        s.append_batch("t", [b"a", b"b"], partition=1)
        with monkeypatch.context() as m:
            fail_at(m, ".log", 3, errno.EMFILE)
            with pytest.raises(OSError):
                s.add_partitions("t", 10)
        assert s.partitions("t") == 2 and partition_dirs(store_path, "t") == ["t-0", "t-1"]
        assert [m.value for m in s.read("t", 1, 0, 10)] == [b"a", b"b"]
        assert s.add_partitions("t", 10).partitions == 10


_FEW_DESCRIPTORS = textwrap.dedent(
    """
    import json, os, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), int(sys.argv[2])))
    import mqcore

    out = {}
    s = mqcore.open(sys.argv[1], flush="interval", flush_interval_ms=20, delay_tick_ms=20,
                    max_partitions=100_000)
    s.create_topic("t")
    s.append("t", b"delayed", delay_ms=300)
    base = len(os.listdir("/proc/self/fd"))
    try:
        s.create_topic("big", partitions=int(sys.argv[3]))
        out["created"] = True
    except OSError as e:
        out["errno"] = e.errno
    out["fds_back"] = len(os.listdir("/proc/self/fd")) == base
    out["topics"] = s.topics()
    out["append"] = s.append("t", b"after").offset
    c = s.consumer("w", "t", auto_offset_reset="earliest")
    got = []
    for _ in range(10):  # each poll waits for an append (the delay task's delivery), 2 s at most
        got += c.poll(10, timeout_ms=2000)
        if len(got) == 2:
            break
    c.close()
    out["delivered"] = [m.value.decode() for m in got]
    out["failing"] = s.log.tasks.failing()
    s.close()
    print(json.dumps(out))
    """
)


def test_running_out_of_descriptors_for_real_leaves_the_store_healthy(tmp_path: Path) -> None:
    """Under a real RLIMIT_NOFILE of 128, a creation of 400 partitions (the store bound lifted)
    fails with EMFILE partway: every descriptor it took comes back, no directory of it stays,
    and appends, the delayed-delivery task and close() work as before."""
    store = str(tmp_path / "s")
    proc = subprocess.run(
        [sys.executable, "-c", _FEW_DESCRIPTORS, store, "128", "400"],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["errno"] == errno.EMFILE and "created" not in out
    assert out["fds_back"] and out["topics"] == ["__delay", "t"]
    assert out["append"] == 0 and out["delivered"] == ["after", "delayed"]
    assert out["failing"] == {}
    assert partition_dirs(store, "big") == []
    with mqcore.open(store, read_only=True) as ro:
        assert "big" not in ro.topics() and ro.stray_directories == []


_DEFAULT_BOUND = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    import mqcore
    from mqcore.errors import PartitionLimitError
    with mqcore.open(sys.argv[1], flush="os") as s:
        try:
            s.create_topic("big", partitions=200)
        except PartitionLimitError as e:
            print(e.limit, e.bound, s.topics())
        s.create_topic("fits", partitions=120)
    """
)


def test_the_default_store_bound_is_half_the_open_files_limit(tmp_path: Path) -> None:
    """A process at `ulimit -n 256` may hold 128 partitions: 200 in one topic would take
    descriptors the process needs for everything else."""
    proc = subprocess.run(
        [sys.executable, "-c", _DEFAULT_BOUND, str(tmp_path / "s")],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split(maxsplit=2) == ["max_partitions", "128", "[]\n"]


def test_the_default_bound_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    from mqcore.config import STORE_PARTITIONS_CAP, PartitionLimits

    limits = PartitionLimits()
    for soft, bound in ((1024, 512), (20_000, 10_000), (1 << 20, STORE_PARTITIONS_CAP),
                        (resource.RLIM_INFINITY, STORE_PARTITIONS_CAP)):  # fmt: skip
        fake: Callable[[int], tuple[int, int]] = lambda _which, s=soft: (s, s)  # noqa: E731
        monkeypatch.setattr(resource, "getrlimit", fake)
        assert limits.store_bound() == bound
    assert PartitionLimits(store=7).store_bound() == 7
