"""One life of the Kafka CDC ingestion job under the soak (bench/soak.py): the real job,
instrumented, that SIGKILLs its own process group at the point it is told to.

Why a wrapper and not the job's CLI: the interesting crash points (right before / right
after a commit file is written, while the Kafka records are being read on the executors,
between the MERGE commit and Spark's offset commit) are only reachable from inside the
job, at a known moment. The wrapper runs ``jobs.kafka_cdc_ingest.start(...)`` with
``availableNow`` exactly as the CLI does and changes no file of the library or the job: it
rebinds, in this process only, names that the job and the library look up at call time
(as tests/streaming_support/kafka_ingest_app.py does):

- ``jobs.kafka_cdc_ingest.batch_function``: the foreachBatch function is wrapped to know the
  current batch id and to report when a batch starts;
- ``jobs.kafka_cdc_ingest.MergeSink``: the job's sink gets a ``phase_hook`` (MergeSink's
  ``after_materialize`` / ``after_find_touched_files`` / ``before_commit`` points);
- ``streaming_merge.streaming.sink.copy_batch`` and ``streaming_merge.kafka.debezium.decode_batch``:
  the calls whose Spark job reads the batch's Kafka records (see :func:`main`'s read wrapper);
- ``streaming_merge.table.commit.put_if_absent``: the put-if-absent that writes every commit file
  of the target, tombstone and dead-letter tables (the project writes its own commits).

Every event goes to ``--events`` as one JSON line, written and closed at once (the process
may be killed right after). The soak reads them to know where each kill landed.

Kill points (``--kill KIND:BATCH[:ARG]``: the first time KIND happens in a batch >= BATCH):

- ``commit_before:B:TABLE`` / ``commit_after:B:TABLE``: right before / right after a
  commit file of TABLE is written (``target`` = the MERGE with the batch's txn, ``tombstones`` = the
  batch's delete tombstones, written just before the MERGE);
- ``mid_read:B``: inside a read task of the batch's Kafka records, once it has fetched some
  and before Spark has them (``bench/_soak_worker.py``, the workers' Python daemon);
- ``mid_merge:B``: the MERGE's data files are written, its commit is not (orphan files);
- ``after_merge_commit:B``: the MERGE is committed, Spark's offset commit is not (the
  restart must replay the batch and skip it by its Delta txn).

Executor kills (``--executor-kill KIND:BATCH``, repeatable, only in batches < ``--executor-kills-before``
so that the batch can be seen to finish in this life): SIGKILL one executor JVM of this
application (a descendant of this process whose command line is Spark's
``CoarseGrainedExecutorBackend`` with this application's id; never any other process):
``mid_read`` (an executor running a read task), ``after_materialize`` (an executor holding
the sink's materialized batch) and ``mid_merge`` (between the MERGE's scan and its rewrite,
an executor holding the source blocks the rewrite reads). The job must survive: the
standalone master inside the driver relaunches the executor, Spark reruns failed tasks, and
the job and the sink rerun a batch whose materialized blocks were lost.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark import SparkContext
from pyspark.sql import DataFrame

import jobs.kafka_cdc_ingest as job
from bench._soak_worker import ARMING_ENV
from devtools.s3_server import s3a_conf
from streaming_merge.kafka import debezium
from streaming_merge.merge.materialize import checkpoint_rdd_id
from streaming_merge.session import local_session
from streaming_merge.spark.packages import package_conf
from streaming_merge.streaming import sink as sink_module
from streaming_merge.table import commit as commit_module

EXECUTOR_MAIN_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
WATCH_POLL_S = 0.005
EXECUTOR_DEATH_TIMEOUT_S = 30.0


@dataclass
class Point:
    """A kill point: KIND at the first eligible batch >= batch; ``arg`` is the table of a
    commit kill."""

    kind: str
    batch: int
    arg: str = ""
    done: bool = False

    @classmethod
    def parse(cls, text: str) -> Point:
        kind, batch, *rest = text.split(":")
        return cls(kind, int(batch), rest[0] if rest else "")


@dataclass
class State:
    """What the hooks share: the batch in progress and whether its Kafka read is in flight.
    foreachBatch calls come one at a time (one query), so plain attributes suffice."""

    events_path: str
    batch: int = -1
    reading: bool = False
    read_started: float = 0.0
    started: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def emit(self, event: str, **fields: Any) -> None:
        record = {"event": event, "t": time.time(), "batchId": self.batch, **fields}
        with self.lock, open(self.events_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, default=str) + "\n")


def die(state: State, kind: str, **detail: Any) -> None:
    """SIGKILL this whole process group: the Python driver, its JVM (with the standalone
    master and workers of a local-cluster) and the executor JVMs with their Python workers,
    like a machine dying. Nothing runs after this; the event line is written first."""
    state.emit("kill", kind=kind, **detail)
    sys.stdout.flush()
    sys.stderr.flush()
    os.killpg(os.getpgid(0), signal.SIGKILL)


# ------------------------------------------------------------------ executors


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                stat = handle.read()
        except OSError:  # exited meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and ')'
        children.setdefault(parent, []).append(int(entry))
    return children


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def executor_pids(app_id: str) -> dict[str, int]:
    """Executor id -> pid of this application's live executor JVMs, found among the
    descendants of this process only and matched on the executor's own command line."""
    children = _children()
    found: dict[str, int] = {}
    todo = list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = [a.decode(errors="replace") for a in handle.read().split(b"\0")]
        except OSError:
            continue
        if EXECUTOR_MAIN_CLASS in argv and "--app-id" in argv and "--executor-id" in argv \
                and argv[argv.index("--app-id") + 1] == app_id and is_alive(pid):
            found[argv[argv.index("--executor-id") + 1]] = pid
    return found


