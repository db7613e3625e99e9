"""Commit removes + adds (+ an app transaction) atomically through delta-rs.

The operation read version V. Before committing we check every commit after V as Delta's
OptimisticTransaction does: no concurrent commit may have removed a file we read or remove
(ConcurrentDeleteRead/DeleteDelete), added one our read predicate could have matched
(ConcurrentAppend), recorded a txn for our app id (ConcurrentTransaction), or changed the
metadata or protocol. The commit is then made at exactly the version after the last one we
checked (delta-rs with ``max_commit_retries=0``): if another commit wins that version, we
check again and retry, so no commit can slip in between our check and our commit.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.schema import Schema as RsSchema
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction
from pyspark.sql.types import StructType

from streaming_merge.errors import ConcurrentModificationError, DeltaTableError
from streaming_merge.table.location import TableRef
from streaming_merge.table.schema import spark_to_delta_json
from streaming_merge.table.snapshot import DataFile, Snapshot, advance, load_snapshot, open_table
from streaming_merge.table.write import WrittenFile, partition_value_string

log = logging.getLogger(__name__)

# Our operation name lives beside delta-rs' own commitInfo keys (it reserves "operation").
OPERATION_KEY = "userOperation"
COMMIT_ID_KEY = "streamingMergeCommitId"


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


_MAX_COMMIT_RACES = 20


def commit(request: CommitRequest) -> int:
    """Commit and return the new table version; raise ``ConcurrentModificationError`` on a
    conflict (nothing of ours is then visible)."""
    snapshot = request.snapshot
    if request.new_schema is not None and request.new_schema != snapshot.schema:
        raise DeltaTableError(
            "delta-rs ignores a schema change inside an append commit; evolve the schema with "
            "add_columns() first and commit against the snapshot it returns."
        )
    # dataChange=false (compaction) rewrites the same rows: Delta allows it on append-only tables.
    if (request.removes and request.data_change
            and (snapshot.configuration.get("delta.appendOnly") or "").lower() == "true"):
        raise DeltaTableError(
            f"This table is configured to only allow appends (`{snapshot.table_path}`, "
            f"delta.appendOnly=true); {request.operation} would remove {len(request.removes)} file(s). "
            "If you would like to permit updates or deletes, set delta.appendOnly=false."
        )
    now = int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = [
        RemoveAction(f.path, request.data_change, now, f.size,
                     {k: partition_value_string(v) for k, v in f.partition_values.items()})
        for f in request.removes
    ]
    actions += [
        AddAction(w.path, w.size, w.partition_values, w.modification_time, request.data_change, w.stats)
        for w in request.adds
    ]
    transactions = (
        [Transaction(request.app_id, request.app_version)] if request.app_id is not None else None
    )
    custom = {
        OPERATION_KEY: request.operation,
        COMMIT_ID_KEY: uuid.uuid4().hex,
        "operationParameters": {k: _text(v) for k, v in request.operation_parameters.items()},
        "operationMetrics": {k: _text(v) for k, v in request.operation_metrics.items()},
    }
    schema = RsSchema.from_json(spark_to_delta_json(snapshot.schema))
    # Asked before the snapshot's log handle moves on to newer versions.
    applied = snapshot.transaction_version(request.app_id) if request.app_id is not None else None
    for _ in range(_MAX_COMMIT_RACES):
        checked = _check_concurrent_commits(request, applied)
        try:
            checked._table.create_write_transaction(
                actions,
                mode="append",
                schema=schema,
                partition_by=snapshot.partition_columns or None,
                commit_properties=CommitProperties(
                    custom_metadata=custom, app_transactions=transactions, max_commit_retries=0
                ),
            )
        except CommitFailedError as exc:
            if advance(checked).version > checked.version:
                log.info("A commit to %s won version %d; checking it and retrying",
                         snapshot.table_path, checked.version + 1)
                continue
            raise DeltaTableError(
                f"Committing {request.operation} to `{snapshot.table_path}` failed: {exc}"
            ) from exc
        except DeltaError as exc:
            raise DeltaTableError(
                f"Committing {request.operation} to `{snapshot.table_path}` failed: {exc}"
            ) from exc
        return checked.version + 1
    raise ConcurrentModificationError(
        f"{_MAX_COMMIT_RACES} concurrent commits to `{snapshot.table_path}` won the race against this "
        f"{request.operation} (read version {snapshot.version}); nothing was committed, rerun it."
    )


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
    live = {f.path for f in latest.files}
    gone = sorted({f.path for f in [*request.read_files, *request.removes] if f.path not in live})
    if gone:
        raise ConcurrentModificationError(
            f"A concurrent commit ({versions}) removed files this {request.operation} read from "
            f"`{snapshot.table_path}`: {gone[:5]}. Nothing was committed; rerun the operation."
        )
    before = {f.path for f in snapshot.files}
    appended = [f for f in latest.files if f.path not in before]
    if appended and request.concurrent_append_filter is not None:
        relevant = request.concurrent_append_filter(latest, appended)
        if relevant:
            raise ConcurrentModificationError(
                f"A concurrent commit ({versions}) added files to `{snapshot.table_path}` that this "
                f"{request.operation} could have matched: {[f.path for f in relevant[:5]]}. Nothing was "
                "committed; rerun the operation."
            )
    return latest


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
    """Commit history, newest first, with our operation name in place of delta-rs' WRITE."""
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
        if OPERATION_KEY in entry:
            entry["operation"] = entry.pop(OPERATION_KEY)
        entry.pop(COMMIT_ID_KEY, None)
        result.append(entry)
    return result
