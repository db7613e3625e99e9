"""A batch MERGE in a subprocess, for tests/cluster/test_cluster_merge.py.

Run as ``python -m tests.cluster.merge_app --master local-cluster[2,1,1024] --root DIR --out FILE``:
creates the target tables under ``DIR`` and runs one upsert MERGE (delete, update, insert
clauses) into each, then writes the MERGE metrics and the cluster report (which executors
ran tasks) to ``FILE`` as JSON. It runs in its own interpreter because a driver process holds
one SparkContext and the test session's is a ``local[2]`` one.

The data are arithmetic on ``spark.range`` so the test can compute the expected table in
plain Python from the constants below, independently of Spark:

- target: ``id`` in ``[0, TARGET_ROWS)``, ``v = 't<id>'``, ``grp = id % 5``;
- source: ``id`` in ``[SOURCE_START, SOURCE_END)``, ``v = 's<id>'``, ``grp = id % 5``,
  ``op = 'd'`` when ``id % DELETE_EVERY == 0`` else ``'u'``;
- MERGE ON ``t.id = s.id``: matched and ``op = 'd'`` → delete; matched → update ``v``;
  not matched and ``op != 'd'`` → insert.

Both sides span several partitions, so every phase runs several tasks spread over the
executors. Two variants cover the engine's two join plans on executors: ``broadcast`` (the
defaults: the source is broadcast and touched files are rewritten map-side; the
``spark.range`` source is stable, so not materialized) and ``shuffle`` (a partitioned target,
broadcast off, the source materialized: a shuffle join whose blocks move between executor
JVMs, reading a local checkpoint held by the executors).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from streaming_merge import DeltaTable
from streaming_merge.session import local_session
from tests.streaming_support.cluster import cluster_report, write_json

TARGET_ROWS = 20_000
SOURCE_START, SOURCE_END = 15_000, 25_000
DELETE_EVERY = 7
PARTITIONS = 4
VARIANTS: dict[str, tuple[list[str] | None, dict[str, Any]]] = {
    "broadcast": (None, {}),
    "shuffle": (["grp"], {"broadcast_source_bytes": -1, "materialize_source": "all"}),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    parser.add_argument("--root", required=True, help="folder for the tables, one per variant")
    parser.add_argument("--out", required=True, help="JSON file: metrics per variant and the cluster report")
    args = parser.parse_args(argv)

    spark = local_session("cluster-merge-app", args.master, shuffle_partitions=2)
    target = spark.range(0, TARGET_ROWS, numPartitions=PARTITIONS).selectExpr(
        "id", "concat('t', id) AS v", "id % 5 AS grp")
    source = spark.range(SOURCE_START, SOURCE_END, numPartitions=PARTITIONS).selectExpr(
        "id", "concat('s', id) AS v", "id % 5 AS grp",
        f"CASE WHEN id % {DELETE_EVERY} = 0 THEN 'd' ELSE 'u' END AS op")
    merges: dict[str, dict[str, Any]] = {}
    for name, (partition_by, options) in VARIANTS.items():
        table = DeltaTable.createFromDataFrame(target, os.path.join(args.root, name), partitionBy=partition_by)
        metrics = (table.alias("t").merge(source.alias("s"), "t.id = s.id")
                   .whenMatchedDelete(condition="s.op = 'd'")
                   .whenMatchedUpdate(set={"v": "s.v"})
                   .whenNotMatchedInsert(condition="s.op != 'd'", values={"id": "s.id", "v": "s.v", "grp": "s.grp"})
                   .withOptions(**options)
                   .execute())
        merges[name] = dict(metrics)
    write_json(args.out, cluster_report(spark, merges=merges))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
