"""Reference model of partial CDC updates (``ignore_null_updates``, per column with
``ignore_null_updates_column_list`` / ``..._except_column_list``, ``unavailable_value``),
written from the documented rule, independently of the sink's Spark plan.

Per batch and key: the events are ordered by sequence (ties: batch order); those not newer
than the key's state at the start of the batch (its row's sequence, else its newest
tombstone) are dropped; the rest apply one after the other: a delete removes the row, an
upsert sets every column it carries a value for (NULL, or the placeholder in a string
column, means "unchanged") and starts from nothing when the row is absent. A batch whose
newest event is a delete records a tombstone at its sequence.

A NULL sequence is older than every value: such an event sorts first among its key's events,
and applies only where the key's state has no sequence either (no row and no tombstone, or a
row whose own sequence is NULL); a delete with a NULL sequence records no tombstone.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

Event = dict[str, Any]


def presence(ignore_nulls: bool | Collection[str], placeholder: str | None) -> Callable[[str, Any], bool]:
    """``present(column, value)``: the event carries a value for the column. ``ignore_nulls``:
    True (a NULL means "unchanged" in every column, ``ignore_null_updates``) or the columns
    where it does (``ignore_null_updates_column_list``, or the complement of an except list)."""
    def present(column: str, value: Any) -> bool:
        if value is None:
            return not (ignore_nulls is True or (not isinstance(ignore_nulls, bool) and column in ignore_nulls))
        return not (placeholder is not None and isinstance(value, str) and value == placeholder)

    return present


def apply_batches(batches: list[list[Event]], *, data_columns: list[str], ignore_nulls: bool | Collection[str],
                  placeholder: str | None) -> dict[Any, Event]:
    rows: dict[Any, Event] = {}
    tombstones: dict[Any, Any] = {}
    is_present = presence(ignore_nulls, placeholder)

    for batch in batches:
        by_key: dict[Any, list[Event]] = {}
        for event in batch:
            if event["id"] is not None:
                by_key.setdefault(event["id"], []).append(event)
        for key, events in by_key.items():
            ordered = sorted(events, key=_sequence_order)  # stable: ties keep batch order
            row = rows.get(key)
            base = row["lsn"] if row is not None else tombstones.get(key)
            state = dict(row) if row is not None else None
            for event in ordered:
                if base is not None and (event["lsn"] is None or not event["lsn"] > base):
                    continue
                if event["op"] == "d":
                    state = None
                    continue
                previous = state or {}
                state = {"id": key, "lsn": event["lsn"]}
                for column in data_columns:
                    state[column] = event[column] if is_present(column, event[column]) else previous.get(column)
            if ordered[-1]["op"] == "d" and ordered[-1]["lsn"] is not None:
                tombstones[key] = max(tombstones.get(key, ordered[-1]["lsn"]), ordered[-1]["lsn"])
            if state is None:
                rows.pop(key, None)
            else:
                rows[key] = state
    return rows


def _sequence_order(event: Event) -> tuple[bool, Any]:
    """NULL sequences first, then by value."""
    return (event["lsn"] is not None, event["lsn"] if event["lsn"] is not None else 0)
