"""The tables we write are ordinary Delta tables, as the README says: DuckDB's Delta reader
(its ``delta`` extension, from PyPI's ``duckdb-extension-delta``), Polars' ``read_delta`` and
Delta Lake on Spark read them as our reader does. Two tables: one partitioned, upserted and
deleted from with deletion vectors, with a checkpoint; one with a column added by schema
evolution and its change data feed on."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import duckdb_extensions
import polars as pl
import pytest
from pyspark.sql import SparkSession

from streaming_merge import DeltaTable

pytestmark = [pytest.mark.spark, pytest.mark.delta]


def _rows(records: list[dict[str, Any]], columns: list[str]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(record[c] for c in columns) for record in records)


def _read_by_everyone(spark: SparkSession, path: str, columns: list[str]) -> dict[str, Counter[tuple[Any, ...]]]:
    duckdb_extensions.import_extension("delta")
    with duckdb.connect() as connection:
        connection.execute("LOAD delta")
        query = f"SELECT {', '.join(columns)} FROM delta_scan(?)"
        ducks = connection.execute(query, [path]).fetch_arrow_table().to_pylist()
    return {
        "ours": _rows([r.asDict() for r in DeltaTable.forPath(spark, path).toDF().collect()], columns),
        "duckdb": _rows(ducks, columns),
        "polars": _rows(pl.read_delta(path).to_dicts(), columns),
        "delta-spark": _rows([r.asDict() for r in spark.read.format("delta").load(path).collect()], columns),
    }


def test_duckdb_polars_and_delta_lake_read_our_tables_as_we_do(spark: SparkSession, tmp_path: Path) -> None:
    upserted = str(tmp_path / "upserted")
    start = spark.range(0, 60).selectExpr("id AS k", "CAST(id % 3 AS STRING) AS part", "id * 10 AS v")
    table = DeltaTable.createFromDataFrame(start.repartition(3), upserted, partitionBy=["part"], properties={
        "delta.enableDeletionVectors": "true", "delta.checkpointInterval": "2"})
    state = {k: k * 10 for k in range(60)}
    for batch in range(3):  # three MERGEs: updates, inserts and deletes; a checkpoint on the way
        changes = spark.range(batch * 20, batch * 20 + 30).selectExpr(
            "id AS k", "CAST(id % 3 AS STRING) AS part", f"id * 10 + {batch + 1} AS v", "id % 5 = 0 AS gone")
        (table.alias("t").merge(changes.alias("s"), "t.k = s.k")
         .whenMatchedDelete("s.gone").whenMatchedUpdate(set={"v": "s.v"})
         .whenNotMatchedInsert(condition="NOT s.gone", values={"k": "s.k", "part": "s.part", "v": "s.v"})
         .execute())
        for k in range(batch * 20, batch * 20 + 30):
            if k % 5 == 0:
                state.pop(k, None)
            else:
                state[k] = k * 10 + batch + 1
    expected = Counter((k, str(k % 3), v) for k, v in state.items())
    readers = _read_by_everyone(spark, upserted, ["k", "part", "v"])
    assert readers["ours"] == expected
    assert all(rows == expected for rows in readers.values()), {name: sum(r.values()) for name, r in readers.items()}
    assert (tmp_path / "upserted" / "_delta_log" / "00000000000000000002.checkpoint.parquet").exists()

    evolved = str(tmp_path / "evolved")
    table = DeltaTable.createFromDataFrame(spark.range(0, 10).selectExpr("id AS k", "'a' AS s"), evolved,
                                           properties={"delta.enableChangeDataFeed": "true"})
    wider = spark.range(5, 15).selectExpr("id AS k", "'b' AS s", "id * 2 AS added")
    (table.alias("t").merge(wider.alias("s"), "t.k = s.k").withSchemaEvolution()
     .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
    expected = Counter([(k, "a", None) for k in range(5)] + [(k, "b", k * 2) for k in range(5, 15)])
    readers = _read_by_everyone(spark, evolved, ["k", "s", "added"])
    assert all(rows == expected for rows in readers.values()), readers
