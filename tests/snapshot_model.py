"""Reference model of AUTO CDC FROM SNAPSHOT, written from the rules in the README ("AUTO CDC
FROM SNAPSHOT") and Databricks' documentation, independently of the flow's Spark plans.

A snapshot is ``{key: {column: value}}``, its version an int. SCD 1: the table is the last
snapshot. SCD 2: per key a list of versions ``{**values, __START_AT, __END_AT}``; a new key
opens a version at the snapshot's version, a missing key closes its open version there, a
change of a tracked column closes the open version and opens a new one, a change of untracked
columns only updates the open version, and an unchanged row is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]
START, END = "__START_AT", "__END_AT"


@dataclass(frozen=True)
class Counts:
    """What one snapshot did, per key."""

    inserted: int = 0
    updated: int = 0  # changed rows (SCD 2: new_versions of them through a tracked column)
    deleted: int = 0
    unchanged: int = 0
    new_versions: int = 0


class SnapshotModel:
    def __init__(self, scd_type: int, columns: list[str], tracked: list[str]) -> None:
        self.scd_type = scd_type
        self.columns = columns
        self.tracked = tracked
        self.current: dict[Any, Row] = {}  # key -> values of the current row
        self.history: dict[Any, list[Row]] = {}

    def apply(self, snapshot: dict[Any, Row], version: int) -> Counts:
        inserted = updated = deleted = unchanged = new_versions = 0
        for key in sorted(set(self.current) | set(snapshot), key=repr):
            old, new = self.current.get(key), snapshot.get(key)
            if old is None:
                inserted += 1
                self._open(key, new, version)  # type: ignore[arg-type]
            elif new is None:
                deleted += 1
                self._close(key, version)
            elif old == new:
                unchanged += 1
            else:
                updated += 1
                if self.scd_type == 2 and any(old[c] != new[c] for c in self.tracked):
                    new_versions += 1
                    self._close(key, version)
                    self._open(key, new, version)
                elif self.scd_type == 2:
                    self.history[key][-1].update(new)
        self.current = {k: dict(v) for k, v in snapshot.items()}
        return Counts(inserted, updated, deleted, unchanged, new_versions)

    def _open(self, key: Any, values: Row, version: int) -> None:
        self.history.setdefault(key, []).append({**values, START: version, END: None})

    def _close(self, key: Any, version: int) -> None:
        self.history[key][-1][END] = version

    def table(self, key_column: str) -> list[Row]:
        """The expected table, sorted like ``sorted_rows``."""
        if self.scd_type == 1:
            rows = [{key_column: k, **v} for k, v in self.current.items()]
        else:
            rows = [{key_column: k, **row} for k, versions in self.history.items() for row in versions]
        return sorted_rows(rows)


def sorted_rows(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: [repr(r[c]) for c in sorted(r)])
