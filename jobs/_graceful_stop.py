"""How a job stops on SIGTERM or SIGINT: the batch that is running may finish, within a timeout.

Spark's ``query.stop()`` cancels the running batch's Spark jobs at once. A job asked to stop
instead waits for its batch function to return (the MERGE committed; Spark then writes the
batch's offsets) and then stops the query. A batch that starts once the stop is asked for
raises at once, having read and written nothing. Past ``timeout_s`` the running batch is
abandoned: it raises at its next step before its commit (the sink's phase hook), and the query
is stopped, which cancels its Spark jobs; a second signal abandons it at once. An abandoned
batch leaves no commit (its data files, if any, are unreferenced, for vacuum). The job then
exits 0, and its restart is exact: a batch whose offsets Spark did not write runs again, and
if its MERGE had committed it is skipped as already applied (Delta ``txn``).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming import StreamingQuery

from streaming_merge.errors import StreamingMergeError

DEFAULT_STOP_TIMEOUT_S = 20.0
# Phases of the sink at which an abandoned batch gives up (the MERGE's last step before it commits).
COMMIT_POLL_S = 0.02  # Spark tells no event when it has written a batch's offsets; progress follows at once
ABANDON_AT = ("after_materialize", "after_prepare", "before_commit")
log = logging.getLogger(__name__)


class BatchAbandonedError(StreamingMergeError):
    """Raised inside a batch the job gave up on when asked to stop: nothing of it is committed."""


class GracefulStop:
    """Stops one streaming query on SIGTERM/SIGINT after its running batch, within ``timeout_s``."""

    def __init__(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.requested = threading.Event()
        self.abandoned = threading.Event()
        self.stopped = threading.Event()
        self._query: StreamingQuery | None = None
        self._running = 0
        self._state = threading.Condition()
        self._stopper: threading.Thread | None = None
        self._finished_batch: int | None = None

    def install(self) -> None:
        """Handle SIGTERM and SIGINT from now on (before the session starts: a signal during the
        start is then a stop request too)."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, _: FrameType | None) -> None:
        self.request(f"signal {signal.Signals(signum).name}")

    def request(self, reason: str) -> None:
        if self.requested.is_set():  # a second signal: the running batch is not waited for
            if not self.abandoned.is_set():
                log.warning("%s again: abandoning the running batch now", reason)
                with self._state:
                    self.abandoned.set()
                    self._state.notify_all()
            return
        self.requested.set()
        log.info("%s: stopping after the running batch (at most %.0f s)", reason, self.timeout_s)
        self._stopper = threading.Thread(target=self._stop, name="graceful-stop", daemon=True)
        self._stopper.start()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Around the batch function: a batch that starts once a stop was asked for raises."""
        with self._state:
            if self.requested.is_set():
                raise BatchAbandonedError("the job is stopping: a batch that would start now is left to the restart")
            self._running += 1
        try:
            yield
        finally:
            with self._state:
                self._running -= 1
                self._state.notify_all()

    def await_query(self, query: StreamingQuery) -> None:
        """Wait for the query to end: by itself, stopped, or failed (raised) unless the failure
        is the stop's own (a batch abandoned or refused)."""
        try:
            query.awaitTermination()
        except StreamingQueryException as error:
            if not self.ended_by_stop(error):
                raise
            log.info("Stopped: the batch that was running when the stop came was abandoned before its commit")

    def ended_by_stop(self, error: BaseException) -> bool:
        """Whether the query's failure ``error`` is the stop's doing: a batch abandoned or refused,
        or its Spark jobs cancelled, after a stop was asked for."""
        text = str(error)
        return self.requested.is_set() and (BatchAbandonedError.__name__ in text or "cancelled" in text.lower())

    def phase_hook(self, phase: str, _: Any = None) -> None:
        """The sink's phase hook: an abandoned batch raises before it commits."""
        if phase in ABANDON_AT and self.abandoned.is_set():
            raise BatchAbandonedError(f"the job is stopping (past its {self.timeout_s:.0f} s stop timeout, or told "
                                      f"twice): the batch is abandoned at {phase}, before its commit")

    def _stop(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        with self._state:
            self._state.wait_for(lambda: self._query is not None and (self._running == 0 or self.abandoned.is_set()),
                                 max(0.0, deadline - time.monotonic()))
            query, finished = self._query, self._running == 0
        if not finished:
            if not self.abandoned.is_set():
                log.warning("The running batch did not finish within %.0f s: abandoning it before its commit",
                            self.timeout_s)
                self.abandoned.set()
        elif query is not None and not self.abandoned.is_set():
            self._await_offsets_committed(query, deadline)
        if query is not None:
            query.stop()
        self.stopped.set()

    def _await_offsets_committed(self, query: StreamingQuery, deadline: float) -> None:
        """Until Spark has written the offsets of the last batch that finished (it reports the
        batch's progress right after), so that the restart does not run it again."""
        finished = self._finished_batch
        while finished is not None and query.isActive and time.monotonic() < deadline:
            last = query.lastProgress
            if last is not None and int(last["batchId"]) >= finished:
                return
            time.sleep(COMMIT_POLL_S)

    def attach(self, query: StreamingQuery) -> None:
        """The query to stop; a stop asked for while the job started is carried out now."""
        with self._state:
            self._query = query
            self._state.notify_all()
        if self.stopped.is_set():  # the stop gave up waiting for the query to exist
            query.stop()

    def wrap(self, function: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        """``function`` (a foreachBatch function) inside :meth:`batch`."""
        def guarded(records: Any, batch_id: int) -> None:
            with self.batch():
                function(records, batch_id)
                self._finished_batch = batch_id
        return guarded
