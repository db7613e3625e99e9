"""A Spark streaming source for a Delta table's change data feed, on the Python Data Source API.

``spark.readStream.format("delta_changes").option("path", ...)`` after :func:`register`
returns what Delta's ``readStream.option("readChangeFeed", "true")`` does: the table's columns
plus ``_change_type``, ``_commit_version`` and ``_commit_timestamp``. Options (Delta's names):

* ``startingVersion``: a version number, or ``latest`` (only changes committed after the
  query starts); ``startingTimestamp``: the first version committed at or after it. Without
  either, as in Delta, the first batches are the table's snapshot at the version current when
  the query starts, every row an ``insert`` with that ``_commit_version``, then the changes
  after it.
* ``maxFilesPerTrigger`` (default 1000 unless only ``maxBytesPerTrigger`` is given) and
  ``maxBytesPerTrigger`` (soft: a batch takes files until it holds at least that many bytes,
  and always at least one file). A version may be split over several batches.
* every other option is a storage option for the table's store (``aws_access_key_id``, ...).

Offsets are Spark-checkpointed JSON, ``{"sourceVersion": 1, "tableId": ..., "version": v,
"index": i, "isStartingVersion": b}``: everything before the ``i``-th change file of version
``v`` was delivered (``isStartingVersion``: of the snapshot at ``v``). A version's change
files come in a fixed order (the order of its commit file; the snapshot's by path), so a
restart from the checkpoint continues exactly where the last committed batch ended. Where the
start depends on when the query started (the snapshot's version, ``latest``), the initial
offset is a placeholder (``version`` -1) and the first batch's end fixes the version: Spark
asks for the initial offset again when it replays an uncommitted first batch, and a version
chosen then could differ.

The driver (Spark's Python planner worker) reads commit files only; the executors read the
data with pyarrow through the table's obstore store (streaming_merge.cdf.arrow_read). A
commit that changes the schema or the partition columns stops the stream with
:class:`ChangeDataSchemaChangedError`; one that turns the feed off, with
:class:`ChangeDataNotRecordedError`.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import ArrayType, DataType, MapType, StructType

from streaming_merge.cdf.arrow_read import ReadLayout, read_change_file
from streaming_merge.cdf.columns import output_schema, table_part
from streaming_merge.cdf.errors import ChangeDataFeedError, ChangeDataSchemaChangedError
from streaming_merge.cdf.log import list_commits, read_commit
from streaming_merge.cdf.plan import (
    ChangeFile,
    RowSelection,
    VersionChanges,
    configuration_at,
    is_recorded,
    not_recorded_error,
    previous_add,
    refuse_column_mapping,
    starting_timestamp_version,
    to_epoch_ms,
    version_changes,
)
from streaming_merge.spark.python_sources import register_data_source
from streaming_merge.table.deletion_vectors import DeletionVector
from streaming_merge.table.dv_log import live_adds
from streaming_merge.table.location import TableLocation, resolve
from streaming_merge.table.store import table_store

__all__ = ["SHORT_NAME", "ChangesOptions", "ChangesPartition", "DeltaChangesDataSource", "DeltaChangesStreamReader",
           "register"]

SHORT_NAME = "delta_changes"
DEFAULT_MAX_FILES = 1000  # Delta's maxFilesPerTrigger default
_OFFSET_FORMAT = 1
# Change files are packed into Spark tasks as Spark's file sources split their input: about the
# batch's bytes over the slots, at least 4 MB and at most 128 MB a task. The planner (a Python
# worker) cannot ask the cluster for its slots, so it assumes _SLOTS.
_MIN_PARTITION_BYTES = 4 * 1024 * 1024
_MAX_PARTITION_BYTES = 128 * 1024 * 1024
_SLOTS = 8
_CACHED_VERSIONS = 256
_KNOWN = {"path", "startingversion", "startingtimestamp", "maxfilespertrigger", "maxbytespertrigger",
          "readchangefeed", "readchangedata"}
_BYTE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30,
               "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40}


@dataclass(frozen=True)
class ChangesOptions:
    """The source's options, checked when the query starts (a typo fails it then, not at the
    first batch). Spark hands them over lower-cased."""

    path: str
    starting_version: int | None
    starting_latest: bool
    starting_timestamp: str | None
    max_files: int | None  # given explicitly
    max_bytes: int | None
    storage_options: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ChangesOptions:
        lowered = {str(k).lower(): str(v) for k, v in options.items()}
        path = lowered.get("path")
        if not path:
            raise ChangeDataFeedError("Option 'path' is required: the Delta table whose changes to stream.")
        version_text = lowered.get("startingversion")
        timestamp = lowered.get("startingtimestamp")
        if version_text is not None and timestamp is not None:
            raise ChangeDataFeedError("Set at most one of the options 'startingVersion' and 'startingTimestamp'.")
        starting_version, latest = None, False
        if version_text is not None:
            if version_text.strip().lower() == "latest":
                latest = True
            elif version_text.strip().isdigit():
                starting_version = int(version_text)
            else:
                raise ChangeDataFeedError(f"startingVersion must be a version number or 'latest', got {version_text!r}")
        if timestamp is not None:
            to_epoch_ms(timestamp, "startingTimestamp")  # fail at start on a typo
        return cls(path=path, starting_version=starting_version, starting_latest=latest,
                   starting_timestamp=timestamp, max_files=_positive(lowered, "maxfilespertrigger"),
                   max_bytes=_bytes(lowered.get("maxbytespertrigger")),
                   storage_options=tuple(sorted((k, v) for k, v in lowered.items() if k not in _KNOWN)))

    @property
    def files_limit(self) -> int | None:
        """maxFilesPerTrigger, defaulting to 1000 unless only maxBytesPerTrigger is set (Delta)."""
        if self.max_files is not None:
            return self.max_files
        return None if self.max_bytes is not None else DEFAULT_MAX_FILES

    def location(self) -> TableLocation:
        return resolve(self.path, None, dict(self.storage_options) or None)


def _positive(options: Mapping[str, str], key: str) -> int | None:
    text = options.get(key)
    if text is None:
        return None
    if not text.strip().isdigit() or int(text) <= 0:
        raise ChangeDataFeedError(f"{key} must be a positive integer, got {text!r}")
    return int(text)


def _bytes(text: str | None) -> int | None:
    """maxBytesPerTrigger as Spark spells sizes: ``1048576``, ``512k``, ``64m``, ``1g``."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _BYTE_UNITS or int(match.group(1)) <= 0:
        raise ChangeDataFeedError(f"maxBytesPerTrigger must be a positive size such as 1048576, 512k or 64m, "
                                  f"got {text!r}")
    return int(match.group(1)) * _BYTE_UNITS[match.group(2).lower()]


