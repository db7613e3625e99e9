"""A SparkSession with sane local defaults for jobs, demos, tests and benchmarks.

The library works with any SparkSession; this is only a convenience so that a laptop
run is quiet and fast (few shuffle partitions, no UI unless asked).
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def local_session(
    app_name: str = "streaming_merge",
    master: str = "local[2]",
    *,
    ui: bool = False,
    shuffle_partitions: int = 4,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """Get or create a local SparkSession configured for small-to-medium data.

    Python workers (the Kafka source's readers) run this interpreter, so they import the
    same streaming_merge as the driver.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(shuffle_partitions))
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.adaptive.enabled", "true")
        # PySpark 4 otherwise records the Python call site of every Column function in the
        # JVM (about five py4j round trips per call) for error messages: hundreds of round
        # trips per MERGE, a third of a small MERGE's driver time.
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
    )
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
