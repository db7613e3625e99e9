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

from streaming_merge.errors import DeltaTableError
from streaming_merge.table.location import TableLocation
from streaming_merge.table.snapshot import Snapshot, advance, latest_version, load_snapshot, table_exists

log = logging.getLogger(__name__)


class FollowedTable:
    """The latest snapshot of one table, for the one caller that reads it batch after batch.

    Not shared between threads or callers: a snapshot's log handle moves on when the next one
    is taken (``advance``), which only the snapshot it came from keeps track of."""

    def __init__(self, location: TableLocation) -> None:
        self._location = location
        self._last: Snapshot | None = None

    def latest(self) -> Snapshot | None:
        """The table as of now, None when it does not exist: the previous snapshot advanced by
        the commits since, or the log loaded afresh the first time, and whenever the log no
        longer reaches the previous snapshot's version (the table was deleted, or deleted and
        created again, so its versions started over)."""
        if self._last is not None:
            try:
                latest_version(self._last)
                self._last = advance(self._last)
                return self._last
            except DeltaTableError as exc:
                log.info("Reading the log of %s afresh: %s", self._location, exc)
                self._last = None
        if not table_exists(self._location):
            return None
        self._last = load_snapshot(self._location)
        return self._last