class _Position(NamedTuple):
    """Everything before file ``index`` of version ``version`` (of its snapshot when
    ``snapshot``) was delivered. Snapshot positions at V sort before version V + 1."""

    version: int
    index: int  # type: ignore[assignment]  # a field, not tuple.index
    snapshot: bool


@dataclass(frozen=True)
class ChangesPartition(InputPartition):
    """Change files read by one Spark task, in order."""

    files: tuple[ChangeFile, ...]


class _Budget:
    """What one batch may still take: files and (soft) bytes; unlimited for ReadAllAvailable."""

    def __init__(self, files: int | None, size: int | None) -> None:
        self.files, self.size, self.taken, self.bytes = files, size, 0, 0

    @classmethod
    def of(cls, limit: ReadLimit, options: ChangesOptions) -> _Budget:
        if isinstance(limit, ReadMaxFiles):
            return cls(limit.max_files, options.max_bytes)
        if isinstance(limit, ReadMaxBytes):
            return cls(options.max_files, limit.max_bytes)
        return cls(None, None)  # ReadAllAvailable (Trigger.Once) or a limit that does not apply

    @property
    def exhausted(self) -> bool:
        return ((self.files is not None and self.taken >= self.files)
                or (self.size is not None and self.taken > 0 and self.bytes >= self.size))

    def take(self, files: Sequence[ChangeFile]) -> int:
        """How many of ``files`` (in order) the batch takes."""
        count = 0
        for file in files:
            if self.exhausted:
                break
            self.taken += 1
            self.bytes += file.size
            count += 1
        return count


class DeltaChangesStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: offsets and planning from the commit files. ``read`` runs on executors."""

    def __init__(self, options: ChangesOptions, schema: StructType) -> None:
        from streaming_merge.table.snapshot import open_table  # delta-rs: the planner only

        self._options = options
        self._location = options.location()
        table = open_table(self._location)
        metadata = table.metadata()
        self._table_id = str(metadata.id)
        self._partition_columns = tuple(metadata.partition_columns)
        self._table_schema = table_part(schema)
        self._latest_configuration = dict(metadata.configuration)
        refuse_column_mapping(self._location.uri, self._latest_configuration)
        self._layout = ReadLayout(self._location.log_uri, self._location.storage_options,
                                  to_arrow_schema(schema, timezone="UTC"), self._partition_columns)
        self._versions: OrderedDict[int, VersionChanges] = OrderedDict()
        self._snapshots: dict[int, tuple[ChangeFile, ...]] = {}
        self._target: int | None = None  # Trigger.AvailableNow: no version after this one

    def __getstate__(self) -> dict[str, Any]:
        # Executors need the layout only; the caches stay on the driver.
        return {**self.__dict__, "_versions": OrderedDict(), "_snapshots": {}}

    # -------------------------------------------------------------- driver: offsets

    @property
    def _table(self) -> str:
        return self._location.uri

    def _store(self) -> Any:
        return table_store(self._location.log_uri, self._location.options)

    def _latest_version(self) -> int:
        listing = list_commits(self._store(), self._table, max(self._versions, default=None))
        if not listing.commits:
            listing = list_commits(self._store(), self._table)
        if not listing.commits:
            raise ChangeDataFeedError(f"`{self._table}` is not a Delta table: its `_delta_log` holds no commit.")
        return max(listing.commits)

    def _offset(self, position: _Position) -> dict:
        return {"sourceVersion": _OFFSET_FORMAT, "tableId": self._table_id, "version": position.version,
                "index": position.index, "isStartingVersion": position.snapshot}

    def _position(self, offset: Mapping[str, Any]) -> _Position:
        if offset.get("tableId") not in (None, self._table_id):
            raise ChangeDataFeedError(
                f"The checkpoint of this stream was written for another table (id {offset.get('tableId')}) than the "
                f"one now at `{self._table}` (id {self._table_id}): it was dropped and created again. Start the "
                "stream with a new checkpoint.")
        return _Position(int(offset["version"]), int(offset["index"]), bool(offset["isStartingVersion"]))

    def initialOffset(self) -> dict:
        options = self._options
        if options.starting_version is None and options.starting_timestamp is None:
            if not is_recorded(self._latest_configuration):
                raise not_recorded_error(self._table, self._latest_version(), "latest", self._latest_version())
            # A placeholder: the first batch's end fixes the version (see the module docstring).
            return self._offset(_Position(-1, -1, not options.starting_latest))
        if options.starting_timestamp is not None:
            version = starting_timestamp_version(self._location, options.starting_timestamp)
        else:
            version = options.starting_version  # type: ignore[assignment]
            latest = self._latest_version()
            if version > latest:
                raise ChangeDataFeedError(
                    f"startingVersion {version} is after the latest version of table `{self._table}` ({latest}).")
        if read_commit(self._store(), self._table, version) is None:
            raise self._gone(version)
        if not is_recorded(configuration_at(self._location, version)):
            raise not_recorded_error(self._table, version, "latest", version)
        return self._offset(_Position(version, 0, False))

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest_version()

    def getDefaultReadLimit(self) -> ReadLimit:
        files = self._options.files_limit
        if files is not None:
            return ReadMaxFiles(files)
        return ReadMaxBytes(self._options.max_bytes) if self._options.max_bytes else ReadAllAvailable()

    def _start(self, offset: Mapping[str, Any], end: _Position | None = None) -> _Position | None:
        """Where a batch starting at ``offset`` begins; None for the ``latest`` placeholder
        (its first batch is empty). The snapshot placeholder resolves from ``end`` when given
        (a batch being replanned), else to the newest version now."""
        position = self._position(offset)
        if position.version >= 0:
            return self._normalized(position)
        if not position.snapshot:
            return None
        if end is not None:
            return _Position(end.version, 0, True)
        return _Position(self._target if self._target is not None else self._latest_version(), 0, True)

    def _normalized(self, position: _Position) -> _Position:
        """The end of a snapshot is the start of the next version."""
        if position.snapshot and position.index >= len(self._snapshot_files(position.version)):
            return _Position(position.version + 1, 0, False)
        return position

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = self._start(start)
        if begin is None:  # startingVersion=latest: the changes after the version current now
            latest = self._target if self._target is not None else self._latest_version()
            return self._offset(_Position(latest + 1, 0, False))
        budget = _Budget.of(limit, self._options)
        position, end = begin, begin
        while not budget.exhausted:
            files = self._files_at(position)
            if files is None:
                break
            taken = budget.take(files[position.index:])
            if position.index + taken < len(files):
                end = position._replace(index=position.index + taken)
                break
            if position.snapshot:  # a batch never runs past the snapshot: its end names the version
                end = position._replace(index=len(files))
                break
            position = end = _Position(position.version + 1, 0, False)
        if end == begin or self._normalized(end) == begin:
            return start
        return self._offset(end)

    def _files_at(self, position: _Position) -> tuple[ChangeFile, ...] | None:
        """The change files of the position's version (or snapshot); None when that version is
        not committed yet or lies past the Trigger.AvailableNow target."""
        if position.snapshot:
            return self._snapshot_files(position.version)
        if self._target is not None and position.version > self._target:
            return None
        changes = self._version(position.version)
        return None if changes is None else changes.files

    def partitions(self, start: dict, end: dict) -> Sequence[ChangesPartition]:
        last = self._position(end)
        position = self._start(start, last)
        if position is None or last.version < 0:
            return []
        files: list[ChangeFile] = []
        while (position.version, position.index) < (last.version, last.index):
            available = self._files_at(position)
            if available is None:
                raise ChangeDataFeedError(
                    f"Version {position.version} of table `{self._table}`, within this batch's offsets, is no longer "
                    "readable (its commit is gone from the log). Start the stream with a new checkpoint.")
            same = (position.version, position.snapshot) == (last.version, last.snapshot)
            stop = min(last.index, len(available)) if same else len(available)
            files += available[position.index : stop]
            if stop < len(available):
                break
            position = _Position(position.version + 1, 0, False)
        return _pack(files)

    def commit(self, end: dict) -> None:
        # Versions before the committed offset are never asked for again.
        position = self._position(end)
        for version in [v for v in self._versions if v < position.version]:
            del self._versions[version]
        for version in [v for v in self._snapshots if v < position.version or not position.snapshot]:
            del self._snapshots[version]

    def stop(self) -> None:
        self._versions.clear()
        self._snapshots.clear()

    # -------------------------------------------------------------- driver: versions

    def _gone(self, version: int) -> ChangeDataFeedError:
        oldest = min(list_commits(self._store(), self._table).commits, default=None)
        return ChangeDataFeedError(
            f"The log of table `{self._table}` no longer holds commit {version} (its oldest commit is {oldest}): "
            "commits older than delta.logRetentionDuration are deleted after a checkpoint. Start the stream "
            "with a new checkpoint from a version the log still holds.")

    def _version(self, version: int) -> VersionChanges | None:
        """The version's change files, checked; None when it is not committed yet."""
        cached = self._versions.get(version)
        if cached is not None:
            return cached
        commit = read_commit(self._store(), self._table, version)
        if commit is None:
            if list_commits(self._store(), self._table, version).commits:
                raise self._gone(version)  # later commits exist: this one was cleaned up
            return None
        if commit.metadata is not None:
            self._check_metadata(version, commit.metadata)
        changes = version_changes(commit, self._table, bool(self._partition_columns),
                                  previous_add(self._location, version))
        self._versions[version] = changes
        while len(self._versions) > _CACHED_VERSIONS:
            self._versions.popitem(last=False)
        return changes

    def _check_metadata(self, version: int, metadata: Mapping[str, Any]) -> None:
        if not is_recorded(metadata.get("configuration")):
            raise not_recorded_error(self._table, version, "latest", version)
        if str(metadata.get("id")) != self._table_id:
            raise ChangeDataFeedError(
                f"Version {version} of table `{self._table}` replaced the table (its id changed from {self._table_id} "
                f"to {metadata.get('id')}). Start the stream with a new checkpoint.")
        from streaming_merge.table.schema import delta_json_to_spark

        schema = delta_json_to_spark(metadata["schemaString"])
        partitions = tuple(metadata.get("partitionColumns") or ())
        if _shape(schema) != _shape(self._table_schema) or partitions != self._partition_columns:
            raise ChangeDataSchemaChangedError(
                f"Version {version} of table `{self._table}` changed its schema to {schema.simpleString()} "
                f"(partitioned by {list(partitions)}); this stream reads {self._table_schema.simpleString()} "
                f"(partitioned by {list(self._partition_columns)}). Restart the stream with a new checkpoint and "
                f"startingVersion {version} to read the changes with the new schema.")

    def _snapshot_files(self, version: int) -> tuple[ChangeFile, ...]:
        """Every live file at ``version`` as an insert of that version, ordered by path."""
        cached = self._snapshots.get(version)
        if cached is not None:
            return cached
        commit = read_commit(self._store(), self._table, version)
        if commit is None:
            raise self._gone(version)
        adds = live_adds(self._location.log_uri, self._location.options, version, self._table_id)
        files = []
        for path in sorted(adds):
            add = adds[path]
            vector = add.get("deletionVector")
            stats = add.get("stats")
            records = json.loads(stats).get("numRecords") if isinstance(stats, str) and stats else None
            files.append(ChangeFile(
                path=path, size=int(add["size"]), partition_values=dict(add.get("partitionValues") or {}),
                version=version, timestamp_ms=commit.timestamp_ms, kind="insert",
                selection=RowSelection(DeletionVector.from_json(vector)) if vector else None,
                num_records=None if records is None else int(records)))
        self._snapshots[version] = tuple(files)
        return self._snapshots[version]

    # -------------------------------------------------------------- executors: rows

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ChangesPartition)
        for file in partition.files:
            yield from read_change_file(self._layout, file)


