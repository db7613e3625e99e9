"""Commit removes + adds (+ an app transaction, deletion vectors, a protocol or property change)
atomically, as one commit file we write ourselves.

The operation read version V. Before committing we check every commit after V as Delta's
OptimisticTransaction does: no concurrent commit may have removed a file we read or remove
(ConcurrentDeleteRead/DeleteDelete), added one our read predicate could have matched
(ConcurrentAppend), recorded a txn for our app id (ConcurrentTransaction), or changed the
metadata or protocol. The commit is then made at exactly the version after the last one we
checked, with a put-if-absent of ``_delta_log/<version>.json`` (streaming_merge.table.store): if
another commit wins that version, we check again and retry, so no commit can slip in between our
check and our commit. delta-rs' commit API cannot carry a deletion vector, so every commit of an
operation goes through this one writer; delta-rs reads the log and writes the checkpoints.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote

from deltalake.exceptions import CommitFailedError
from deltalake.schema import Schema as RsSchema
from deltalake.transaction import CommitProperties
from pyroaring import BitMap64
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from streaming_merge.errors import CommitOutcomeUnknownError, ConcurrentModificationError, DeltaTableError
from streaming_merge.table.deletion_vectors import DeletionVector, delete_dv_file, write_deletion_vectors
from streaming_merge.table.dv_positions import remember
from streaming_merge.table.location import TableRef
from streaming_merge.table.protocol import Protocol
from streaming_merge.table.schema import spark_to_delta_json
from streaming_merge.table.snapshot import DataFile, Snapshot, advance, load_snapshot, open_table
from streaming_merge.table.store import NOT_FOUND, get_bytes, put_if_absent, table_store
from streaming_merge.table.write import WrittenFile, delete_written, partition_value_string

log = logging.getLogger(__name__)

# Our operation name lives beside delta-rs' own commitInfo keys (it reserves "operation").
OPERATION_KEY = "userOperation"
COMMIT_ID_KEY = "streamingMergeCommitId"
ENGINE_INFO = "streaming_merge/0.1.0"
_CHECKPOINT_INTERVAL = 100
# A deletion vector this small (a few deleted rows: 30-60 bytes) goes inline into the log as Z85
# text instead of into the commit's DV file; a commit whose vectors are all small writes no DV file.
INLINE_DV_MAX_BYTES = 64
# Characters a Delta log path keeps as they are (what Hadoop's Path.toUri leaves unencoded).
_PATH_SAFE = "/-_.!~*'(),;:$&+=@"


@dataclass(frozen=True)
class CommitRequest:
    """Everything one commit writes; ``read_files`` is what the operation read."""

    snapshot: Snapshot
    adds: Sequence[WrittenFile]
    removes: Sequence[DataFile]
    operation: str
    operation_parameters: Mapping[str, Any] = field(default_factory=dict)
    operation_metrics: Mapping[str, Any] = field(default_factory=dict)
    app_id: str | None = None
    app_version: int | None = None
    read_files: Sequence[DataFile] = ()
    new_schema: StructType | None = None
    # Given the files added concurrently, the ones our read predicate could have matched.
    concurrent_append_filter: Callable[[Snapshot, list[DataFile]], list[DataFile]] | None = None
    # False for a rewrite that changes no row (compaction): streaming readers of the table skip it.
    data_change: bool = True
    # Files that stay with a new deletion vector (merged with the one they had): each is removed
    # as it was and added again with the new one.
    deletion_vectors: Sequence[tuple[DataFile, DeletionVector]] = ()
    # A new protocol or new table properties, committed with the data (None: unchanged).
    protocol: Protocol | None = None
    configuration: Mapping[str, str | None] | None = None
    # Called on every commit attempt with the latest snapshot checked, after the checks above and
    # right before the put-if-absent, so it sees every commit ours could be ordered after; it
    # raises ConcurrentModificationError to refuse. For what the table's own log cannot tell:
    # MergeSink checks that no other writer recorded a tombstone its batch missed.
    concurrent_check: Callable[[Snapshot], None] | None = None


_MAX_COMMIT_RACES = 20


def commit(request: CommitRequest) -> int:
    """Commit and return the new table version; raise ``ConcurrentModificationError`` on a
    conflict (nothing of ours is then visible)."""
    snapshot = request.snapshot
    if request.new_schema is not None and request.new_schema != snapshot.schema:
        raise DeltaTableError(
            "A data commit does not change the schema; evolve it with add_columns() first and commit "
            "against the snapshot it returns."
        )
    # dataChange=false (compaction) rewrites the same rows: Delta allows it on append-only tables.
    if ((request.removes or request.deletion_vectors) and request.data_change
            and (snapshot.configuration.get("delta.appendOnly") or "").lower() == "true"):
        raise DeltaTableError(
            f"This table is configured to only allow appends (`{snapshot.table_path}`, "
            f"delta.appendOnly=true); {request.operation} would remove {len(request.removes)} file(s). "
            "If you would like to permit updates or deletes, set delta.appendOnly=false."
        )
    # Asked before the snapshot's log handle moves on to newer versions.
    applied = snapshot.transaction_version(request.app_id) if request.app_id is not None else None
    store = table_store(snapshot.location.log_uri, snapshot.location.options)
    commit_id = uuid.uuid4().hex
    for _ in range(_MAX_COMMIT_RACES):
        checked = _check_concurrent_commits(request, applied)
        if request.concurrent_check is not None:
            request.concurrent_check(checked)
        version = checked.version + 1
        body = _commit_file(request, checked, commit_id)
        path = f"_delta_log/{version:020d}.json"
        try:
            created = put_if_absent(store, path, body)
        except Exception as exc:
            # The put may have landed with its answer lost (a reset or timeout after the store
            # wrote it), or land later: only another writer's commit there says it did not.
            landed = _commit_at(store, path, commit_id)
            if landed == "ours":
                log.warning("The commit of %s to %s at version %d landed although its put failed (%s)",
                            request.operation, snapshot.table_path, version, exc)
                _checkpoint_if_due(checked, version)
                return version
            if landed == "theirs":
                raise DeltaTableError(
                    f"Committing {request.operation} to `{snapshot.table_path}` failed: {exc}") from exc
            raise CommitOutcomeUnknownError(
                f"Committing {request.operation} to `{snapshot.table_path}` at version {version} failed ({exc}) and "
                "the log cannot tell whether the commit landed; its data files are kept (vacuum removes them if it "
                "did not). Rerun the operation: a streaming batch that did commit is skipped as already applied."
            ) from exc
        # "Already exists" can be our own put: the client retried a request whose answer was
        # lost, and the store refused the retry because the first attempt had written it.
        if not created and _commit_at(store, path, commit_id) == "ours":
            log.warning("The commit of %s to %s at version %d landed on a retried put", request.operation,
                        snapshot.table_path, version)
            created = True
        if not created:
            log.info("A commit to %s won version %d; checking it and retrying", snapshot.table_path, version)
            continue
        _checkpoint_if_due(checked, version)
        return version
    raise ConcurrentModificationError(
        f"{_MAX_COMMIT_RACES} concurrent commits to `{snapshot.table_path}` won the race against this "
        f"{request.operation} (read version {snapshot.version}); nothing was committed, rerun it."
    )


def _commit_at(store: Any, path: str, commit_id: str) -> str:
    """Whose commit file is at ``path``: ``ours`` (its commitInfo, the first line, holds
    ``commit_id``), ``theirs``, ``absent``, or ``unknown`` (it could not be read)."""
    try:
        first_line = get_bytes(store, path).split(b"\n", 1)[0]
    except NOT_FOUND:
        return "absent"
    except Exception:
        return "unknown"
    try:
        info = json.loads(first_line).get("commitInfo") or {}
    except ValueError:
        return "theirs"  # a file is there, and not the one we wrote
    return "ours" if info.get(COMMIT_ID_KEY) == commit_id else "theirs"


def _commit_file(request: CommitRequest, latest: Snapshot, commit_id: str) -> bytes:
    """The commit's actions, one JSON object a line (PROTOCOL.md, "Delta Log Entries")."""
    now = int(time.time() * 1000)
    removes_any = bool(request.removes or request.deletion_vectors)
    info: dict[str, Any] = {
        "timestamp": now,
        "operation": request.operation,
        "operationParameters": {k: _text(v) for k, v in request.operation_parameters.items()},
        "readVersion": request.snapshot.version,
        "isolationLevel": "Serializable",
        "isBlindAppend": not removes_any and not request.read_files,
        "operationMetrics": {k: _text(v) for k, v in request.operation_metrics.items()},
        "engineInfo": ENGINE_INFO,
        "txnId": commit_id,
        OPERATION_KEY: request.operation,
        COMMIT_ID_KEY: commit_id,
    }
    actions: list[dict[str, Any]] = [{"commitInfo": info}]
    if request.protocol is not None and request.protocol != Protocol.of(latest.protocol):
        actions.append({"protocol": request.protocol.to_json()})
    if request.configuration is not None and request.configuration != latest.configuration:
        actions.append({"metaData": metadata_action(latest, request.configuration)})
    if request.app_id is not None:
        actions.append({"txn": {"appId": request.app_id, "version": request.app_version, "lastUpdated": now}})
    for removed in request.removes:
        actions.append({"remove": remove_action(removed, now, request.data_change)})
    for kept, vector in request.deletion_vectors:
        actions.append({"remove": remove_action(kept, now, request.data_change)})
        actions.append({"add": readd_action(request.snapshot, kept, vector, request.data_change)})
    for added in request.adds:
        if added.change_data:
            actions.append({"cdc": cdc_action(added)})
        else:
            actions.append({"add": add_action(added, request.data_change)})
    return "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions).encode("utf-8")


