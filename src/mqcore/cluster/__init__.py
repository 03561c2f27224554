"""More than one node (issue 33): the cluster's state in a coordination service (ZooKeeper,
`cluster.zk`), from which the controller and the replica manager act. A node without a
coordinator is the one-node server of `mqcore.server`, unchanged. docs/cluster.md."""
