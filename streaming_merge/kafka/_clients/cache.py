"""The executors' consumer cache (see the package docstring), its counters, and
:func:`read_partition`, which reads a range through it."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from streaming_merge.kafka._clients.common import (
    CACHE_CAPACITY,
    CACHE_IDLE_TIMEOUT_S,
    CONFLUENT,
    STATS_DIR_ENV,
    ClientSpec,
    ReadRequest,
)
from streaming_merge.kafka._clients.confluent import ConfluentReader
from streaming_merge.kafka._clients.kafka_python import KafkaPythonReader
from streaming_merge.kafka._clients.reader import _TIMES, PartitionReader


@dataclass
class _Entry:
    reader: PartitionReader
    last_used: float


_CACHE: OrderedDict[tuple[ClientSpec, str, int], _Entry] = OrderedDict()
_LOCK = threading.Lock()
_STATS = {"created": 0, "reused": 0, "released": 0, "closedAfterFailure": 0, "evicted": 0}


def consumer_cache_stats() -> dict[str, float]:
    """Counters of this process's consumer cache: consumers ``created``, ``reused`` (a read
    served by a cached consumer), ``released`` back to the cache, ``closedAfterFailure``,
    ``evicted`` (idle or over capacity), and ``cached`` now."""
    with _LOCK:
        return {**_STATS, "cached": len(_CACHE), **_TIMES}


def clear_consumer_cache() -> None:
    """Close every cached consumer (tests, and a worker that wants its sockets back)."""
    with _LOCK:
        entries = list(_CACHE.values())
        _CACHE.clear()
    for entry in entries:
        entry.reader.close()


def _acquire(spec: ClientSpec, topic: str, partition: int) -> PartitionReader:
    """A cached reader of this partition, taken out of the cache while in use, or a new one."""
    now = time.monotonic()
    stale: list[_Entry] = []
    with _LOCK:
        for key in [k for k, e in _CACHE.items() if now - e.last_used > CACHE_IDLE_TIMEOUT_S]:
            stale.append(_CACHE.pop(key))
            _STATS["evicted"] += 1
        entry = _CACHE.pop((spec, topic, partition), None)
        if entry is not None:
            _STATS["reused"] += 1
    for old in stale:
        old.reader.close()
    if entry is not None:
        return entry.reader
    reader: PartitionReader = (ConfluentReader if spec.kind == CONFLUENT else KafkaPythonReader)(
        spec, topic, partition)
    with _LOCK:
        _STATS["created"] += 1
    return reader


def _release(reader: PartitionReader) -> None:
    evicted: list[_Entry] = []
    with _LOCK:
        _CACHE[(reader.spec, reader.topic, reader.partition)] = _Entry(reader, time.monotonic())
        _STATS["released"] += 1
        while len(_CACHE) > CACHE_CAPACITY:
            evicted.append(_CACHE.popitem(last=False)[1])
            _STATS["evicted"] += 1
    for entry in evicted:
        entry.reader.close()


def _publish_stats() -> None:
    """With $STREAMING_MERGE_KAFKA_CONSUMER_STATS_DIR set (tests, benchmarks), write this
    worker's counters to ``<dir>/<pid>.json``: executors are other processes, and this is how
    a test sees whether the second micro-batch reused a consumer."""
    folder = os.environ.get(STATS_DIR_ENV)
    if not folder:
        return
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            json.dump(consumer_cache_stats(), out)
        os.replace(temp, os.path.join(folder, f"{os.getpid()}.json"))


def read_partition(spec: ClientSpec, request: ReadRequest) -> Iterator[pa.RecordBatch]:
    """The records of ``request`` as Arrow batches, through the cached consumer of that
    partition. A consumer whose read raised is closed and dropped; one whose reader stopped
    early goes back to the cache at an unknown position (it seeks next time)."""
    reader = _acquire(spec, request.topic, request.partition)
    healthy = False
    started = time.perf_counter()
    cpu = time.thread_time()
    try:
        for batch in reader.read(request):
            _TIMES["rows"] += batch.num_rows
            yield batch
        healthy = True
    except GeneratorExit:
        reader.next_offset = None
        healthy = True
        raise
    finally:
        _TIMES["reads"] += 1
        _TIMES["readSeconds"] += time.perf_counter() - started
        _TIMES["readCpuSeconds"] += time.thread_time() - cpu
        if healthy:
            _release(reader)
        else:
            reader.close()
            with _LOCK:
                _STATS["closedAfterFailure"] += 1
        _publish_stats()
