"""Where snapshots come from: a table or DataFrame read once per call, or a function that
hands out historical snapshots one after the other.

Databricks' ``source`` argument takes the same two shapes. A table or DataFrame is the
source system's state *now*: each call of the flow reads it once and applies it as the next
version (the last applied one plus 1). A function ``next_snapshot_and_version(latest)`` knows
which snapshots exist (files in a landing folder, dated exports) and is asked for the one
after ``latest`` until it returns None; its versions are the snapshots' own, so they must
increase, and a rerun after a crash simply asks again from the last version the table holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from streaming_merge.delta_table import DeltaTable
from streaming_merge.errors import InvalidArgumentTypeError
from streaming_merge.snapshots.errors import SnapshotCdcError, SnapshotVersionError
from streaming_merge.table.location import resolve
from streaming_merge.table.snapshot import table_exists

NextSnapshot = Callable[[int | None], "tuple[DataFrame, int] | None"]
SnapshotSource = str | DataFrame | NextSnapshot


@dataclass(frozen=True)
class VersionedSnapshot:
    """One snapshot to apply: its rows and its version (the history's sequence value)."""

    frame: DataFrame
    version: int


def snapshots(spark: SparkSession, source: SnapshotSource, latest: Callable[[], int | None],
              storage_options: Mapping[str, str] | None = None) -> Iterator[VersionedSnapshot]:
    """The snapshots to apply, in order. ``latest`` returns the last version the table holds
    for this flow, read again before each one, so that a version applied meanwhile (by this
    loop or by a concurrent run) is never handed out twice."""
    if isinstance(source, DataFrame | str):
        last = latest()
        yield VersionedSnapshot(batch(read_now(spark, source, storage_options)), (last or 0) + 1)
        return
    if not callable(source):
        raise InvalidArgumentTypeError("source must be a table path or name, a DataFrame, or a function "
                        f"next_snapshot_and_version(latest_version) -> (DataFrame, version) | None; got "
                        f"{type(source).__name__}")
    while True:
        last = latest()
        produced = source(last)
        if produced is None:
            return
        yield checked(produced, last)


def read_now(spark: SparkSession, source: str | DataFrame, storage_options: Mapping[str, str] | None) -> DataFrame:
    """A DataFrame as given; a string as the Delta table at that path (pinned to its latest
    version: the snapshot cannot change while it is applied), else as a catalog table or view."""
    if isinstance(source, DataFrame):
        return source
    if table_exists(resolve(source, spark, storage_options)):
        return DeltaTable.forPath(spark, source, storage_options=storage_options).toDF()
    try:
        return spark.table(source)
    except AnalysisException as exc:
        raise SnapshotCdcError(f"The snapshot source `{source}` is neither a Delta table path nor a table or view "
                               f"Spark knows: {exc}") from exc


def checked(produced: object, last: int | None) -> VersionedSnapshot:
    """What ``next_snapshot_and_version`` returned, checked: a (DataFrame, int) pair whose
    version is past the last applied one."""
    if not (isinstance(produced, tuple) and len(produced) == 2):
        raise SnapshotCdcError("next_snapshot_and_version must return (DataFrame, version) or None; got "
                               f"{type(produced).__name__}")
    frame, version = produced
    if not isinstance(frame, DataFrame):
        raise SnapshotCdcError(f"next_snapshot_and_version returned {type(frame).__name__} as the snapshot; "
                               "it must be a DataFrame")
    if isinstance(version, bool) or not isinstance(version, int):
        raise SnapshotVersionError(f"next_snapshot_and_version returned the version {version!r} "
                                   f"({type(version).__name__}); snapshot versions are integers")
    if last is not None and version <= last:
        raise SnapshotVersionError(
            f"next_snapshot_and_version({last}) returned version {version}, which is not greater than the last "
            f"applied version {last}; snapshot versions must increase (it is called with the last applied "
            "version and must return a later snapshot, or None when there is none)")
    if version < 0:
        raise SnapshotVersionError(f"next_snapshot_and_version returned the version {version}; snapshot "
                                   "versions are 0 or more (they are recorded as the Delta txn version)")
    return VersionedSnapshot(batch(frame), version)


def batch(frame: DataFrame) -> DataFrame:
    """A snapshot is a whole table at one moment: a streaming DataFrame is none."""
    if frame.isStreaming:
        raise SnapshotCdcError("The snapshot is a streaming DataFrame; AUTO CDC FROM SNAPSHOT takes batch snapshots "
                               "(for a change stream use MergeSink / AUTO CDC instead).")
    return frame
