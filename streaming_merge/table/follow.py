"""A table followed from one micro-batch to the next by the stream that writes it.

Loading a snapshot from scratch replays the log from its last checkpoint: up to 99 commit
files with delta-rs' default checkpoint interval, so a sink's first-of-batch load grew with
the table's age between checkpoints (about 45 ms for the target and 25 ms for the tombstones,
per 1k-row batch, at 60 commits). Delta's own writers keep the log in memory and apply only
the commits since (``DeltaLog.update``); this does the same with the previous batch's
delta-rs handle.
"""

from __future__ import annotations

import logging
from typing import Any

from streaming_merge.errors import DeltaTableError
from streaming_merge.table.location import TableLocation
from streaming_merge.table.snapshot import Snapshot, advance, commits_down_to, load_snapshot, table_exists

log = logging.getLogger(__name__)


class FollowedTable:
    """The latest snapshot of one table, for the one caller that reads it batch after batch.

    Not shared between threads or callers: a snapshot's log handle moves on when the next one
    is taken (``advance``), which only the snapshot it came from keeps track of."""

    def __init__(self, location: TableLocation) -> None:
        self._location = location
        self._last: Snapshot | None = None
        # The commitInfo of the last snapshot's version: its identity, checked on the next advance.
        self._seen: dict[str, Any] | None = None

    def latest(self) -> Snapshot | None:
        """The table as of now, None when it does not exist: the previous snapshot advanced by
        the commits since, or the log loaded afresh the first time, and whenever the previous
        snapshot's commit is no longer in the log as it was read (the table was deleted, or
        deleted and created again: its versions started over, possibly past the old one)."""
        if self._last is not None:
            try:
                return self._advance(self._last)
            except DeltaTableError as exc:
                log.info("Reading the log of %s afresh: %s", self._location, exc)
                self._last = self._seen = None
        if not table_exists(self._location):
            return None
        self._last = load_snapshot(self._location)
        self._seen = commits_down_to(self._last, self._last.version).get(self._last.version)
        return self._last

    def _advance(self, last: Snapshot) -> Snapshot:
        """``last`` moved on by the commits since; raises ``DeltaTableError`` when the log no
        longer holds ``last``'s commit. Checked after moving, with the same history read: a
        table created again with more versions than before advances without an error, onto
        commits of another table."""
        latest = advance(last)
        commits = commits_down_to(latest, last.version)
        if commits.get(last.version) != self._seen:
            raise DeltaTableError(
                f"version {last.version} of `{self._location}` is no longer the commit this stream read"
            )
        self._last, self._seen = latest, commits.get(latest.version)
        return latest
