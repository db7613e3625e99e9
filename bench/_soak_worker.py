"""The Python daemon of a soak life's Spark workers (``spark.python.daemon.module``): pyspark's
own daemon, with the Kafka source's ``read_range`` wrapped so that a life armed for a
``mid_read`` kill SIGKILLs its driver's process group from inside a read task, once that task
has fetched records from Kafka and before it hands them to Spark.

Why from inside the task: the read of a soak batch (tens of records) is one short task of the
sink's copy job, and a watcher polling the driver's status store (fed by listener events) did
not see it running once in six batches. The wrapper is installed in the daemon before it forks
its workers, so every worker runs it; the driver arms it (:data:`ARMING_ENV` names a JSON file
with its process group, the events file and the batch) only while the batch's read job is in
flight, so the warm-up read and the dead-letter re-read of malformed records never fire it.
Nothing of the library changes: ``read_range`` is looked up in its module at call time, and
only the daemon's process (run as ``-m``) rebinds it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

from pyspark import daemon

from streaming_merge.kafka import source

ARMING_ENV = "SOAK_READ_ARMING"

_read_range = source.read_range


def read_range(options: Any, task: Any) -> Iterator[Any]:
    for batch in _read_range(options, task):
        if batch.num_rows:
            _kill_if_armed(task, batch.num_rows)
        yield batch


def _kill_if_armed(task: Any, rows: int) -> None:
    path = os.environ.get(ARMING_ENV)
    if not path:
        return
    try:
        with open(path, encoding="utf-8") as handle:
            armed = json.load(handle)
    except (OSError, ValueError):  # not armed (or being replaced: the driver renames it in place)
        return
    record = {"event": "kill", "t": time.time(), "batchId": armed["batch"], "kind": "mid_read",
              "where": "executor read task", "workerPid": os.getpid(), "topic": task.topic,
              "partition": task.partition, "rowsFetched": rows,
              "msSinceReadStart": round((time.time() - armed["armedAt"]) * 1000)}
    with open(armed["events"], "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
    os.killpg(armed["pgid"], signal.SIGKILL)  # the driver, its JVM (and a local-cluster's JVMs)
    os.killpg(os.getpgid(0), signal.SIGKILL)  # this daemon's group: its workers, this one too


if __name__ == "__main__":  # the daemon: installed before it forks its workers
    source.read_range = read_range
    daemon.manager()
