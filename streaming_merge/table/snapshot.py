"""A Delta table at one version: files, per-file stats, partition values, schema.

Everything comes from delta-rs; a snapshot is immutable so every phase of a MERGE
reads the same version, as Delta's OptimisticTransaction does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable as _RsTable
from deltalake.exceptions import TableNotFoundError
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from streaming_merge.errors import DeltaTableError, NotADeltaTableError, UnsupportedTableFeatureError
from streaming_merge.spark.profile import count_log_load
from streaming_merge.table.deletion_vectors import DeletionVector
from streaming_merge.table.dv_log import live_adds
from streaming_merge.table.location import TableLocation, TableRef, resolve
from streaming_merge.table.protocol import SUPPORTED_READER_FEATURES, SUPPORTED_WRITER_FEATURES, Protocol, is_enabled
from streaming_merge.table.schema import delta_json_to_spark

_MAX_READER_VERSION = 3
_MAX_WRITER_VERSION = 7


@dataclass(frozen=True)
class DataFile:
    """One live file of the table (an ``add`` action)."""

    path: str  # relative to the table root, decoded (as on disk)
    size: int
    num_records: int | None
    partition_values: dict[str, Any]  # typed values (None for NULL)
    # The rows of the file that are deleted (Delta's deletion vector), or None.
    deletion_vector: DeletionVector | None = None

    @property
    def key(self) -> tuple[str, str | None]:
        """What identifies the file in the log: its path and its deletion vector's id."""
        return self.path, self.deletion_vector.unique_id if self.deletion_vector is not None else None

    @property
    def deleted_rows(self) -> int:
        return self.deletion_vector.cardinality if self.deletion_vector is not None else 0

    @property
    def live_records(self) -> int | None:
        """The rows a reader sees: the physical ``num_records`` less those its deletion vector
        deletes (Delta's stats keep the physical count)."""
        return None if self.num_records is None else self.num_records - self.deleted_rows


@dataclass(frozen=True)
class Snapshot:
    """The table at ``version``; ``stats`` is delta-rs' flattened add-action table.

    ``_table`` is the delta-rs handle it was read from. ``advance`` moves that handle on to
    the latest version (reading only the newer commits) for the commit's conflict check, so
    everything a snapshot answers is captured at load time, except ``transaction_version``,
    which is asked before the handle moves.
    """

    location: TableLocation
    version: int
    schema: StructType
    partition_columns: list[str]
    files: list[DataFile]
    stats: pa.Table
    configuration: dict[str, str | None]
    protocol: Any
    _table: _RsTable
    # "moved": the log handle was advanced past ``version``; txn lookups are cached here.
    _state: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def table_path(self) -> str:
        """The table root as Spark names it (Hadoop-qualified)."""
        return self.location.uri

    @property
    def num_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def transaction_version(self, app_id: str) -> int | None:
        """Latest ``txn`` version recorded for ``app_id`` at this snapshot."""
        key = f"txn:{app_id}"
        if key not in self._state:
            table = open_table(self.location, self.version) if self._state.get("moved") else self._table
            self._state[key] = table.transaction_version(app_id)
        return self._state[key]

    def absolute_path(self, relative: str) -> str:
        return self.location.join(relative)

    @property
    def has_deletion_vectors(self) -> bool:
        """Whether the table's protocol has deletion vectors (files may carry them)."""
        return Protocol.of(self.protocol).has_deletion_vectors

    @property
    def writes_deletion_vectors(self) -> bool:
        """Whether operations mark deleted rows in deletion vectors instead of rewriting files
        (the feature in the protocol and ``delta.enableDeletionVectors=true``)."""
        return self.has_deletion_vectors and is_enabled(self.configuration, "delta.enableDeletionVectors")

    def log_adds(self) -> dict[str, dict[str, Any]]:
        """Every live file's ``add`` action as the log holds it, by path (tables with deletion
        vectors only: the others' logs are not replayed, and this is empty)."""
        return dict(self._state.get("log_adds") or {})

    def log_add(self, path: str) -> dict[str, Any]:
        """The live ``add`` action of ``path`` as the log holds it (only for tables with deletion
        vectors, whose log we replay for the vectors delta-rs does not return)."""
        adds = self._state.get("log_adds")
        if adds is None or path not in adds:
            raise DeltaTableError(f"No live add action of `{path}` in `{self.table_path}` at version {self.version}")
        return adds[path]


def file_rows(snapshot: Snapshot | None) -> list[int | None]:
    """Each live file's record count (None where the log has none); none without a snapshot."""
    return [f.num_records for f in snapshot.files] if snapshot is not None else []


def require_table(path: TableRef) -> None:
    """Raise ``NotADeltaTableError`` naming ``path`` when no Delta log is there, without
    loading the log (the MERGE loads it once, when it takes its snapshot)."""
    if not table_exists(path):
        raise NotADeltaTableError(f"`{path}` is not a Delta table: no transaction log was found there.")