def executors_with_active_tasks(sc: SparkContext) -> list[str]:
    """Executor ids the driver's status store shows running tasks right now."""
    summaries = sc._jsc.sc().statusStore().executorList(True)
    ids = []
    for i in range(summaries.size()):
        summary = summaries.apply(i)
        if str(summary.id()) != "driver" and int(summary.activeTasks()) > 0:
            ids.append(str(summary.id()))
    return ids


def live_executors(sc: SparkContext) -> list[str]:
    summaries = sc._jsc.sc().statusStore().executorList(True)
    return sorted(str(summaries.apply(i).id()) for i in range(summaries.size())
                  if str(summaries.apply(i).id()) != "driver")


def block_holders(frame: DataFrame) -> list[str]:
    """Executor ids holding blocks of the materialized (locally checkpointed) frame."""
    sc = frame.sparkSession.sparkContext
    try:
        sc._jsc.sc().listenerBus().waitUntilEmpty()
        described = sc._jsc.sc().statusStore().rdd(checkpoint_rdd_id(frame)).partitions()
        holders: set[str] = set()
        if described.isDefined():
            seq = described.get()
            for i in range(seq.size()):
                where = seq.apply(i).executors()
                holders.update(str(where.apply(j)) for j in range(where.size()))
        return sorted(holders - {"driver"})
    except Exception:  # the store has not heard of the RDD: any executor will do
        return []


def kill_executor(state: State, sc: SparkContext, kind: str, preferred: list[str], **detail: Any) -> bool:
    """SIGKILL one executor JVM of this application (a preferred one if alive) and wait for
    its death; returns False when no executor process could be found."""
    pids = executor_pids(sc.applicationId)
    victim = next((e for e in preferred if e in pids), None) or (min(pids, key=int) if pids else None)
    if victim is None:
        state.emit("executor_kill_skipped", kind=kind, reason="no live executor process", **detail)
        return False
    pid = pids[victim]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + EXECUTOR_DEATH_TIMEOUT_S
    while is_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    state.emit("executor_killed", kind=kind, executorId=victim, pid=pid, dead=not is_alive(pid),
               preferred=preferred, liveBefore=sorted(pids), **detail)
    return True


