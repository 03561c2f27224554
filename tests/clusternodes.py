"""Brokers as the cluster's coordination sees them, for the cluster tests: each a ZooKeeper
session of its own with its registration and its ClusterController, in the test's process. A
broker dies when its session ends: ZooKeeper drops its ephemeral znodes at once, as after a
crashed broker's session timeout."""

from __future__ import annotations

import random

from zkserver import ZooKeeper

from mqcore.cluster.controller import ClusterController
from mqcore.cluster.zk import BrokerInfo, ZkCoordinator


class Node:
    """One broker as the cluster sees it: registered, running its controller."""

    def __init__(self, zk: ZooKeeper, node_id: int, *, unclean: bool = False):
        self.node_id = node_id
        self.coordinator = ZkCoordinator(zk.url("/cluster"), session_timeout_ms=4000,
                                         connect_timeout=10.0).start()  # fmt: skip
        self.coordinator.register_broker(BrokerInfo(node_id, "127.0.0.1", 9100 + node_id))
        self.controller = ClusterController(
            self.coordinator, node_id, unclean_leader_election=unclean, rng=random.Random(node_id)
        ).start()
        self.alive = True

    def kill(self) -> None:
        """The broker dies: its session ends, and its registration and term with it."""
        if self.alive:
            self.controller.stop()
            self.coordinator.close()
            self.alive = False