def _checkpoint_if_due(snapshot: Snapshot, version: int) -> None:
    """A checkpoint every ``delta.checkpointInterval`` commits (100 by default), written by
    delta-rs, and the expired commits cleaned up; the commit has landed already, so a failure
    here is only logged."""
    try:
        interval = int(snapshot.configuration.get("delta.checkpointInterval") or _CHECKPOINT_INTERVAL)
    except ValueError:
        interval = _CHECKPOINT_INTERVAL
    if interval <= 0 or version % interval != 0:
        return
    try:
        table = open_table(snapshot.location, version)
        table.create_checkpoint()
        # As delta-rs' own post-commit hook did: commits older than delta.logRetentionDuration
        # (30 days) and before the checkpoint go, unless delta.enableExpiredLogCleanup=false.
        if (snapshot.configuration.get("delta.enableExpiredLogCleanup") or "true").strip().lower() != "false":
            table.cleanup_metadata()
    except Exception as exc:
        log.warning("Checkpoint of %s at version %d failed (the commit stands): %s", snapshot.table_path,
                    version, exc)


def commit_with_deletion_vectors(spark: SparkSession, request: CommitRequest,
                                 vectors: Sequence[tuple[DataFile, BitMap64]]) -> int:
    """Write the new deletion vectors (``vectors``: each kept file with all its deleted rows, in
    one DV file) and commit them with ``request``; on any failure the request's new data files
    and the DV file are deleted again, so nothing of the operation lingers. Once committed, the
    vectors' rows are kept in memory (streaming_merge.table.dv_positions): the next batch of a
    stream scans these files, and would otherwise read back what it just wrote."""
    location = request.snapshot.location
    vector_file: str | None = None
    try:
        if vectors:
            stored = write_deletion_vectors(location.log_uri, location.options, [bitmap for _, bitmap in vectors],
                                            inline_max_bytes=INLINE_DV_MAX_BYTES)
            vector_file = stored.file
            request = replace(request, deletion_vectors=[
                (f, d) for (f, _), d in zip(vectors, stored.descriptors, strict=True)])
        version = commit(request)
    except CommitOutcomeUnknownError:
        raise  # a landed commit may reference the files: they stay
    except BaseException:
        delete_written(spark, location, list(request.adds))
        if vector_file is not None:
            delete_dv_file(location.log_uri, location.options, vector_file)
        raise
    if vectors:  # this process's next scans need no read of what it just wrote
        remember(location.log_uri, ((f.path, d, bitmap) for (f, bitmap), (_, d)
                                    in zip(vectors, request.deletion_vectors, strict=True)))
    return version