def table_exists(path: TableRef) -> bool:
    """Whether a Delta log with a commit is at ``path`` (a listing of the log folder, no load)."""
    location = resolve(path)
    try:
        return bool(_RsTable.is_deltatable(location.log_uri, storage_options=location.options))
    except Exception as exc:
        raise DeltaTableError(f"Cannot check for a Delta table at `{location}`: {exc}") from exc


def open_table(path: TableRef, version: int | None = None) -> _RsTable:
    """delta-rs handle on ``path``; raises ``NotADeltaTableError`` with the path when absent."""
    count_log_load()
    path = resolve(path)
    try:
        return _RsTable(path.log_uri, version=version, storage_options=path.options)
    except TableNotFoundError as exc:
        raise NotADeltaTableError(
            f"`{path}` is not a Delta table: no transaction log was found there."
        ) from exc
    except Exception as exc:  # delta-rs raises bare DeltaError for many log problems
        if "Unsupported" in str(exc):  # delta-kernel refuses a newer protocol or an unknown feature
            raise UnsupportedTableFeatureError(
                f"Table `{path}` uses a protocol version or table feature that streaming_merge (through "
                f"delta-rs) cannot read or write: {exc}. Refusing to touch it."
            ) from exc
        raise DeltaTableError(f"Cannot read the Delta log of `{path}` (version {version}): {exc}") from exc


def load_snapshot(path: TableRef, version: int | None = None) -> Snapshot:
    """Snapshot of the table at ``version`` (latest when None)."""
    location = resolve(path)
    return _snapshot_of(location, open_table(location, version))


def advance(snapshot: Snapshot) -> Snapshot:
    """The latest snapshot of the table, read by applying only the commits after
    ``snapshot.version`` to its log handle (no second log load)."""
    table = snapshot._table
    count_log_load(incremental=True)
    try:
        table.update_incremental()
        snapshot._state["moved"] = True
    except Exception as exc:
        raise DeltaTableError(f"Cannot read the new commits of `{snapshot.table_path}`: {exc}") from exc
    if table.version() == snapshot.version:
        snapshot._state.pop("moved")
        return snapshot
    return _snapshot_of(snapshot.location, table)


def commits_down_to(snapshot: Snapshot, version: int) -> dict[int, dict[str, Any]]:
    """The ``commitInfo`` of every commit from ``snapshot.version`` down to ``version``, by
    version, read from the log's files (not from the handle's memory): what identifies a
    commit, so a follower can tell that the log it advanced is still the one it read."""
    try:
        entries = snapshot._table.history(snapshot.version - version + 1)
    except Exception as exc:
        raise DeltaTableError(f"Cannot read the commit history of `{snapshot.table_path}`: {exc}") from exc
    return {int(entry["version"]): entry for entry in entries if "version" in entry}


def _snapshot_of(location: TableLocation, table: _RsTable) -> Snapshot:
    metadata = table.metadata()
    schema = delta_json_to_spark(table.schema().to_json())
    partition_columns = list(metadata.partition_columns)
    stats = pa.table(table.get_add_actions(flatten=True))
    files = _data_files(stats, partition_columns)
    protocol = table.protocol()
    state: dict[str, Any] = {}
    if Protocol.of(protocol).has_deletion_vectors:
        # delta-rs returns no deletion-vector descriptors: they come from the log itself.
        adds = live_adds(location.log_uri, location.options, table.version(), str(metadata.id))
        state["log_adds"] = adds
        files = [_with_deletion_vector(f, adds.get(f.path), location) for f in files]
    return Snapshot(
        location=location,
        version=table.version(),
        schema=schema,
        partition_columns=partition_columns,
        files=files,
        stats=stats,
        configuration=dict(metadata.configuration),
        protocol=protocol,
        _table=table,
        _state=state,
    )


def _with_deletion_vector(file: DataFile, add: dict[str, Any] | None, location: TableLocation) -> DataFile:
    if add is None:
        raise DeltaTableError(f"The log of `{location}` names `{file.path}` as live but its add action was not found "
                              "when reading its deletion vectors.")
    vector = add.get("deletionVector")
    return replace(file, deletion_vector=DeletionVector.from_json(vector)) if vector else file


def _data_files(stats: pa.Table, partition_columns: list[str]) -> list[DataFile]:
    columns = ["path", "size_bytes", "num_records"] + [f"partition.{c}" for c in partition_columns]
    rows = stats.select([c for c in columns if c in stats.column_names]).to_pylist()
    return [
        DataFile(
            path=unquote(row["path"]),  # the log holds URL-encoded paths
            size=row["size_bytes"],
            num_records=row.get("num_records"),
            partition_values={c: row.get(f"partition.{c}") for c in partition_columns},
        )
        for row in rows
    ]


