"""Table properties changed in a commit of their own (``ALTER TABLE ... SET TBLPROPERTIES``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from streaming_merge.errors import DeltaTableError
from streaming_merge.table.commit import CommitRequest, commit
from streaming_merge.table.location import TableRef
from streaming_merge.table.protocol import Protocol
from streaming_merge.table.snapshot import check_writable, load_snapshot

_REFUSED = {
    "delta.columnMapping.mode": "column mapping",
    "delta.enableRowTracking": "row tracking",
    "delta.enableTypeWidening": "type widening",
}


def set_properties(path: TableRef, properties: Mapping[str, str | None]) -> int:
    """Commit the table's properties with ``properties`` applied (None removes one) and the
    protocol they need (deletion vectors: reader 3 / writer 7 with ``deletionVectors``; change
    data feed: writer 4, or the ``changeDataFeed`` feature); returns the new version. A property
    for a feature we cannot keep correct is refused before anything is written."""
    for key, value in properties.items():
        if key in _REFUSED and value is not None and value.strip().lower() not in ("false", "none"):
            raise DeltaTableError(f"Setting {key}={value} would turn on {_REFUSED[key]}, which streaming_merge "
                                  "cannot keep correct; nothing was written.")
        if value is not None and not isinstance(value, str):
            raise DeltaTableError(f"Table property {key} must be a string, got {value!r}")
    snapshot = load_snapshot(path)
    configuration: dict[str, str | None] = {k: v for k, v in snapshot.configuration.items() if v is not None}
    for key, value in properties.items():
        if value is None:
            configuration.pop(key, None)
        else:
            configuration[key] = value
    protocol = Protocol.of(snapshot.protocol).required_by(configuration)
    check_writable(replace(snapshot, protocol=protocol, configuration=configuration))
    return commit(CommitRequest(snapshot=snapshot, adds=[], removes=[], operation="SET TBLPROPERTIES",
                                operation_parameters={"properties": dict(properties)},
                                protocol=protocol, configuration=configuration, data_change=False))