def add_columns(snapshot: Snapshot, evolved: StructType) -> Snapshot:
    """Append the new top-level columns of ``evolved`` to the table schema.

    delta-rs cannot change the schema inside a data commit, so schema evolution is a
    commit of its own right before the data commit; if another writer commits in
    between, the merge fails with ConcurrentModificationError and the table keeps the
    (all-NULL) new columns, which no reader can tell from an empty evolution.
    """
    known = {f.name for f in snapshot.schema.fields}
    new_fields = StructType([f for f in evolved.fields if f.name not in known])
    table = open_table(snapshot.location, snapshot.version)
    try:
        table.alter.add_columns(
            list(RsSchema.from_json(spark_to_delta_json(new_fields)).fields),
            commit_properties=CommitProperties(
                custom_metadata={OPERATION_KEY: "ADD COLUMNS (MERGE schema evolution)"}
            ),
        )
    except CommitFailedError as exc:
        raise ConcurrentModificationError(
            f"Adding columns {new_fields.fieldNames()} to `{snapshot.table_path}` conflicted with a "
            f"concurrent commit: {exc}"
        ) from exc
    evolved_snapshot = load_snapshot(snapshot.location)
    if evolved_snapshot.version != snapshot.version + 1:
        raise ConcurrentModificationError(
            f"A concurrent commit to `{snapshot.table_path}` landed while this MERGE evolved its schema "
            f"(expected version {snapshot.version + 1}, found {evolved_snapshot.version}); rerun the MERGE."
        )
    return evolved_snapshot