def check_readable(snapshot: Snapshot) -> None:
    """Refuse to read a table whose files we would misread: with column mapping, the files name
    their columns by physical names (``col-<uuid>``), so reading them by logical name gives NULLs."""
    mode = (snapshot.configuration.get("delta.columnMapping.mode") or "none").lower()
    if mode != "none":
        raise UnsupportedTableFeatureError(
            f"Table `{snapshot.table_path}` uses column mapping (delta.columnMapping.mode={mode}): its data files "
            "name columns by physical names, which streaming_merge does not read. Read it with Delta Lake "
            "(delta-spark) or delta-rs."
        )


def check_writable(snapshot: Snapshot) -> None:
    """Refuse, before anything is written, a table whose features we cannot keep correct."""
    protocol = snapshot.protocol
    path = snapshot.table_path
    if protocol.min_reader_version > _MAX_READER_VERSION or protocol.min_writer_version > _MAX_WRITER_VERSION:
        raise UnsupportedTableFeatureError(
            f"Table `{path}` requires reader version {protocol.min_reader_version} / writer version "
            f"{protocol.min_writer_version}; streaming_merge supports up to {_MAX_READER_VERSION}/"
            f"{_MAX_WRITER_VERSION}."
        )
    unsupported = sorted(
        set(protocol.reader_features or ()) - SUPPORTED_READER_FEATURES
        | set(protocol.writer_features or ()) - SUPPORTED_WRITER_FEATURES
    )
    if unsupported:
        raise UnsupportedTableFeatureError(
            f"Table `{path}` uses table features {unsupported}, which streaming_merge cannot keep "
            "correct (it would ignore deletion vectors, column mapping, change data feed, constraints...). "
            "Refusing to write."
        )
    config = snapshot.configuration
    if is_enabled(config, "delta.enableDeletionVectors") and not snapshot.has_deletion_vectors:
        raise UnsupportedTableFeatureError(
            f"Table `{path}` sets delta.enableDeletionVectors=true but its protocol (reader "
            f"{protocol.min_reader_version} / writer {protocol.min_writer_version}) lacks the deletionVectors "
            "feature; upgrade it with DeltaTable.enableDeletionVectors() first."
        )
    if is_enabled(config, "delta.enableChangeDataFeed") and not Protocol.of(protocol).has_change_data_feed:
        raise UnsupportedTableFeatureError(
            f"Table `{path}` sets delta.enableChangeDataFeed=true but its protocol (reader "
            f"{protocol.min_reader_version} / writer {protocol.min_writer_version}) cannot record change data; "
            "upgrade it with DeltaTable.setProperties({'delta.enableChangeDataFeed': 'true'}) first."
        )
    variants = [name for name, column in _fields(snapshot.schema, "") if column.dataType.typeName() == "variant"]
    if variants:
        raise UnsupportedTableFeatureError(
            f"Table `{path}` has VARIANT columns {variants}, which streaming_merge does not write; refusing to write."
        )
    if (config.get("delta.columnMapping.mode") or "none").lower() != "none":
        raise UnsupportedTableFeatureError(
            f"Table `{path}` uses column mapping (delta.columnMapping.mode="
            f"{config.get('delta.columnMapping.mode')}); streaming_merge writes physical names "
            "equal to logical names and refuses to write."
        )
    constraints = sorted(k for k in config if k.startswith("delta.constraints."))
    if constraints:
        raise UnsupportedTableFeatureError(
            f"Table `{path}` has CHECK constraints {constraints}, which streaming_merge does not enforce; "
            "refusing to write."
        )
    for name, column in _fields(snapshot.schema, ""):
        special = _ENFORCED_FIELD_METADATA & set(column.metadata or {})
        if special:
            raise UnsupportedTableFeatureError(
                f"Column `{name}` of table `{path}` carries {sorted(special)}, which streaming_merge "
                "does not enforce; refusing to write."
            )


_ENFORCED_FIELD_METADATA = frozenset(
    {"delta.generationExpression", "delta.identity.start", "delta.invariants"}
)


def _fields(data_type: DataType, prefix: str) -> Iterator[tuple[str, StructField]]:
    """(dotted name, field) of every field, nested ones included: Delta allows invariants on
    fields inside structs, arrays and maps, and a VARIANT may sit anywhere."""
    if isinstance(data_type, StructType):
        for child in data_type.fields:
            name = f"{prefix}{child.name}"
            yield name, child
            yield from _fields(child.dataType, f"{name}.")
    elif isinstance(data_type, ArrayType):
        yield from _fields(data_type.elementType, f"{prefix}element.")
    elif isinstance(data_type, MapType):
        yield from _fields(data_type.keyType, f"{prefix}key.")
        yield from _fields(data_type.valueType, f"{prefix}value.")
