"""Reference models of SCD type 2 and of truncates in SCD type 1, written from the rules in
the README ("SCD type 2", "Truncates"), independently of the sink's Spark plans.

Events are dicts with ``id`` (None for a truncate), ``lsn`` (the sequence), ``op`` ('c',
'u', 'd' or 't') and data columns. Within a batch, events of one (id, lsn) collapse to the
last in batch order.

Partial updates in SCD 2 (``present``, see ``tests/partial_model.presence``): an upsert that
carries no value for a column takes the value of the key's event before it in sequence order,
back to its last delete or truncate (none: NULL), before its tracked columns are compared. A
table row carries full values (it was filled when it was written).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Event = dict[str, Any]
Row = dict[str, Any]
START, END = "__START_AT", "__END_AT"


def _last_per_position(batch: list[Event]) -> list[Event]:
    kept: dict[tuple[Any, Any], Event] = {}
    for event in batch:
        if event["op"] != "t":
            kept[(event["id"], event["lsn"])] = event
    return list(kept.values())


Present = Callable[[str, Any], bool]


def fold(events: list[tuple[Any, bool, Event | None]], tracked: list[str], untracked: list[str],
         present: Present | None = None) -> list[Row]:
    """The history of one key from its events ``(lsn, is_delete, event)``, one per lsn; with
    ``present``, the values an upsert leaves out are carried from the events before it."""
    rows: list[Row] = []
    open_row: Row | None = None
    carried: dict[str, Any] = {}
    for lsn, is_delete, event in sorted(events, key=lambda e: e[0]):
        if is_delete:
            if open_row is not None:
                open_row[END] = lsn
            open_row = None
            carried = {}
            continue
        assert event is not None
        if present is not None:
            from_table = START in event
            event = {**event, **{c: event[c] if from_table or present(c, event[c]) else carried.get(c)
                                 for c in [*tracked, *untracked]}}
            carried = {c: event[c] for c in [*tracked, *untracked]}
        if open_row is not None and all(open_row[c] == event[c] for c in tracked):
            open_row.update({c: event[c] for c in untracked})
            continue
        if open_row is not None:
            open_row[END] = lsn
        open_row = {"id": event["id"], **{c: event[c] for c in [*tracked, *untracked]}, START: lsn, END: None}
        rows.append(open_row)
    return rows


class Scd2Model:
    """The table after each batch: per key, the rows; plus the recorded tombstones and truncates."""

    def __init__(self, tracked: list[str], untracked: list[str], present: Present | None = None) -> None:
        self.tracked, self.untracked, self.present = tracked, untracked, present
        self.rows: dict[Any, list[Row]] = {}
        self.tombstones: dict[Any, set[Any]] = {}
        self.truncates: set[Any] = set()

    def apply(self, batch: list[Event]) -> None:
        batch_truncates = {e["lsn"] for e in batch if e["op"] == "t"}
        truncates = self.truncates | batch_truncates
        events = _last_per_position(batch)
        for key in {e["id"] for e in events}:
            # priority at one lsn: delete (3) > batch upsert (2) > table row (1)
            by_lsn: dict[Any, tuple[int, bool, Event | None]] = {}

            def offer(lsn: Any, priority: int, is_delete: bool, event: Event | None,
                      by_lsn: dict[Any, tuple[int, bool, Event | None]] = by_lsn) -> None:
                if lsn not in by_lsn or by_lsn[lsn][0] < priority:
                    by_lsn[lsn] = (priority, is_delete, event)

            current = self.rows.get(key, [])
            starts = {r[START] for r in current}
            for row in current:
                offer(row[START], 1, False, row)
                if row[END] is not None and row[END] not in starts:
                    offer(row[END], 3, True, None)
            for lsn in self.tombstones.get(key, set()) | truncates:
                offer(lsn, 3, True, None)
            for event in events:
                if event["id"] == key:
                    deleted = event["op"] == "d"
                    offer(event["lsn"], 3 if deleted else 2, deleted, None if deleted else event)
            history = fold([(lsn, d, e) for lsn, (_, d, e) in by_lsn.items()], self.tracked, self.untracked,
                           self.present)
            if history:
                self.rows[key] = history
            else:
                self.rows.pop(key, None)
        batch_keys = {e["id"] for e in events}
        for key, rows in list(self.rows.items()):
            if key in batch_keys:
                continue
            # a truncate at a version's own start wins the tie, as in a rebuilt history: the
            # upsert that opened it is undone (the version before it already ends there)
            rows[:] = [row for row in rows if row[START] not in batch_truncates]
            if not rows:
                del self.rows[key]
                continue
            for row in rows:
                spans = [t for t in sorted(batch_truncates)
                         if row[START] < t and (row[END] is None or row[END] > t)]
                if spans:
                    row[END] = spans[0]
        for event in events:
            if event["op"] == "d":
                self.tombstones.setdefault(event["id"], set()).add(event["lsn"])
        self.truncates = truncates

    def table(self) -> list[Row]:
        return sorted((r for rows in self.rows.values() for r in rows), key=lambda r: (r["id"], r[START]))


def full_history(events: list[Event], tracked: list[str], untracked: list[str]) -> list[Row]:
    """The history of every key from all events at once (no batches): what any arrival order
    must give when every event is at a distinct lsn and changes a tracked column."""
    truncates = {e["lsn"] for e in events if e["op"] == "t"}
    rows: list[Row] = []
    for key in {e["id"] for e in events if e["op"] != "t"}:
        mine = [(e["lsn"], e["op"] == "d", None if e["op"] == "d" else e) for e in events
                if e["id"] == key and e["op"] != "t"]
        mine += [(t, True, None) for t in truncates]
        rows += fold(mine, tracked, untracked)
    return sorted(rows, key=lambda r: (r["id"], r[START]))


def scd1_with_truncates(batches: list[list[Event]], data: list[str]) -> dict[Any, Row]:
    """SCD type 1 with truncates: an event at or before any truncate is dropped; per key the
    newest event (ties: batch order) applies if newer than the row and, for an upsert, newer
    than the key's tombstones; a batch's truncate then deletes every row at or before it."""
    rows: dict[Any, Row] = {}
    tombstones: dict[Any, Any] = {}
    truncated_at: Any = None
    for batch in batches:
        batch_truncates = [e["lsn"] for e in batch if e["op"] == "t"]
        if batch_truncates:
            truncated_at = max([*batch_truncates, *([truncated_at] if truncated_at is not None else [])])
        newest: dict[Any, Event] = {}
        for event in batch:
            if event["op"] == "t":
                continue
            if event["id"] not in newest or event["lsn"] >= newest[event["id"]]["lsn"]:
                newest[event["id"]] = event
        for key, event in newest.items():
            if truncated_at is not None and event["lsn"] <= truncated_at:
                continue
            row = rows.get(key)
            newer_than_row = row is None or event["lsn"] > row["lsn"]
            if event["op"] == "d":
                tombstones[key] = max(tombstones.get(key, event["lsn"]), event["lsn"])
                if newer_than_row:
                    rows.pop(key, None)
                continue
            if newer_than_row and not (key in tombstones and not event["lsn"] > tombstones[key]):
                rows[key] = {"id": key, "lsn": event["lsn"], **{c: event[c] for c in data}}
        if batch_truncates:
            last = max(batch_truncates)
            rows = {k: r for k, r in rows.items() if r["lsn"] > last}
    return rows
