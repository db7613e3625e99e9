"""The executors' reading of one topic partition, the same for both clients: positioning,
deadlines, batches, gaps (data loss vs. compaction). The client calls are hooks that the
backends (``confluent``, ``kafka_python``) implement; this module imports neither."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from streaming_merge.kafka._clients.columns import _Columns
from streaming_merge.kafka._clients.common import (
    _BATCH_ROWS,
    _FETCH_RECORDS,
    _WAIT_SLICE_S,
    ClientSpec,
    KafkaSourceError,
    ReadRequest,
    log,
)

# Where a worker's read time goes: wall time of whole reads (including the time Spark takes
# to accept each batch), wall time inside the client calls and column building, and the
# reading thread's CPU time (wall much larger than CPU: the worker waited, for the broker,
# for Spark, or for a core).
_TIMES = {"reads": 0, "rows": 0, "readSeconds": 0.0, "clientSeconds": 0.0, "readCpuSeconds": 0.0}


class PartitionReader:
    """A consumer assigned to one topic partition, reading ranges of it. ``next_offset`` is
    where the consumer stands (None: unknown, seek before the next read)."""

    type_shift = 0

    def __init__(self, spec: ClientSpec, topic: str, partition: int) -> None:
        self.spec = spec
        self.topic = topic
        self.partition = partition
        self.next_offset: int | None = None
        self.consumer = self._new_consumer()
        self._assigned = False
        self._overshot = False  # the consumer returned records past the range: it stands past ``end``

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.consumer.close()

    def _name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def read(self, request: ReadRequest) -> Iterator[pa.RecordBatch]:
        """Arrow batches of the records in [start, end): gaps are checked against the
        partition's earliest offset (lost records vs. compaction or transaction markers)."""
        if self.next_offset != request.start:
            self._position(request.start)
        self.next_offset = None  # unknown until this read completes
        expected, end = request.start, request.end
        columns = _Columns(self.type_shift)
        deadline = time.monotonic() + request.poll_timeout_s
        while expected < end:
            wait = max(0.0, min(_WAIT_SLICE_S, deadline - time.monotonic()))
            before = time.perf_counter()
            got, expected, done = self._fetch(columns, expected, end, min(_FETCH_RECORDS, end - expected), wait,
                                              request)
            _TIMES["clientSeconds"] += time.perf_counter() - before
            if done:
                break
            if got:
                deadline = time.monotonic() + request.poll_timeout_s
            elif time.monotonic() >= deadline:
                raise KafkaSourceError(
                    f"Timed out after {request.poll_timeout_s * 1000:.0f} ms reading {self._name()} at offset "
                    f"{expected} (wanted up to {end}) with {self.spec.describe()} "
                    "(option kafkaConsumer.pollTimeoutMs).")
            if len(columns) >= _BATCH_ROWS:
                yield columns.to_batch(self.topic, self.partition)
                columns = _Columns(self.type_shift)
        if len(columns):
            yield columns.to_batch(self.topic, self.partition)
        self.next_offset = end if expected == end and not self._overshot else None
        self._overshot = False

    def _new_consumer(self) -> Any:
        """The backend's consumer of ``self.spec`` for an executor."""
        raise NotImplementedError

    def _fetch(self, columns: _Columns, expected: int, end: int, want: int, wait: float, request: ReadRequest
               ) -> tuple[bool, int, bool]:
        """Take up to ``want`` records from the client into ``columns``; returns (anything
        arrived, next expected offset, range finished)."""
        raise NotImplementedError

    def _position(self, offset: int) -> None:
        raise NotImplementedError

    def _earliest(self) -> int:
        raise NotImplementedError

    def _gap(self, start: int, stop: int, request: ReadRequest) -> None:
        """Offsets [start, stop) did not come back. Below the partition's earliest offset they
        were deleted (data loss); at or above it they are invisible (compacted away,
        transaction markers, aborted records), which is normal, as Spark decides."""
        earliest = self._earliest()
        if earliest <= start:
            log.debug("offsets %d..%d of %s are not visible (compaction or transaction markers)",
                      start, stop - 1, self._name())
            return
        message = (f"Offsets {start}..{min(stop, earliest) - 1} of {self._name()} were lost "
                   "(retention or compaction removed them before they were read)")
        if request.fail_on_data_loss:
            raise KafkaSourceError(message + "; set failOnDataLoss=false to skip them.")
        log.warning("%s; skipping them because failOnDataLoss=false", message)

    def _add_slow(self, columns: _Columns, items: list[Any], offset_of: Callable[[Any], int],
                  add: Callable[[list[Any]], None], expected: int, end: int, request: ReadRequest) -> tuple[int, bool]:
        """Records one by one: duplicates below ``expected`` skipped, gaps checked, records at
        or past ``end`` dropped (the consumer then stands past the range: seek next time)."""
        for item in items:
            offset = offset_of(item)
            if offset < expected:
                continue
            if offset >= end:
                if expected < end:
                    self._gap(expected, end, request)
                self._overshot = True
                return end, True
            if offset > expected:
                self._gap(expected, offset, request)
            add([item])
            expected = offset + 1
        return expected, expected >= end
