"""Session settings for the duration of one operation, restored afterwards.

A streaming query's foreachBatch runs on the query's own session clone, so settings made
here never leak into other queries; the previous value (or its absence) comes back even
when the operation fails. Each setting is a round trip to the JVM, so a block that finds a
setting already as it wants it leaves that one alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from pyspark.sql import SparkSession


@contextlib.contextmanager
def temporary_conf(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    # Only what differs is set and restored: a block inside another that already holds the
    # same settings (a write inside the sink's batch) costs a read per key, no more.
    previous = {key: now for key, value in settings.items() if (now := spark.conf.get(key, None)) != value}
    for key in previous:
        spark.conf.set(key, settings[key])
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


# Spark joins two one-partition sides where they are (no exchange) only when its size estimate of
# each is within spark.sql.maxSinglePartitionBytes (128 MB); otherwise it shuffles both again into
# spark.sql.shuffle.partitions for parallelism. A micro-batch or a checkpoint of one has no size
# of its own: Spark takes spark.sql.defaultSizeInBytes (Long.MaxValue) and scales it up with every
# column a projection adds, past any bound. With that default at 1 TB (still never broadcast) and
# no bound, the sides our plans put in one partition on purpose stay there.
ONE_PARTITION_JOINS = {"spark.sql.maxSinglePartitionBytes": str((1 << 63) - 1),
                       "spark.sql.defaultSizeInBytes": str(1 << 40)}
