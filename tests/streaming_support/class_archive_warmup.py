"""Build the driver class archive (streaming_merge.spark.class_archive) before the test session's
driver subprocesses start, so that each of them maps it.

Without this, the first local JVM of a fresh machine is the test session's own, which holds the
archive's build lock for the whole run and writes the archive only at its exit: every driver
subprocess of that run (the SIGKILL tests' lives, tens of them) starts without it. From an empty
cache, the three kill test files' tests took 229 s with it instead of 330 s. The workload is what
those subprocesses do (a Delta table with deletion vectors, a MERGE, a read, a ``MergeSink``
stream), so the classes they load are the ones archived.

Run as ``python -m tests.streaming_support.class_archive_warmup``; the archive is written when
the process exits. It prints its JVM's archive options (``ARGS [...]``), which
tests/spark/test_class_archive_session.py reads as a first session's.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from streaming_merge import DeltaTable, MergeSink
from streaming_merge.session import local_session


def main() -> None:
    spark = local_session("class-archive-warmup", "local[2]", shuffle_partitions=2)
    print("ARGS", archive_options(spark))
    with tempfile.TemporaryDirectory(prefix="class_archive_warmup_") as folder:
        root = Path(folder)
        table = str(root / "table")
        DeltaTable.createFromDataFrame(spark.range(20).selectExpr("id", "id * 2 AS v"), table,
                                       properties={"delta.enableDeletionVectors": "true"})
        source = spark.range(10, 30).selectExpr("id", "id AS v").alias("s")
        (DeltaTable.forPath(spark, table).alias("t").merge(source, "t.id = s.id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        DeltaTable.forPath(spark, table).toDF().collect()

        events = root / "events"
        events.mkdir()
        (events / "0.json").write_text("\n".join(json.dumps({"id": i, "v": i, "lsn": i, "op": "u"}) for i in range(5)))
        sink = MergeSink(str(root / "sink"), keys=["id"], sequence_by="lsn", apply_as_deletes="op = 'd'")

        def for_each_batch(batch: DataFrame, batch_id: int) -> None:
            sink(batch, batch_id)

        query = (spark.readStream.schema("id long, v long, lsn long, op string").json(str(events))
                 .writeStream.foreachBatch(for_each_batch).option("checkpointLocation", str(root / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()


def archive_options(spark: SparkSession) -> list[str]:
    """The driver JVM's options that name a class archive (to build or to map)."""
    arguments = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    return [str(a) for a in arguments if "Archive" in str(a)]


if __name__ == "__main__":
    main()
