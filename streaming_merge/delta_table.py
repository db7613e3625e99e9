"""``DeltaTable``: the entry point, shaped like delta-spark's class of the same name."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession

from streaming_merge.dml import DmlMetrics, run_delete, run_update
from streaming_merge.merge.builder import DeltaMergeBuilder
from streaming_merge.optimize.builder import DeltaOptimizeBuilder
from streaming_merge.table.commit import history
from streaming_merge.table.create import create_table
from streaming_merge.table.location import TableHandle, TableLocation, TableRef, resolve
from streaming_merge.table.properties import set_properties
from streaming_merge.table.scan import scan_files
from streaming_merge.table.snapshot import load_snapshot, open_table, require_table, table_exists
from streaming_merge.table.vacuum import vacuum

DEFAULT_TARGET_ALIAS = "target"


class DeltaTable:
    """A Delta table at a path, read and merged with Spark; the log goes through delta-rs.

    Works with any SparkSession: no Delta jar or session extension is needed. ``path`` is a
    path or URI as Spark names files (``/lake/t``, ``file:///lake/t``, ``s3a://bucket/t``,
    ``abfss://...``); ``storage_options`` are delta-rs options for the log, added to those
    derived from the session's Hadoop configuration.
    """

    def __init__(self, spark: SparkSession, path: TableRef, alias: str = DEFAULT_TARGET_ALIAS,
                 storage_options: Mapping[str, str] | None = None) -> None:
        self._spark = spark
        self.location: TableLocation = resolve(path, spark, storage_options)
        self.path = self.location.uri
        self.alias_name = alias

    @classmethod
    def forPath(cls, spark: SparkSession, path: TableRef,
                storage_options: Mapping[str, str] | None = None) -> DeltaTable:
        """The table at ``path``; raises NotADeltaTableError when there is none. Its log is
        read when it is used (a MERGE reads it once, for its snapshot)."""
        table = cls(spark, path, storage_options=storage_options)
        require_table(table.location)
        return table

    @classmethod
    def createFromDataFrame(cls, df: DataFrame, path: TableRef, partitionBy: list[str] | None = None,
                            storage_options: Mapping[str, str] | None = None,
                            properties: Mapping[str, str] | None = None) -> DeltaTable:
        """Create a new Delta table at ``path`` holding ``df``'s rows (refuses an existing one).
        ``properties``: table properties, e.g. ``{"delta.enableDeletionVectors": "true"}``."""
        table = cls(df.sparkSession, path, storage_options=storage_options)
        create_table(df.sparkSession, df, table.location, partitionBy, properties=properties)
        return table

    @classmethod
    def isDeltaTable(cls, spark: SparkSession, path: TableRef,
                     storage_options: Mapping[str, str] | None = None) -> bool:
        return table_exists(resolve(path, spark, storage_options))

    def _handle(self) -> TableHandle:
        return TableHandle(self._spark, self.location, self.alias_name)

    def alias(self, alias: str) -> DeltaTable:
        return DeltaTable(self._spark, self.location, alias)

    def toDF(self, version: int | None = None) -> DataFrame:
        """The table (at ``version``, latest by default) as a DataFrame, aliased as the table."""
        snapshot = load_snapshot(self.location, version)
        return scan_files(self._spark, snapshot, snapshot.files).alias(self.alias_name)

    def changes(self, starting_version: int | None = None, ending_version: int | None = None,
                starting_timestamp: str | datetime | None = None,
                ending_timestamp: str | datetime | None = None) -> DataFrame:
        """The table's change data feed as Delta's ``readChangeFeed`` returns it: the table's
        columns (the ending version's schema, in table order) plus ``_change_type`` (``insert``,
        ``update_preimage``, ``update_postimage``, ``delete``), ``_commit_version`` and
        ``_commit_timestamp``, for the versions from the start to the end, both included.

        The start is ``starting_version`` or ``starting_timestamp`` (the first version committed
        at or after it), not both; version 0 when neither is given. The end is
        ``ending_version`` or ``ending_timestamp`` (the last version committed at or before it),
        the latest version when neither is given; an end past the latest version reads to the
        latest. Timestamps are ``datetime``s or ISO-8601 strings, UTC unless they carry an
        offset. Every version of the range must have been committed with
        ``delta.enableChangeDataFeed=true``, and the log must still hold its commit.

        Raises ``streaming_merge.cdf.ChangeDataFeedError`` (or its ``ChangeDataNotRecordedError``)
        naming the table, the versions and the fix. The rows are read by Spark when the
        DataFrame is used; the files and their row selections are fixed now, so later commits
        do not change it."""
        from streaming_merge.cdf.batch import changes_frame
        from streaming_merge.cdf.plan import plan_changes

        plan = plan_changes(self.location, starting_version, ending_version, starting_timestamp, ending_timestamp)
        return changes_frame(self._spark, plan)

    def changesStream(self, **options: str) -> DataFrame:
        """The change data feed as a streaming DataFrame: the ``delta_changes`` source
        (streaming_merge.cdf.source, registered here) on this table with its storage options,
        plus ``options``: ``startingVersion`` (a version or ``latest``), ``startingTimestamp``,
        ``maxFilesPerTrigger``, ``maxBytesPerTrigger``. Without a start, the first batches are
        the current snapshot as inserts, as in Delta."""
        from streaming_merge.cdf.source import register

        reader = self._spark.readStream.format(register(self._spark)).option("path", self.location.uri)
        for key, value in {**dict(self.location.storage_options), **options}.items():
            reader = reader.option(key, str(value))
        return reader.load()

    def setProperties(self, properties: Mapping[str, str | None]) -> int:
        """Set (or, with None, unset) table properties in one commit, as ``ALTER TABLE ... SET
        TBLPROPERTIES`` does; ``delta.enableDeletionVectors=true`` also upgrades the protocol to
        reader 3 / writer 7 with the ``deletionVectors`` feature. Returns the new version."""
        return set_properties(self.location, properties)

    def enableDeletionVectors(self) -> int:
        """Turn deletion vectors on (``delta.enableDeletionVectors=true`` and the protocol
        upgrade): later MERGEs, UPDATEs and DELETEs mark rows deleted instead of rewriting files."""
        return self.setProperties({"delta.enableDeletionVectors": "true"})

    def version(self) -> int:
        return open_table(self.location).version()

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Commits newest first; MERGE commits carry operationParameters and operationMetrics."""
        return history(self.location, limit)

    def merge(self, source: DataFrame, condition: str | Column) -> DeltaMergeBuilder:
        """Start a MERGE of ``source`` into this table on ``condition``."""
        return DeltaMergeBuilder(self._handle(), source, condition)  # type: ignore[arg-type]

    def delete(self, condition: str | Column | None = None) -> DmlMetrics:
        """Delete the rows where ``condition`` holds (every row without one), as delta-spark's
        ``delete``; returns Delta's DELETE metrics (delta-spark returns None) with
        ``tableVersion`` None when no row matched (nothing is committed then). A table with
        deletion vectors gets them (no file rewritten); any other has its touched files rewritten."""
        return run_delete(self._spark, self.location, self.alias_name, condition)

    def update(self, condition: str | Column | None = None,
               set: Mapping[str, str | Column] | None = None) -> DmlMetrics:
        """Set columns (``set``: column -> SQL expression or Column, cast to the column's type;
        an overflow raises) on the rows where ``condition`` holds, as delta-spark's ``update``;
        returns Delta's UPDATE metrics, ``tableVersion`` None when no row matched. A table with
        deletion vectors gets the updated rows as new files and their old positions in DVs."""
        return run_update(self._spark, self.location, self.alias_name, condition, set)

    def optimize(self) -> DeltaOptimizeBuilder:
        """Start an OPTIMIZE: ``.where(partition predicate)`` then ``.executeCompaction()``
        bin-packs the small files into files of about the target size (README, "Compaction and
        vacuum")."""
        return DeltaOptimizeBuilder(self._handle())

    def vacuum(self, retentionHours: float | None = None, *, dry_run: bool = False,
               enforce_retention_duration: bool = True) -> list[str]:
        """Delete the files that no version within ``retentionHours`` (default: the table's
        ``delta.deletedFileRetentionDuration``, one week) references, orphans of failed writes
        included; returns their paths relative to the table, sorted. A retention below the
        table's is refused unless ``enforce_retention_duration=False``."""
        return vacuum(self.location, retentionHours, dry_run=dry_run,
                      enforce_retention_duration=enforce_retention_duration)
