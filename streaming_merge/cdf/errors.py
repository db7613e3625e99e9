"""The errors of the change data feed reader.

Both derive from :class:`streaming_merge.errors.DeltaTableError`, so a caller that already
handles "the Delta log cannot be read" keeps handling these; the leaves tell the cases a job
reacts to differently apart (pick another range, or restart the stream from scratch).
"""

from __future__ import annotations

from streaming_merge.errors import DeltaTableError

__all__ = ["ChangeDataFeedError", "ChangeDataNotRecordedError", "ChangeDataSchemaChangedError"]


class ChangeDataFeedError(DeltaTableError):
    """Raised when the change data of a table cannot be read for the requested versions: a
    range outside the table's history, a commit the log no longer holds (log cleanup), a change
    data or data file that is gone (VACUUM), an option the reader does not understand."""


class ChangeDataNotRecordedError(ChangeDataFeedError):
    """Raised when a version of the requested range was committed while
    ``delta.enableChangeDataFeed`` was not ``true`` in the table's metadata: its changes were
    never recorded, so no reader can return them."""


class ChangeDataSchemaChangedError(ChangeDataFeedError):
    """Raised when a change data stream meets a commit that changes the table's schema or
    partition columns: the stream's schema was fixed when it started, so it stops rather than
    return rows of another shape. Restart it with a new checkpoint (and a starting version)."""