def _check_concurrent_commits(request: CommitRequest, applied_at_read: int | None) -> Snapshot:
    """Check every commit after the read version; return the latest snapshot checked.

    Only the commits after the read version are read (the snapshot's log handle is brought
    up to date), so a commit costs no second load of the whole log.
    """
    snapshot = request.snapshot
    latest = advance(snapshot)
    if latest.version == snapshot.version:
        return latest
    versions = f"versions {snapshot.version + 1}..{latest.version}"
    if request.app_id is not None:
        applied = latest.transaction_version(request.app_id)
        if applied != applied_at_read:
            raise ConcurrentModificationError(
                f"A concurrent commit ({versions}) recorded transaction {request.app_id!r} version "
                f"{applied} in `{snapshot.table_path}` while this one (version {request.app_version}) ran; "
                "rerun it (a batch already applied is then skipped)."
            )
    if (latest.schema != snapshot.schema or latest.partition_columns != snapshot.partition_columns
            or latest.configuration != snapshot.configuration
            or latest.protocol != snapshot.protocol):
        raise ConcurrentModificationError(
            f"The metadata or protocol of `{snapshot.table_path}` changed in {versions}; "
            f"rerun the {request.operation}."
        )
    # A file is a path and its deletion vector: one that got a new vector concurrently is gone too.
    live = {f.key for f in latest.files}
    kept = [f for f, _ in request.deletion_vectors]
    gone = sorted({f.path for f in [*request.read_files, *request.removes, *kept] if f.key not in live})
    if gone:
        raise ConcurrentModificationError(
            f"A concurrent commit ({versions}) removed files this {request.operation} read from "
            f"`{snapshot.table_path}`: {gone[:5]}. Nothing was committed; rerun the operation."
        )
    before = {f.key for f in snapshot.files}
    appended = [f for f in latest.files if f.key not in before]
    if appended and request.concurrent_append_filter is not None:
        relevant = request.concurrent_append_filter(latest, appended)
        if relevant:
            raise ConcurrentModificationError(
                f"A concurrent commit ({versions}) added files to `{snapshot.table_path}` that this "
                f"{request.operation} could have matched: {[f.path for f in relevant[:5]]}. Nothing was "
                "committed; rerun the operation."
            )
    return latest


