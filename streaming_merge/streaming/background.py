"""A call that runs beside the caller's Spark work, with the caller's job group.

Why: a sink batch has two independent writes, its tombstone append and its MERGE. Run one
after the other, each one's driver planning leaves a core idle; run side by side, one's
planning overlaps the other's tasks. The order that matters for exactly-once (the
tombstones commit before the MERGE records the batch's txn) is kept by waiting for the
call right before the MERGE commits.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark import InheritableThread


class BackgroundCall:
    """``fn()`` started now in a thread that inherits the caller's Spark local properties (job
    group, description), so its jobs are counted and cancelled with the caller's."""

    def __init__(self, fn: Callable[[], object], name: str) -> None:
        self._error: BaseException | None = None

        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # handed to whoever waits
                self._error = exc

        self._thread = InheritableThread(target=run, name=name, daemon=True)
        self._thread.start()

    def result(self) -> None:
        """Wait for the call; raise what it raised (every time it is asked)."""
        self.wait_quietly()
        if self._error is not None:
            raise self._error

    def wait_quietly(self) -> None:
        """Wait for the call without raising: when the caller is already failing, its own
        error is the one to report, but nothing may still be writing when it returns."""
        self._thread.join()