# ------------------------------------------------------------------ the watcher of an in-flight Spark job


def active_tasks(sc: SparkContext) -> int:
    """Tasks running right now in any active stage (the driver runs one query, so during
    the read wrapper these are the read's tasks, during the MERGE the MERGE's)."""
    tracker = sc.statusTracker()
    total = 0
    for stage_id in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            total += int(info.numActiveTasks)
    return total


def watch_tasks(sc: SparkContext, in_flight: Callable[[], bool], delay_s: float,
                act: Callable[[dict[str, Any]], bool], missed: Callable[[], None] | None = None) -> threading.Thread:
    """In a thread: wait until tasks of the in-flight Spark job are running, sleep
    ``delay_s``, and if the job is still in flight with tasks running, ``act`` (kill).
    When the job ended first, ``act`` is not called but ``missed`` is: the point stays
    pending for the next batch, with a shorter delay."""

    def run() -> None:
        seen = None
        while in_flight():
            if active_tasks(sc) > 0:
                seen = time.monotonic()
                break
            time.sleep(WATCH_POLL_S)
        if seen is not None:
            if delay_s > 0:
                time.sleep(delay_s)
            running = active_tasks(sc) if in_flight() else 0
            if running > 0 and in_flight():
                act({"delayMs": round(delay_s * 1000), "activeTasksAtKill": running,
                     "msSinceTasksSeen": round((time.monotonic() - seen) * 1000)})
                return
        if missed is not None:
            missed()

    thread = threading.Thread(target=run, name="soak-watcher", daemon=True)
    thread.start()
    return thread


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--dead-letter", required=True)
    parser.add_argument("--keys", required=True)
    parser.add_argument("--row-schema", required=True)
    parser.add_argument("--max-offsets-per-trigger", type=int, required=True)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--events", required=True, help="JSON-lines file of this life's events")
    parser.add_argument("--kill", default=None, help="KIND:BATCH[:ARG], see the module docstring")
    parser.add_argument("--executor-kill", action="append", default=[], help="KIND:BATCH (repeatable)")
    parser.add_argument("--local-dir", default=None, help="spark.local.dir (the soak's small tmpfs)")
    parser.add_argument("--s3a", action="append", default=[], metavar="BUCKET=ENDPOINT",
                        help="S3A (hadoop-aws) for BUCKET at ENDPOINT (the soak's fault proxy), repeatable")
    parser.add_argument("--executor-kills-before", type=int, default=None,
                        help="executor kills only in batches below this one (the process kill's batch)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.ERROR)
    logging.getLogger("jobs.kafka_cdc_ingest").setLevel(logging.INFO)  # its "staging it again" warnings
    logging.getLogger("streaming_merge.streaming.sink").setLevel(logging.WARNING)

    state = State(args.events)
    state.emit("started", pid=os.getpid(), kill=args.kill, executorKills=args.executor_kill)
    kill = Point.parse(args.kill) if args.kill else None
    executor_points = [Point.parse(p) for p in args.executor_kill]

    def kill_due(kind: str, table: str | None = None) -> bool:
        return (kill is not None and kill.kind == kind and state.batch >= kill.batch
                and (table is None or kill.arg == table))

    executor_kill_batches: set[int] = set()

    def executor_point(kind: str) -> Point | None:
        """The pending executor kill of this kind due in this batch: one per batch at most, and
        only before the batch of this life's process kill, so the batch can be seen to finish."""
        if args.executor_kills_before is not None and state.batch >= args.executor_kills_before:
            return None
        if state.batch in executor_kill_batches:
            return None
        point = next((p for p in executor_points if p.kind == kind and not p.done and state.batch >= p.batch), None)
        if point is not None:
            executor_kill_batches.add(state.batch)
        return point

    # A mid_read kill fires inside a read task (bench/_soak_worker.py: the workers' daemon), armed
    # by the driver through this file while the batch's read job is in flight.
    arming = args.events + ".armed"
    extra_conf = {}
    if kill is not None and kill.kind == "mid_read":
        os.environ[ARMING_ENV] = arming  # the JVM, its daemon and workers inherit it
        extra_conf["spark.python.daemon.module"] = "bench._soak_worker"
    if args.local_dir:
        extra_conf["spark.local.dir"] = args.local_dir
    if args.s3a:  # the tables on s3a:// (bench/soak.py --storage s3); the sink maps these settings for obstore
        extra_conf.update(package_conf(("s3a",)))
        for bucket, endpoint in (given.split("=", 1) for given in args.s3a):
            extra_conf.update(s3a_conf(bucket, endpoint))
    spark = local_session("soak-kafka-ingest", args.master, shuffle_partitions=2, extra_conf=extra_conf)
    sc = spark.sparkContext
    state.emit("session", appId=sc.applicationId, master=sc.master, sinceStartMs=round(
        (time.monotonic() - state.started) * 1000))
    tables = {os.path.realpath(args.target): "target", os.path.realpath(args.target + "_tombstones"): "tombstones",
              os.path.realpath(args.dead_letter): "dead_letter"}
    # An S3 store's prefix is the table's key in its bucket: matched by the table's name.
    names = {path.rstrip("/").rsplit("/", 1)[-1]: name for path, name in
             ((args.target, "target"), (args.target + "_tombstones", "tombstones"), (args.dead_letter, "dead_letter"))}

    def table_of(store: Any) -> str:
        prefix = str(getattr(store, "prefix", "") or "")
        if not args.s3a:
            return tables.get(os.path.realpath(prefix), "other")
        return names.get(prefix.rstrip("/").rsplit("/", 1)[-1], "other")

    # -- commit writes (streaming_merge.table.commit: the commit file's put-if-absent)
    original_put = commit_module.put_if_absent

    def put_commit(store: Any, path: str, data: bytes) -> bool:
        table = table_of(store)
        version = int(path.rsplit("/", 1)[-1].split(".")[0])
        if kill_due("commit_before", table):
            die(state, "commit_before", table=table, readVersion=version - 1)
        created = original_put(store, path, data)
        if created:
            state.emit("commit_written", table=table, version=version)
            if kill_due("commit_after", table):
                die(state, "commit_after", table=table, version=version)
        return created

    commit_module.put_if_absent = put_commit

    # -- the Kafka read.
    # The kafka_py source is lazy: Spark plans a batch's offset ranges on the driver, but
    # not one record is fetched until a Spark job of the batch function reads them. In
    # jobs.kafka_cdc_ingest that is the MergeSink's copy of the batch (copy_batch, one Spark
    # job that reads, decodes, folds and copies the records; debezium.decode_observed), or,
    # for a new table's first batch and a replayed one, debezium.decode_batch (a local
    # checkpoint of the decoded records). Either job's tasks run the source's partition readers
    # in the executors' Python workers (one consumer per Kafka partition range). The process
    # kill fires inside such a task (bench/_soak_worker.py), armed while that call runs. The
    # executor kill (local-cluster) picks an executor the driver sees running tasks of the job
    # while the call has not returned; when the job ended first, the point stays pending for
    # the next batch, its delay (50 ms the first time) then none.
    misses = {"process": 0, "executor": 0}

    def miss(which: str) -> None:
        misses[which] += 1
        state.emit("read_kill_missed", which=which, misses=misses[which])

    def reading(original: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        state.reading, state.read_started = True, time.monotonic()
        state.emit("read_start")
        armed = kill_due("mid_read")
        if armed:  # a read task that fetches records kills the life (bench/_soak_worker.py)
            with open(arming + ".tmp", "w", encoding="utf-8") as handle:
                json.dump({"pgid": os.getpgid(0), "events": args.events, "batch": state.batch,
                           "armedAt": time.time()}, handle)
            os.replace(arming + ".tmp", arming)
        point = executor_point("mid_read")
        if point is not None:
            def executor_kill(detail: dict[str, Any], point: Point = point) -> bool:
                point.done = kill_executor(state, sc, "mid_read", executors_with_active_tasks(sc),
                                           batchesMissed=misses["executor"], **detail)
                return point.done

            watch_tasks(sc, lambda: state.reading, 0.05 if not misses["executor"] else 0.0, executor_kill,
                        lambda: miss("executor"))
        try:
            result = original(*a, **kw)
        finally:
            state.reading = False
            if armed:
                os.remove(arming)
        if armed:  # the job read no record (a batch the sink skipped has no copy_batch call at all)
            miss("process")
        state.emit("read_end", ms=round((time.monotonic() - state.read_started) * 1000))
        return result

    debezium.decode_batch = functools.partial(reading, debezium.decode_batch)
    sink_module.copy_batch = functools.partial(reading, sink_module.copy_batch)  # type: ignore[assignment]

    # -- MergeSink phases

    def kill_points(phase: str, frame: DataFrame) -> None:
        if phase == "after_materialize":
            point = executor_point("after_materialize")
            if point is not None:
                point.done = kill_executor(state, sc, "after_materialize", block_holders(frame), phase=phase)
        elif phase == "after_find_touched_files":
            # Between the MERGE's scan and its rewrite job, an executor holding the blocks of the
            # materialized source that the rewrite is about to read. Synchronous on purpose: the
            # rewrite of a small batch runs tasks of a few tens of milliseconds, which a watcher
            # polling the driver's status store (fed by listener events) mostly does not see.
            point = executor_point("mid_merge")
            if point is not None:
                point.done = kill_executor(state, sc, "mid_merge", block_holders(frame), phase=phase)
        elif phase == "before_commit" and kill_due("mid_merge"):
            die(state, "mid_merge", phase=phase)

    original_sink = job.MergeSink

    def sink_with_kill_points(*a: Any, phase_hook: Callable[[str, DataFrame], None] | None = None,
                              **kw: Any) -> Any:
        """The job's sink with the kill points after the job's own hook (its malformed-record check)."""
        def both(phase: str, frame: DataFrame) -> None:
            if job_hook is not None:
                job_hook(phase, frame)
            kill_points(phase, frame)

        job_hook = phase_hook
        return original_sink(*a, phase_hook=both, **kw)

    job.MergeSink = sink_with_kill_points  # type: ignore[misc]

    # -- the foreachBatch function and the progress callback
    original_batch_function = job.batch_function

    def batch_function(config: job.IngestConfig, on_progress: Callable[[dict[str, Any]], None],
                       **options: Any) -> Any:
        run, sink = original_batch_function(config, on_progress, **options)

        def traced(records: DataFrame, batch_id: int) -> None:
            state.batch = batch_id
            state.emit("batch_start")
            run(records, batch_id)

        return traced, sink

    job.batch_function = batch_function

    def on_progress(progress: dict[str, Any]) -> None:
        state.emit("merge", progress=progress, executors=live_executors(sc))
        if kill_due("after_merge_commit") and not progress.get("skipped"):
            die(state, "after_merge_commit", tableVersion=progress.get("tableVersion"))

    config = job.IngestConfig(
        bootstrap_servers=args.bootstrap_servers, topics=args.topic, target=args.target,
        keys=[k for k in args.keys.split(",") if k], checkpoint=args.checkpoint, dead_letter=args.dead_letter,
        row_schema=args.row_schema, available_now=True, max_offsets_per_trigger=args.max_offsets_per_trigger,
        starting_offsets="earliest")
    query = job.start(spark, config, on_progress=on_progress)
    state.emit("query_started", queryId=str(query.id), runId=str(query.runId))
    query.awaitTermination()
    state.batch = -1
    state.emit("done", executors=live_executors(sc))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
