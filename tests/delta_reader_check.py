"""Delta Lake as a second reader of the tables the test suite writes.

Why: a table that Delta Lake reads differently from us is a bug of the first order, and the
suite's tests each read back only what they assert on, through our own reader. This check
reads a table through both and compares what a user of either would see:

- the rows (as JSON text, so that every type compares, maps and binaries included) and the
  schema of the newest version;
- the version, and each version's operation in the history;
- the protocol (reader and writer versions), the table features, the partition columns, the
  properties and the number of live files (``DESCRIBE DETAIL`` against our snapshot);
- with the change data feed on from the table's first version, the change rows of every
  version.

A table our reader refuses (a test's corrupt log, a feature we do not support) is not ours to
compare and is skipped. ``tests/conftest.py`` runs it on the tables each Spark test leaves in
its ``tmp_path``; ``python -m tests.delta_reader_check ROOT`` runs it on every table under ROOT.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable as DeltaLakeTable
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from streaming_merge import DeltaTable
from streaming_merge.errors import DeltaTableError, StreamingMergeError
from streaming_merge.table.protocol import Protocol
from streaming_merge.table.snapshot import load_snapshot

CDF_META = ("_commit_version", "_commit_timestamp")


def tables_under(root: Path) -> Iterator[Path]:
    """Every folder under ``root`` that holds a Delta log with at least one commit."""
    for log in sorted(root.rglob("_delta_log")):
        if (log.is_dir() and any(log.glob("*.json")) and "_delta_log" not in log.parent.parts
                and not any(part.is_symlink() for part in log.parents if part.is_relative_to(root))):
            yield log.parent


def _json_rows(df: DataFrame) -> Counter[str]:
    columns = [c for c in df.columns if c not in CDF_META]
    return Counter(r[0] for r in df.select(F.to_json(F.struct(*columns))).collect())


def _rows_of_both(ours: DataFrame, theirs: DataFrame) -> tuple[Counter[str], Counter[str]]:
    """Both sides' rows as JSON text, in one Spark job."""
    def side(df: DataFrame, name: int) -> DataFrame:
        return df.select(F.lit(name).alias("side"), F.to_json(F.struct(*df.columns)).alias("row"))

    both: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
    for row in side(ours, 0).unionByName(side(theirs, 1)).collect():
        both[row["side"]][row["row"]] += 1
    return both


def _ours(spark: SparkSession, path: str) -> tuple[DeltaTable, DataFrame] | None:
    try:
        table = DeltaTable.forPath(spark, path)
        return table, table.toDF()
    except (StreamingMergeError, ValueError):
        return None


def differences(spark: SparkSession, path: str) -> list[str]:
    """What Delta Lake reads differently from us in the table at ``path`` (empty: nothing)."""
    opened = _ours(spark, path)
    if opened is None:
        return []
    ours, our_df = opened
    try:
        theirs = DeltaLakeTable.forPath(spark, path)
        their_df = theirs.toDF()
    except Exception as exc:  # py4j's error for a refusal in the JVM is not a PySparkException
        reason = next((line for line in str(exc).splitlines() if "Exception" in line), str(exc))
        return [f"Delta cannot read it: {reason.strip()[:500]}"]
    if our_df.schema.simpleString() != their_df.schema.simpleString():
        return [f"schema: ours {our_df.schema.simpleString()}, Delta's {their_df.schema.simpleString()}"]
    found: list[str] = []
    our_rows, their_rows = _rows_of_both(our_df, their_df)
    if our_rows != their_rows:
        found.append(f"rows: ours {sorted(our_rows.elements())[:20]}, Delta's {sorted(their_rows.elements())[:20]}")
    history = theirs.history().select("version", "operation", "operationParameters").collect()
    found += _history_differences(history, ours)
    found += _detail_differences(theirs.detail().collect()[0].asDict(), ours)
    found += _change_differences(spark, path, history, ours)
    return found


def _history_differences(history: list[Row], ours: DeltaTable) -> list[str]:
    theirs = {int(r["version"]): r["operation"] for r in history}
    try:
        mine = {int(entry["version"]): entry.get("operation") for entry in ours.history()}
    except DeltaTableError:
        return []  # a history delta-rs cannot list (a `#` in the path): our error says so
    if max(theirs) != ours.version():
        return [f"version: ours {ours.version()}, Delta's {max(theirs)}"]
    return [] if mine == theirs else [f"history: ours {mine}, Delta's {theirs}"]


def _detail_differences(detail: dict[str, Any], ours: DeltaTable) -> list[str]:
    snapshot = load_snapshot(ours.location)
    protocol = Protocol.of(snapshot.protocol)
    mine: dict[str, Any] = {
        "minReaderVersion": protocol.min_reader_version,
        "minWriterVersion": protocol.min_writer_version,
        "partitionColumns": list(snapshot.partition_columns),
        "properties": dict(snapshot.configuration),
        "numFiles": len(snapshot.files),
    }
    theirs = {key: detail[key] for key in mine}
    theirs["properties"] = dict(theirs["properties"])
    if protocol.min_writer_version >= 7:  # below, Delta lists the features the versions imply
        mine["tableFeatures"] = sorted({*(protocol.reader_features or []), *(protocol.writer_features or [])})
        theirs["tableFeatures"] = sorted(detail["tableFeatures"])
    return [f"{key}: ours {mine[key]}, Delta's {theirs[key]}" for key in mine if mine[key] != theirs[key]]


def _change_differences(spark: SparkSession, path: str, history: list[Row], ours: DeltaTable) -> list[str]:
    """Change rows of every version, when the feed is on from the first commit (otherwise both
    refuse a range that starts before it, each in its own words)."""
    first = min(history, key=lambda r: int(r["version"]))
    if "delta.enableChangeDataFeed" not in str(first["operationParameters"]) or ours.version() < 1:
        return []
    try:
        changes = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(path)
        theirs = _json_rows(changes.drop(*CDF_META))
    except PySparkException:
        return []  # a version without change data on Delta's side (the feed turned off later)
    mine = _json_rows(ours.changes(0, ours.version()).drop(*CDF_META))
    return [] if mine == theirs else [f"change rows: ours {sorted(mine.elements())[:20]}, "
                                      f"Delta's {sorted(theirs.elements())[:20]}"]


def main(argv: list[str]) -> int:
    from tests.conftest import test_session

    spark = test_session()
    failed = 0
    for table in tables_under(Path(argv[0])):
        found = differences(spark, str(table))
        failed += bool(found)
        print(("DIFFERS " if found else "same    ") + str(table), *found, sep="\n    ")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
