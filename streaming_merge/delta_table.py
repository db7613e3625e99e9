"""``DeltaTable``: the entry point, shaped like delta-spark's class of the same name."""

from __future__ import annotations

import os
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession

from streaming_merge.merge.builder import DeltaMergeBuilder
from streaming_merge.table.commit import history
from streaming_merge.table.create import create_table
from streaming_merge.table.scan import scan_files
from streaming_merge.table.snapshot import load_snapshot, open_table, require_table

DEFAULT_TARGET_ALIAS = "target"


class DeltaTable:
    """A Delta table at a path, read and merged with Spark; the log goes through delta-rs.

    Works with any SparkSession: no Delta jar or session extension is needed.
    """

    def __init__(self, spark: SparkSession, path: str, alias: str = DEFAULT_TARGET_ALIAS) -> None:
        self._spark = spark
        self.path = os.path.abspath(path)
        self.alias_name = alias

    @classmethod
    def forPath(cls, spark: SparkSession, path: str) -> DeltaTable:
        """The table at ``path``; raises NotADeltaTableError when there is none. Its log is
        read when it is used (a MERGE reads it once, for its snapshot)."""
        require_table(os.path.abspath(path))
        return cls(spark, path)

    @classmethod
    def createFromDataFrame(cls, df: DataFrame, path: str,
                            partitionBy: list[str] | None = None) -> DeltaTable:
        """Create a new Delta table at ``path`` holding ``df``'s rows (refuses an existing one)."""
        create_table(df.sparkSession, df, path, partitionBy)
        return cls(df.sparkSession, path)

    @classmethod
    def isDeltaTable(cls, spark: SparkSession, path: str) -> bool:
        from streaming_merge.table.snapshot import table_exists

        return table_exists(os.path.abspath(path))

    def alias(self, alias: str) -> DeltaTable:
        return DeltaTable(self._spark, self.path, alias)

    def toDF(self, version: int | None = None) -> DataFrame:
        """The table (at ``version``, latest by default) as a DataFrame, aliased as the table."""
        snapshot = load_snapshot(self.path, version)
        return scan_files(self._spark, snapshot, snapshot.files).alias(self.alias_name)

    def version(self) -> int:
        return open_table(self.path).version()

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Commits newest first; MERGE commits carry operationParameters and operationMetrics."""
        return history(self.path, limit)

    def merge(self, source: DataFrame, condition: str | Column) -> DeltaMergeBuilder:
        """Start a MERGE of ``source`` into this table on ``condition``."""
        return DeltaMergeBuilder(self, source, condition)  # type: ignore[arg-type]