def log_path(relative: str) -> str:
    """A file's path as the log spells it: URL-encoded, as Delta writes it and readers decode it."""
    return quote(relative, safe=_PATH_SAFE)


def add_action(added: WrittenFile, data_change: bool) -> dict[str, Any]:
    return {"path": log_path(added.path), "partitionValues": dict(added.partition_values), "size": added.size,
            "modificationTime": added.modification_time, "dataChange": data_change, "stats": added.stats}


def cdc_action(added: WrittenFile) -> dict[str, Any]:
    """A change data file: never a data change itself (PROTOCOL.md, "Add CDC File")."""
    return {"path": log_path(added.path), "partitionValues": dict(added.partition_values), "size": added.size,
            "dataChange": False}


def remove_action(removed: DataFile, now: int, data_change: bool) -> dict[str, Any]:
    """The ``remove`` of a live file: with its deletion vector, which is part of what identifies it."""
    action: dict[str, Any] = {
        "path": log_path(removed.path), "deletionTimestamp": now, "dataChange": data_change,
        "extendedFileMetadata": True,
        "partitionValues": {k: partition_value_string(v) for k, v in removed.partition_values.items()},
        "size": removed.size,
    }
    if removed.deletion_vector is not None:
        action["deletionVector"] = removed.deletion_vector.to_json()
    return action


def readd_action(snapshot: Snapshot, kept: DataFile, vector: DeletionVector, data_change: bool) -> dict[str, Any]:
    """The ``add`` of a file that stays with a new deletion vector: its own add action as the log
    has it, the new vector, and stats marked as no longer tight (Delta keeps the physical
    ``numRecords`` and the min/max of every row, deleted or not, which still bound the rest)."""
    action = dict(snapshot.log_add(kept.path))
    action["dataChange"] = data_change
    action["deletionVector"] = vector.to_json()
    stats = action.get("stats")
    if stats:
        parsed = json.loads(stats)
        parsed["tightBounds"] = False
        action["stats"] = json.dumps(parsed, separators=(",", ":"))
    action.pop("baseRowId", None)
    action.pop("defaultRowCommitVersion", None)
    return action


def metadata_action(snapshot: Snapshot, configuration: Mapping[str, str | None]) -> dict[str, Any]:
    """The table's ``metaData`` with new properties (same id, schema and partitioning)."""
    metadata = snapshot._table.metadata()
    return {
        "id": metadata.id,
        "name": metadata.name,
        "description": metadata.description,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": spark_to_delta_json(snapshot.schema),
        "partitionColumns": list(snapshot.partition_columns),
        "configuration": {k: v for k, v in configuration.items() if v is not None},
        "createdTime": metadata.created_time,
    }


def _text(value: Any) -> str:
    """Delta stores commitInfo parameters and metrics as strings."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def history(table_path: TableRef, limit: int | None = None) -> list[dict[str, Any]]:
    """Commit history, newest first: the log's operation names (Delta's), ours in place of delta-rs' WRITE."""
    table = open_table(table_path)
    entries = table.history(limit=limit)
    if not entries and table.version() >= 0:
        raise DeltaTableError(
            f"delta-rs returned no commit history for `{table_path}` although the table is at version "
            f"{table.version()}: delta-rs (1.x) cannot list the history of a table whose path contains `#`. "
            "Reading and writing the table work; move it to a path without `#` to read its history."
        )
    result = []
    for entry in entries:
        entry = dict(entry)
        # The log's operation is what Delta Lake's DESCRIBE HISTORY shows; ours stands in only
        # for delta-rs' generic WRITE.
        user_operation = entry.pop(OPERATION_KEY, None)
        if user_operation is not None and entry.get("operation") in (None, "WRITE"):
            entry["operation"] = user_operation
        entry.pop(COMMIT_ID_KEY, None)
        result.append(entry)
    return result
