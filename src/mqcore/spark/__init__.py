"""Spark without a broker: `spark.read.format("mqcore")` over a store directory.

    import mqcore.spark
    mqcore.spark.register(spark)
    df = spark.read.format("mqcore").option("subscribe", "clicks").load("/data/store")

The options and the schema are Spark's Kafka source's (docs/spark.md). Importing this package
does not import PySpark; register() does (pip install 'mqcore[spark]').
"""

from __future__ import annotations

from typing import Any

__all__ = ["PUSHDOWN_CONF", "register"]

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any, *, pushdown: bool | None = None) -> None:
    """Register the "mqcore" data source with a SparkSession.

    `pushdown` picks the reader that takes filters (partition, offset, timestamp and topic
    comparisons answered from the indexes). Spark refuses to plan a read whose reader takes
    filters while spark.sql.python.filterPushdown.enabled is off, so by default it follows
    that setting as it is now; register again after changing it.
    """
    try:
        from mqcore.spark.source import MqcoreDataSource, MqcorePushdownDataSource
    except ImportError as e:
        raise ImportError(
            "mqcore.spark needs PySpark 4.1 or later: pip install 'mqcore[spark]'"
        ) from e
    if pushdown is None:
        pushdown = str(spark.conf.get(PUSHDOWN_CONF, "false")).strip().lower() == "true"
    spark.dataSource.register(MqcorePushdownDataSource if pushdown else MqcoreDataSource)
