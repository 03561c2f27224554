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

# Spark's Python filter-pushdown setting. The mqcore reader takes no filters (docs/spark.md
# "Filters"), so reads run the same with it on or off.
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any) -> None:
    """Register the "mqcore" data source with a SparkSession, after checking that Spark's
    Python workers can import mqcore (InvalidConfigError naming PYSPARK_PYTHON if not)."""
    try:
        from mqcore.spark.source import MqcoreDataSource
    except ImportError as e:
        raise ImportError(
            "mqcore.spark needs PySpark 4.1 or later: pip install 'mqcore[spark]'"
        ) from e
    from mqcore.spark.workers import check_workers

    check_workers(spark)
    spark.dataSource.register(MqcoreDataSource)
