"""`mqcore serve` watched by Burrow 1.2.1 (LinkedIn's consumer lag checker, Debian 12's
burrow): its cluster module asks the server for every partition's end offset, its consumer
module reads the committed offsets from `__consumer_offsets` over the wire, and its HTTP API
then reports each group's lag, which must be what `Store.group_lag` (and `mqcore groups`)
says. Burrow keeps its own state in ZooKeeper, so the test runs Debian's (a Java process).
`make test-tools` installs burrow and zookeeper as root; without them the test skips. Slow:
two daemons start and Burrow refreshes on its own clock (1 s here)."""

from __future__ import annotations

import json
import shutil
import urllib.request
from typing import Any

import pytest
from clients.harness import committed, fill_config, free_port, running, tail, wait_for
from zkserver import ZooKeeper

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytestmark = pytest.mark.slow


def burrow_get(address: str, path: str) -> Any:
    """GET Burrow's HTTP API (v3, cluster "local"); the JSON answer, or {} while it does not
    answer."""
    try:
        with urllib.request.urlopen(f"http://{address}/v3/kafka/local{path}", timeout=5) as r:
            return json.load(r)
    except OSError:
        return {}


def burrow_lag(address: str, group: str) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> (committed offset, lag) as Burrow reports them for `group`."""
    status = burrow_get(address, f"/consumer/{group}/lag").get("status") or {}
    return {
        (x["topic"], x["partition"]): (x["end"]["offset"], x["current_lag"])
        for x in status.get("partitions") or []
        if x.get("end")
    }


def test_burrow_reports_the_lag_the_store_has(
    kafka_server: Any, store: mqcore.Store, zk: ZooKeeper, tmp_path: Any
) -> None:
    """Burrow started over a store no group has committed in yet, as when it is set up with
    the cluster; then a group commits behind the end on two partitions: Burrow's lag for
    each partition (end offset minus commit) and its commits are the store's."""
    burrow = shutil.which("Burrow") or shutil.which("burrow")
    if burrow is None:
        pytest.skip("Burrow is not installed (apt-get install burrow; make test-tools)")
    store.create_topic("orders", partitions=2)
    for p in range(2):
        store.append_batch("orders", [b"order %d" % i for i in range(30 + 10 * p)], partition=p)
    http = f"127.0.0.1:{free_port()}"
    fields = {"pidfile": str(tmp_path / "pid"), "zookeeper": zk.address, "http": http}
    fill_config("burrow.toml", str(tmp_path / "burrow.toml"), **fields,
                bootstrap=kafka_server.bootstrap)  # fmt: skip
    log = str(tmp_path / "burrow.log")
    with running([burrow, "--config-dir", str(tmp_path)], log):
        # Burrow keeps commits only for topics whose end offsets it already has
        wait_for(
            lambda: burrow_get(http, "/topic/orders").get("offsets") == [30, 40],
            lambda: f"Burrow to learn the end offsets\n{tail(log)}",
        )
        store.alter_group_offsets("billing", {("orders", 0): 25, ("orders", 1): 12})
        want = committed(store, "billing")
        assert want == {("orders", 0): (25, 5), ("orders", 1): (12, 28)}
        wait_for(
            lambda: len(burrow_lag(http, "billing")) == 2,
            lambda: f"Burrow's lag for billing\n{tail(log)}",
        )
        assert burrow_lag(http, "billing") == want
