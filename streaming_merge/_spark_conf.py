"""Session settings for the duration of one operation, restored afterwards.

A streaming query's foreachBatch runs on the query's own session clone, so settings made
here never leak into other queries; the previous value (or its absence) comes back even
when the operation fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from pyspark.sql import SparkSession


@contextlib.contextmanager
def temporary_conf(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    previous = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
