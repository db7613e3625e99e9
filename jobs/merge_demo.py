"""Batch MERGE demo: build a small Delta table, merge a change set into it, print the
metrics and the resulting rows, and check them against the expected state.

Run: ``python -m jobs.merge_demo [--path DIR]``
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile

import deltalake

from streaming_merge import DeltaTable
from streaming_merge.session import local_session, stop_session

EXPECTED = {
    1: ("alice", 120.0, "gold"),
    2: ("bob", 80.0, "silver"),
    4: ("dave", 15.0, "bronze"),
    5: ("erin", 55.0, "silver"),
    6: ("frank", 10.0, "bronze"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", help="table folder (default: a new temporary folder)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path = args.path or tempfile.mkdtemp(prefix="merge_demo_") + "/customers"
    spark = local_session("merge_demo")

    customers = spark.createDataFrame(
        [(1, "alice", 100.0, "gold", "eu"), (2, "bob", 80.0, "silver", "us"), (3, "carol", 30.0, "bronze", "eu"),
         (4, "dave", 15.0, "bronze", "us")],
        "id long, name string, balance double, tier string, region string",
    )
    table = DeltaTable.createFromDataFrame(customers, path, partitionBy=["region"])
    changes = spark.createDataFrame(
        [(1, "alice", 120.0, "gold", "eu", "u"), (3, None, None, None, "eu", "d"),
         (5, "erin", 55.0, "silver", "us", "c"), (6, "frank", 10.0, "bronze", "eu", "c")],
        "id long, name string, balance double, tier string, region string, op string",
    )
    metrics = (
        table.alias("t").merge(changes.alias("s"), "t.id = s.id AND t.region = s.region")
        .whenMatchedDelete(condition="s.op = 'd'")
        .whenMatchedUpdate(set={"name": "s.name", "balance": "s.balance", "tier": "s.tier"})
        .whenNotMatchedInsert(condition="s.op != 'd'", values={
            "id": "s.id", "name": "s.name", "balance": "s.balance", "tier": "s.tier", "region": "s.region"})
        .execute()
    )
    print(f"MERGE committed version {metrics['tableVersion']} of {path}")
    for name, value in metrics.items():
        print(f"  {name:42s} {value}")
    rows = sorted(deltalake.DeltaTable(path).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    print("Resulting rows (read back with delta-rs):")
    for row in rows:
        print(f"  {row}")
    actual = {r["id"]: (r["name"], r["balance"], r["tier"]) for r in rows}
    verdict = actual == EXPECTED and metrics["num_affected_rows"] == 4
    print("VERDICT:", "PASS" if verdict else f"FAIL (expected {EXPECTED})")
    stop_session(spark)
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