def _pack(files: Sequence[ChangeFile]) -> list[ChangesPartition]:
    """Consecutive files grouped into tasks (see _SLOTS)."""
    target = min(_MAX_PARTITION_BYTES, max(_MIN_PARTITION_BYTES, sum(f.size for f in files) // _SLOTS))
    partitions: list[ChangesPartition] = []
    group: list[ChangeFile] = []
    size = 0
    for file in files:
        if group and size + file.size > target:
            partitions.append(ChangesPartition(tuple(group)))
            group, size = [], 0
        group.append(file)
        size += file.size
    if group:
        partitions.append(ChangesPartition(tuple(group)))
    return partitions


def _shape(data_type: DataType) -> Any:
    """A type without field metadata and nullability: what a schema change is judged by."""
    if isinstance(data_type, StructType):
        return ("struct", tuple((f.name, _shape(f.dataType)) for f in data_type.fields))
    if isinstance(data_type, ArrayType):
        return ("array", _shape(data_type.elementType))
    if isinstance(data_type, MapType):
        return ("map", _shape(data_type.keyType), _shape(data_type.valueType))
    return data_type.simpleString()


class DeltaChangesDataSource(DataSource):
    """``spark.readStream.format("delta_changes")`` after :func:`register`."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> StructType:
        from streaming_merge.table.schema import delta_json_to_spark
        from streaming_merge.table.snapshot import open_table

        location = ChangesOptions.parse(self.options).location()
        return output_schema(delta_json_to_spark(open_table(location).schema().to_json()))

    def streamReader(self, schema: StructType) -> DeltaChangesStreamReader:
        return DeltaChangesStreamReader(ChangesOptions.parse(self.options), schema)


def register(spark: Any) -> str:
    """Register the source with ``spark``; returns its short name for ``format(...)``."""
    register_data_source(spark, DeltaChangesDataSource)
    return SHORT_NAME

