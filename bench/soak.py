"""Exactly-once soak: the Kafka CDC ingestion job, SIGKILLed again and again, must end exact.

    python -m bench.soak                                  # defaults: local-cluster, 20 kills, 3 executor kills
    python -m bench.soak --master 'local[2]' --executor-kills 0 --kills 10 --events 3000
    python -m bench.soak --json bench/results/soak.json --seed 7
    python -m bench.soak --faults all --master 'local[2]' --executor-kills 0   # + broker, Delta writer, disk
    python -m bench.soak --storage s3 --faults all --master 'local[2]' --executor-kills 0  # + S3 faults

What it does: starts the embedded Kafka-compatible broker (as jobs/kafka_cdc_demo.py does),
produces a generated Debezium change stream of the ``orders`` table (jobs/cdc_generator.py:
updates, deletes, duplicates, late re-sends, Kafka tombstones, five malformed records),
then runs the ingestion job (bench/_soak_app.py: the job's own ``start`` with
``availableNow``, instrumented) over and over on the same checkpoint. Each life but the last
ends with a SIGKILL of the job's whole process group (Python driver, driver JVM with the
standalone master and workers of a ``local-cluster``, executor JVMs and their Python
workers), like a machine dying, at a point chosen with a seeded RNG, at least
``--kills`` times, and deliberately at each kind of point:

- ``commit_before`` / ``commit_after``: right before / right after a commit file is written of
  the target (the MERGE with the batch's txn) or of the tombstone table (the batch's deletes,
  written just before the MERGE);
- ``mid_read``: inside a task reading the batch's Kafka records, once it has fetched some;
- ``mid_merge``: the MERGE's files are written, its commit is not (orphan files);
- ``after_merge_commit``: between the MERGE commit and Spark's offset commit (the replay
  must be skipped by the Delta txn);
- ``wall_clock``: a random delay after a batch starts, from outside (wherever that lands).

Plus ``--executor-kills`` SIGKILLs of one executor JVM in the middle of a batch (during the
read, after the sink materialized the batch, between the MERGE's scan and rewrite), which the job must
survive (the batch finishes in the same life).

The faults of a real deployment (bench/_soak_faults.py), each at a seeded random batch and
delay, in the same run (``--faults all``, or a flag per kind):

- ``--broker-restarts``: Apache Kafka (``--broker apache``, devtools/kafka_server.py) SIGKILLed,
  down for a random while, restarted on the same log directory and port;
- ``--delta-merges`` / ``--delta-optimizes``: Delta Lake's own MERGE of keys the stream never
  uses, and OPTIMIZE, on the target from another process (bench/_soak_delta_writer.py); the
  expected table is the generator's state plus the writer's rows;
- ``--disk-fills``: the job's ``spark.local.dir`` is a small tmpfs (``--local-dir-mb``; root
  only), filled by a ballast file for a random while (at most until the life ends);
- ``--s3-errors`` / ``--s3-throttles`` / ``--s3-slow-puts`` / ``--s3-lost-answers`` (with
  ``--storage s3``: the target, tombstone and dead-letter tables on ``s3a://`` in moto's S3,
  devtools/s3_server.py, which the job reaches through devtools/s3_faults.py's proxy; the
  checkpoint stays local): the next PUT of a commit or data file answered 500 InternalError or
  503 SlowDown (1-3 times in a row), held for a while, or (commit files) landed with its answer
  dropped. ``--storage s3`` leaves Delta Lake's writer out: its S3 log store cannot share a
  table with another process.

A life that fails on its own while the broker is down, the disk full or an S3 fault armed (and
its log shows that fault's error) is restarted like a killed one; any other life that fails on
its own fails the verdict.

What it checks, independently of the job's own reports:

- between lives: the target's txn version for the query id (read with delta-rs) and
  Spark's committed batch never go backwards, the restart resumes at the first batch
  Spark had not committed, and its first batch is skipped exactly when the table already
  holds its txn (``txn >= batch``);
- at the end: the table read with ``deltalake.DeltaTable(path).to_pyarrow_table()`` (on S3: at
  moto's own endpoint, the logs with obstore) against
  the state cdc_generator computed: lost (expected keys missing), duplicated (extra rows of a
  key) and wrong (rows that differ, or exist but must not) must all be 0; the dead-letter
  table holds each malformed record exactly once; no (app id, txn version) is committed
  twice in any table's log; Spark's final offsets are the topic's end offsets; every planned
  fault fired, the broker came back each time and each Delta writer command committed.

Prints the figures and ``VERDICT: PASS`` / ``FAIL``; exit status 0 / 1. ``--json PATH`` writes
them (with every kill and life) as JSON. Too long for CI: run it by hand (bench/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import deltalake
import obstore
from obstore.store import S3Store

from bench._soak_delta_writer import expected_writer_rows
from bench._soak_faults import (
    DISRUPTIVE_KINDS,
    FAULT_KINDS,
    S3_FAULT_KINDS,
    DeltaWriter,
    Faults,
    LocalDisk,
    make_fault_plan,
)
from bench.kafka_ingest_bench import produce_keyed_bulk
from devtools.kafka_server import ApacheKafka
from devtools.s3_faults import FaultProxy
from devtools.s3_server import ACCESS_KEY, REGION, SECRET_KEY, MotoS3, storage_options
from jobs import cdc_generator
from streaming_merge.kafka.broker import EmbeddedKafka
from streaming_merge.kafka.broker_client import KafkaBrokerClient

ROOT = Path(__file__).resolve().parents[1]
TABLE = "orders"
SPEC = cdc_generator.TABLES[TABLE]
KEY: str = SPEC["key"]
COLUMNS = [c.split()[0] for c in SPEC["schema"].split(",")]
TOPIC = "soak.public.orders"

PROCESS_KILL_KINDS = ("commit_before", "commit_after", "mid_read", "after_merge_commit", "mid_merge", "wall_clock")
EXECUTOR_KILL_KINDS = ("mid_read", "after_materialize", "mid_merge")
LIFE_TIMEOUT_S = 900.0  # a guard against a hung life, not a synchronisation
MAX_FAILED_LIVES = 5  # consecutive lives that die on their own (not by our kill) before giving up
MAX_FAULT_FAILED_LIVES = 10  # consecutive lives that fail under a broker outage or a full disk
# --faults all: how many of each fault kind, unless a flag of its own says otherwise.
ALL_FAULTS = {"broker_restart": 3, "delta_merge": 3, "delta_optimize": 3, "disk_full": 3,
              # --storage s3 only (--faults all on local tables leaves them out)
              "s3_error": 3, "s3_throttle": 3, "s3_slow_put": 3, "s3_lost_answer": 3}
BUCKET = "soak"
# Each life's JVMs live a minute or so: C1 compiles their hot code soon enough and leaves the two
# cores to the work (a local-cluster life runs three JVMs); as tests/cluster/ does.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
SUBMIT_ARGS = f"--conf spark.executor.extraJavaOptions={JVM_OPTIONS} --driver-java-options {JVM_OPTIONS} pyspark-shell"


# ------------------------------------------------------------------ the plan


@dataclass
class KillPlan:
    """One process kill: KIND at the first eligible point of a batch >= ``batch``.
    ``fraction`` scales the random delay of a ``wall_clock`` kill (drawn from the
    seeded RNG up front; the delay's scale is measured during the run)."""

    index: int
    kind: str
    batch: int
    table: str = ""
    fraction: float = 0.0


@dataclass
class ExecutorPlan:
    kind: str
    batch: int
    done: bool = False


def make_plan(rng: random.Random, kills: int, executor_kills: int, batches: int
              ) -> tuple[list[KillPlan], list[ExecutorPlan]]:
    """Kill kinds round-robin (every kind at least once from 6 kills on), shuffled, placed at
    sorted random batches over the first 90 % of the stream; commit kills alternate target /
    tombstones (two of three on the target).
    Executor kills go to random batches of the first 70 % of the stream, so the lives after
    them still have batches in which to show that the job survived."""
    kinds = [PROCESS_KILL_KINDS[i % len(PROCESS_KILL_KINDS)] for i in range(kills)]
    rng.shuffle(kinds)
    # Headroom at the end: a kill that misses its batch moves on (a read shorter than its delay,
    # a batch without the commit it waits for), and the stream must not end before it fires.
    span = range(0, max(1, int(batches * 0.9)))
    points = sorted(rng.sample(span, kills) if len(span) >= kills else rng.choices(span, k=kills))
    plan: list[KillPlan] = []
    seen: Counter[str] = Counter()
    for index, (kind, batch) in enumerate(zip(kinds, points, strict=True)):
        table = ""
        if kind in ("commit_before", "commit_after"):
            table = "tombstones" if seen[kind] % 3 == 1 else "target"
        seen[kind] += 1
        plan.append(KillPlan(index, kind, batch, table, rng.random()))
    executor_span = range(0, max(1, int(batches * 0.7)))
    executor_points = sorted(rng.sample(executor_span, executor_kills) if len(executor_span) >= executor_kills
                             else rng.choices(executor_span, k=executor_kills))
    executors = [ExecutorPlan(EXECUTOR_KILL_KINDS[i % len(EXECUTOR_KILL_KINDS)], b)
                 for i, b in enumerate(executor_points)]
    return plan, executors


# ------------------------------------------------------------------ observing the job from outside


def read_events(path: Path) -> list[dict[str, Any]]:
    """The life's events; a line cut by the kill (there should be none: each is one write) is dropped."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def query_id(checkpoint: Path) -> str | None:
    """The streaming query's id, which Spark keeps in the checkpoint; the sink's app id."""
    metadata = checkpoint / "metadata"
    return json.loads(metadata.read_text()).get("id") if metadata.exists() else None


def log_ids(folder: Path) -> list[int]:
    """Batch ids of Spark's offset or commit log (files named by batch id)."""
    if not folder.exists():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (the job's session: what a kill must take)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def wait_group_gone(pgid: int, timeout_s: float = 30.0) -> list[int]:
    """Wait until no process of the job's group is left; SIGKILL stragglers (they are ours:
    the group is the session the job was started in). Returns the pids that outlived the kill."""
    deadline = time.monotonic() + timeout_s
    while (members := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in members:
        with contextlib.suppress(ProcessLookupError):  # exited meanwhile
            os.kill(pid, signal.SIGKILL)
    return members


@dataclass
class Storage:
    """Where the soak's Delta tables live: the work folder, or (``--storage s3``) the bucket of
    moto's S3 server, which the soak reads at moto's own endpoint (the job reaches it through
    the fault proxy). The checks read tables and logs without Spark: delta-rs and obstore."""

    root: str  # a local folder, or s3a://bucket
    endpoint: str | None = None  # moto's endpoint (S3 only)

    @property
    def s3(self) -> bool:
        return self.root.startswith("s3a://")

    def uri(self, name: str) -> str:
        return f"{self.root}/{name}"

    def delta(self, uri: str) -> deltalake.DeltaTable:
        if not self.s3:
            return deltalake.DeltaTable(uri)
        assert self.endpoint is not None
        return deltalake.DeltaTable(uri.replace("s3a://", "s3://", 1), storage_options=storage_options(self.endpoint))

    def _log_store(self, uri: str) -> S3Store:
        assert self.endpoint is not None
        bucket, prefix = uri.removeprefix("s3a://").split("/", 1)
        return S3Store(bucket, prefix=f"{prefix}/_delta_log", endpoint=self.endpoint, access_key_id=ACCESS_KEY,
                       secret_access_key=SECRET_KEY, region=REGION, virtual_hosted_style_request=False,
                       client_options={"allow_http": True})

    def commit_versions(self, uri: str) -> list[int]:
        """Versions of the table's JSON commit files ([] before the table exists)."""
        if not self.s3:
            log = Path(uri) / "_delta_log"
            return sorted(int(p.stem) for p in log.glob("*.json") if p.stem.isdigit()) if log.exists() else []
        names = [str(meta["path"]) for batch in obstore.list(self._log_store(uri)) for meta in batch]
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())

    def commit_text(self, uri: str, version: int) -> str:
        name = f"{version:020d}.json"
        if not self.s3:
            return (Path(uri) / "_delta_log" / name).read_text(encoding="utf-8")
        return bytes(obstore.get(self._log_store(uri), name).bytes()).decode("utf-8")

    def exists(self, uri: str) -> bool:
        return bool(self.commit_versions(uri))


def txn_version(storage: Storage, target: str, app_id: str | None) -> int | None:
    """The target's txn version for the query, read with delta-rs (None before the first MERGE)."""
    if app_id is None or not storage.exists(target):
        return None
    return storage.delta(target).transaction_version(app_id)


def committed_txns(storage: Storage, table: str) -> Counter[tuple[str, int]]:
    """(app id, version) -> number of commits recording that txn, from the table's JSON log.
    Any count above 1 is a batch applied twice."""
    counts: Counter[tuple[str, int]] = Counter()
    for version in storage.commit_versions(table):
        for line in storage.commit_text(table, version).splitlines():
            action = json.loads(line)
            if "txn" in action:
                counts[(action["txn"]["appId"], int(action["txn"]["version"]))] += 1
    return counts


def log_is_complete(storage: Storage, table: str) -> bool:
    """True when every commit file 0..latest is present (no log cleanup): then
    :func:`committed_txns` sees every commit."""
    versions = storage.commit_versions(table)
    return versions == list(range(len(versions)))


# ------------------------------------------------------------------ one life


@dataclass
class Life:
    """One run of the job, from launch to exit."""

    index: int
    kill: dict[str, Any] | None
    executor_kills_requested: list[str]
    exit_code: int | None = None
    seconds: float = 0.0
    to_first_batch_s: float | None = None
    to_first_merge_s: float | None = None
    first_batch: int | None = None
    first_batch_skipped: bool | None = None
    batches_started: list[int] = field(default_factory=list)
    batches_merged: list[int] = field(default_factory=list)
    killed_at: dict[str, Any] | None = None
    executor_kills: list[dict[str, Any]] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    txn_after: int | None = None
    spark_commit_after: int | None = None
    spark_offsets_after: int | None = None
    checks: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)  # the faults fired while it ran
    died_under_fault: bool = False  # failed on its own while the broker was down or the disk full
    conflict_retries: int = 0  # the sink's reruns after a concurrent commit (its progress' conflictRetries)


class Soak:
    def __init__(self, args: argparse.Namespace, workdir: Path, bootstrap: str, faults: Faults | None = None,
                 local_dir: Path | None = None, storage: Storage | None = None,
                 s3a: dict[str, str] | None = None) -> None:
        self.args = args
        self.workdir = workdir
        self.bootstrap = bootstrap
        self.storage = storage or Storage(str(workdir))
        self.target = self.storage.uri(TABLE)
        self.checkpoint = workdir / "checkpoint"
        self.dead_letter = self.storage.uri("dead_letter")
        self.s3a = s3a or {}  # bucket -> the endpoint the job reaches it at (the fault proxy)
        self.batch_s: list[float] = []  # batch durations, to scale wall-clock delays
        self.faults = faults
        self.local_dir = local_dir

    def command(self, events: Path, kill: KillPlan | None, executor_points: list[ExecutorPlan]) -> list[str]:
        command = [sys.executable, "-m", "bench._soak_app", "--bootstrap-servers", self.bootstrap,
                   "--topic", TOPIC, "--target", str(self.target), "--checkpoint", str(self.checkpoint),
                   "--dead-letter", self.dead_letter, "--keys", KEY, "--row-schema", SPEC["schema"],
                   "--max-offsets-per-trigger", str(self.args.max_offsets_per_trigger), "--master", self.args.master,
                   "--events", str(events)]
        if kill is not None and kill.kind != "wall_clock":
            arg = kill.table
            command += ["--kill", f"{kill.kind}:{kill.batch}" + (f":{arg}" if arg else "")]
        for point in executor_points:
            command += ["--executor-kill", f"{point.kind}:{point.batch}"]
        if kill is not None and executor_points:
            command += ["--executor-kills-before", str(kill.batch)]
        if self.local_dir is not None:
            command += ["--local-dir", str(self.local_dir)]
        for bucket, endpoint in self.s3a.items():
            command += ["--s3a", f"{bucket}={endpoint}"]
        return command

    def wall_scale_s(self) -> float:
        """1.5 median warm batches: a wall-clock kill lands anywhere in the batch or the next."""
        return 1.5 * statistics.median(self.batch_s) if self.batch_s else 6.0

    def live(self, index: int, kill: KillPlan | None, executor_points: list[ExecutorPlan]) -> Life:
        events_path = self.workdir / f"life-{index:02d}.jsonl"
        life = Life(index, asdict(kill) if kill else None, [f"{p.kind}:{p.batch}" for p in executor_points])
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.setdefault("PYSPARK_SUBMIT_ARGS", SUBMIT_ARGS)
        if self.local_dir is not None:  # the env wins over spark.local.dir: executors and workers too
            env["SPARK_LOCAL_DIRS"] = str(self.local_dir)
        out = open(self.workdir / f"life-{index:02d}.log", "wb")  # noqa: SIM115 - closed below
        launched, launched_wall = time.monotonic(), time.time()
        process = subprocess.Popen(self.command(events_path, kill, executor_points), cwd=ROOT, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True, env=env)
        wall_fire: float | None = None
        wall_delay = 0.0
        try:
            while process.poll() is None:
                now = time.monotonic()
                if kill is not None and kill.kind == "wall_clock":
                    if wall_fire is None:
                        started = [e for e in read_events(events_path)
                                   if e["event"] == "batch_start" and e["batchId"] >= kill.batch]
                        if started:
                            wall_delay = kill.fraction * self.wall_scale_s()
                            wall_fire = now + wall_delay
                    elif now >= wall_fire and life.killed_at is None:
                        last = read_events(events_path)[-1]
                        os.killpg(process.pid, signal.SIGKILL)
                        life.killed_at = {"kind": "wall_clock", "delayS": round(wall_delay, 2),
                                          "batchId": last.get("batchId"), "lastEvent": last.get("event"),
                                          "lastEventTable": last.get("table")}
                if self.faults is not None:
                    started_batches = [e["batchId"] for e in read_events(events_path) if e["event"] == "batch_start"]
                    life.faults += self.faults.poll(index, max(started_batches) if started_batches else None)
                if now - launched > self.args.life_timeout and not life.notes:
                    os.killpg(process.pid, signal.SIGKILL)
                    life.notes.append(f"hung: killed after {self.args.life_timeout:.0f}s")
                time.sleep(0.05)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            out.close()
        life.seconds = round(time.monotonic() - launched, 2)
        life.exit_code = process.returncode
        life.survivors = wait_group_gone(process.pid)
        if self.faults is not None:
            self.faults.end_of_life()
        self.observe(life, events_path, launched_wall)
        return life

    def observe(self, life: Life, events_path: Path, launch_wall: float) -> None:
        """What the life's events say: resume times (from the launch of the process, which
        follows the previous life's death by the checks between lives, ~1 s), batches, where
        the kill landed, executor kills."""
        events = read_events(events_path)
        started_at = {e["batchId"]: e["t"] for e in events if e["event"] == "batch_start"}
        first = next((e for e in events if e["event"] == "batch_start"), None)
        if first is not None:
            life.first_batch = first["batchId"]
            life.to_first_batch_s = round(first["t"] - launch_wall, 2)
        merges = [e for e in events if e["event"] == "merge"]
        if merges:
            life.to_first_merge_s = round(merges[0]["t"] - launch_wall, 2)
            if merges[0]["batchId"] == life.first_batch:
                life.first_batch_skipped = bool(merges[0]["progress"].get("skipped"))
        life.batches_started = [e["batchId"] for e in events if e["event"] == "batch_start"]
        life.batches_merged = [e["batchId"] for e in merges]
        life.conflict_retries = sum(int(m["progress"].get("conflictRetries") or 0) for m in merges)
        for merge in merges:  # warm batches only: a life's first batch pays the executors' start-up
            if merge["batchId"] in started_at and merge["batchId"] != life.first_batch \
                    and not merge["progress"].get("skipped"):
                self.batch_s.append(merge["t"] - started_at[merge["batchId"]])
        kill_event = next((e for e in events if e["event"] == "kill"), None)
        if kill_event is not None:
            life.killed_at = {k: v for k, v in kill_event.items() if k not in ("event", "t")}
        for event in events:
            if event["event"] in ("executor_killed", "executor_kill_skipped"):
                batch = event["batchId"]
                merged_after = [m for m in merges if m["batchId"] == batch and m["t"] > event["t"]]
                record = {k: v for k, v in event.items() if k not in ("event", "t")}
                record["event"] = event["event"]
                record["batchFinished"] = bool(merged_after)
                if merged_after:
                    progress = merged_after[0]["progress"]
                    record["sinkAttempts"] = progress.get("attempts")
                    record["executorsAfterBatch"] = merged_after[0].get("executors")
                    record["batchSeconds"] = round(merged_after[0]["t"] - started_at.get(batch, event["t"]), 1)
                life.executor_kills.append(record)
        log_text = (self.workdir / f"life-{life.index:02d}.log").read_text(errors="replace")
        reruns = [line.strip() for line in log_text.splitlines()
                  if "staging it again" in line or "rerunning the batch" in line]
        life.notes += [line[:300] for line in reruns]
        for record in life.executor_kills:
            batch = record["batchId"]
            mine = [line for line in reruns if f"Batch {batch} " in line or f"Batch {batch}:" in line]
            record["sinkReruns"] = sum(1 for line in mine if "rerunning the batch" in line)
            record["jobRestages"] = sum(1 for line in mine if "staging it again" in line)
        if life.exit_code not in (0, -signal.SIGKILL):
            life.notes.append("died on its own: " + " | ".join(log_text.strip().splitlines()[-5:])[-1500:])


# ------------------------------------------------------------------ the final comparison


def compare(storage: Storage, target: str, expected: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The table read independently with delta-rs, against the generator's state."""
    rows = storage.delta(target).to_pyarrow_table().to_pylist()
    actual: dict[int, dict[str, Any]] = {}
    per_key: Counter[int] = Counter()
    for row in rows:
        per_key[row[KEY]] += 1
        actual[row[KEY]] = {c: row[c] for c in COLUMNS}
    lost = sorted(set(expected) - set(actual))
    unexpected = sorted(set(actual) - set(expected))
    differing = sorted(k for k in set(actual) & set(expected) if actual[k] != expected[k])
    duplicated = {k: n - 1 for k, n in per_key.items() if n > 1}
    return {"rows": len(rows), "expectedRows": len(expected), "lost": len(lost),
            "duplicated": sum(duplicated.values()), "wrong": len(differing) + len(unexpected),
            "wrongValues": len(differing), "unexpectedKeys": len(unexpected),
            "lostKeys": lost[:20], "duplicatedKeys": sorted(duplicated)[:20], "wrongKeys": differing[:20],
            "unexpectedKeysSample": unexpected[:20],
            "wrongSample": {k: {"actual": actual[k], "expected": expected[k]} for k in differing[:5]}}


def compare_dead_letter(storage: Storage, path: str, malformed: set[tuple[int, int]]) -> dict[str, Any]:
    rows = storage.delta(path).to_pyarrow_table().to_pylist() if storage.exists(path) else []
    seen = Counter((r["partition"], r["offset"]) for r in rows)
    return {"rows": len(rows), "expected": len(malformed), "lost": len(malformed - set(seen)),
            "duplicated": sum(n - 1 for n in seen.values() if n > 1), "unexpected": len(set(seen) - malformed)}


def final_offsets(checkpoint: Path) -> dict[int, int]:
    """The end offsets of Spark's last committed batch (its offset log entry)."""
    committed = log_ids(checkpoint / "commits")
    if not committed:
        return {}
    lines = (checkpoint / "offsets" / str(committed[-1])).read_text().splitlines()
    source = json.loads(lines[-1])
    return {int(p): int(o) for p, o in source.get(TOPIC, {}).items()}


# ------------------------------------------------------------------ main


# What a life's log shows when it failed of a fault fired during it; a failure without its
# fault's mark is a life that died on its own (a verdict failure), whatever fired meanwhile.
FAULT_FAILURE_MARKS = {
    "disk_full": re.compile(r"No space left on device"),
    # kafka-python's and the source's errors (not the word "kafka": every traceback names jobs/kafka_cdc_ingest.py).
    "broker_restart": re.compile(r"kafka\.errors\.|Kafka\w*Error|NoBrokersAvailable|BrokerNotAvailable|"
                                r"LeaderNotAvailable|NotLeaderFor|Connection refused|KafkaSourceError"),
    # The proxy's answers as S3A and obstore report them, and the commit whose outcome is unknown.
    **dict.fromkeys(S3_FAULT_KINDS, re.compile(
        r"CommitOutcomeUnknownError|SlowDown|InternalError|injected by devtools/s3_faults\.py|AWSServiceIOException|"
        r"AWSStatus500|AWSS3IOException|Generic S3 error|S3Exception|Connection reset|connection closed|"
        r"error sending request|IncompleteMessage|timed out|Timeout")),
}


def failed_of_its_fault(life: Life, log_path: Path) -> bool:
    """True when the life failed while a broker outage or a full disk of this life was on, and
    its log shows that fault's error."""
    fired = {f["kind"] for f in life.faults if f["kind"] in DISRUPTIVE_KINDS}
    if not fired or not log_path.exists():
        return False
    text = log_path.read_text(errors="replace")
    return any(FAULT_FAILURE_MARKS[kind].search(text) for kind in fired)


def fault_counts(args: argparse.Namespace) -> dict[str, int]:
    """How many of each fault kind: its own flag, else --faults all's number, else none."""
    flags = {"broker_restart": args.broker_restarts, "delta_merge": args.delta_merges,
             "delta_optimize": args.delta_optimizes, "disk_full": args.disk_fills,
             "s3_error": args.s3_errors, "s3_throttle": args.s3_throttles, "s3_slow_put": args.s3_slow_puts,
             "s3_lost_answer": args.s3_lost_answers}
    base = dict(ALL_FAULTS) if args.faults == "all" else dict.fromkeys(FAULT_KINDS, 0)
    if args.storage != "s3":
        base.update(dict.fromkeys(S3_FAULT_KINDS, 0))
    else:  # Delta Lake's own writer cannot share an S3 table with another process (see main)
        base.update(delta_merge=0, delta_optimize=0)
    return {kind: flags[kind] if flags[kind] is not None else base[kind] for kind in FAULT_KINDS}


def start_broker(args: argparse.Namespace, workdir: Path, stack: contextlib.ExitStack) -> EmbeddedKafka | ApacheKafka:
    if args.broker == "apache":
        # Its own folder in the work folder: a restart needs the log directory it had.
        return stack.enter_context(ApacheKafka(workdir=workdir / "kafka"))
    return stack.enter_context(EmbeddedKafka())


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    started = time.monotonic()
    keys = args.keys or max(10, args.events // 10)
    records, state = cdc_generator.generate(TABLE, args.events, keys, seed=args.seed)
    expected = cdc_generator.expected_rows(state)
    batches_estimate = math.ceil(len(records) / args.max_offsets_per_trigger)
    plan, executor_plan = make_plan(rng, args.kills, args.executor_kills, batches_estimate)
    counts = fault_counts(args)
    fault_plan = make_fault_plan(rng, counts, batches_estimate)  # drawn after the kills: a seed's kills stay
    lives: list[Life] = []
    writer_outcomes: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        broker = start_broker(args, workdir, stack)
        kind = "kafka" if args.broker == "apache" else "tansu"
        with KafkaBrokerClient(broker.bootstrap_servers, kind=kind) as client:
            client.create_topic(TOPIC, args.partitions)
            acks = produce_keyed_bulk(broker.bootstrap_servers, TOPIC, args.partitions,
                                      [(r.key, r.value) for r in records])
            ends = {p: latest for p, (_, latest) in client.offsets(TOPIC).items()}
        malformed = {(a.partition, a.offset) for r, a in zip(records, acks, strict=True) if r.key == b"bad"}
        print(f"Produced {len(records)} Kafka records ({args.events} change events, {len(malformed)} malformed, "
              f"{keys} keys) to {TOPIC} over {args.partitions} partitions on {args.broker}; ~{batches_estimate} "
              f"batches of <= {args.max_offsets_per_trigger}; master {args.master}", flush=True)
        print("Kill plan: " + ", ".join(f"{k.kind}{'/' + k.table if k.table else ''}@{k.batch}" for k in plan),
              flush=True)
        print("Executor kill plan: " + (", ".join(f"{p.kind}@{p.batch}" for p in executor_plan) or "none"),
              flush=True)
        print("Fault plan: " + (", ".join(f"{f.kind}@{f.batch}" for f in fault_plan) or "none"), flush=True)
        disk = writer = proxy = None
        storage, s3a = Storage(str(workdir)), {}
        if args.storage == "s3":
            # moto's S3, with the fault proxy in front of it for the job; the soak's checks read moto itself.
            moto = stack.enter_context(MotoS3())
            moto.create_bucket(BUCKET)
            proxy = stack.enter_context(FaultProxy(moto.endpoint))
            storage, s3a = Storage(f"s3a://{BUCKET}", moto.endpoint), {BUCKET: proxy.endpoint}
            print(f"Tables on s3a://{BUCKET} (moto {moto.endpoint}, the job through the fault proxy "
                  f"{proxy.endpoint})", flush=True)
        if counts["disk_full"]:
            disk = LocalDisk(workdir / "local_dir", args.local_dir_mb).mount()
            stack.callback(disk.unmount)
        target = workdir / TABLE
        if counts["delta_merge"] or counts["delta_optimize"]:
            writer = DeltaWriter(workdir, target).start()
            stack.callback(writer.kill)
        soak = Soak(args, workdir, broker.bootstrap_servers, local_dir=disk.path if disk else None,
                    storage=storage, s3a=s3a)
        faults = (Faults(fault_plan, soak.wall_scale_s, broker=broker if isinstance(broker, ApacheKafka) else None,
                         writer=writer, disk=disk, target=target, proxy=proxy) if fault_plan else None)
        soak.faults = faults
        pending = list(plan)
        failed_in_a_row = failed_under_fault_in_a_row = 0
        previous_txn: int | None = None
        previous_commit = -1
        while True:
            kill = pending[0] if pending else None
            todo = [p for p in executor_plan if not p.done]
            before_txn, before_commit = previous_txn, previous_commit
            life = soak.live(len(lives), kill, todo)
            lives.append(life)
            app_id = query_id(soak.checkpoint)
            life.txn_after = txn_version(storage, soak.target, app_id)
            commits = log_ids(soak.checkpoint / "commits")
            offsets = log_ids(soak.checkpoint / "offsets")
            life.spark_commit_after = commits[-1] if commits else None
            life.spark_offsets_after = offsets[-1] if offsets else None
            for record in life.executor_kills:
                if record["event"] == "executor_killed":
                    match = next((p for p in todo if p.kind == record["kind"] and not p.done), None)
                    if match is not None:
                        match.done = True
            # Progress never goes backwards, and the life resumed where Spark left off.
            life.checks["txnMonotonic"] = (before_txn is None or (life.txn_after is not None
                                                                  and life.txn_after >= before_txn))
            life.checks["sparkCommitMonotonic"] = (life.spark_commit_after if life.spark_commit_after is not None
                                                   else -1) >= before_commit
            if life.first_batch is not None:
                life.checks["resumedAtFirstUncommittedBatch"] = life.first_batch == before_commit + 1
                if life.first_batch_skipped is not None:
                    already = before_txn is not None and before_txn >= life.first_batch
                    life.checks["replaySkippedExactlyWhenTxnHeld"] = life.first_batch_skipped == already
            life.checks["noProcessOutlivedTheKill"] = not life.survivors
            for record in life.executor_kills:
                if record["event"] == "executor_killed":
                    life.checks[f"survivedExecutorKill@{record['batchId']}"] = record["batchFinished"]
            previous_txn = life.txn_after if life.txn_after is not None else previous_txn
            previous_commit = life.spark_commit_after if life.spark_commit_after is not None else previous_commit
            if life.exit_code not in (0, -signal.SIGKILL):
                life.died_under_fault = failed_of_its_fault(life, workdir / f"life-{life.index:02d}.log")
            print(life_line(life), flush=True)
            if life.exit_code == -signal.SIGKILL and life.killed_at is not None:
                pending.pop(0)
                failed_in_a_row = failed_under_fault_in_a_row = 0
                continue
            if life.exit_code == 0:
                if kill is not None:
                    life.notes.append("planned kill(s) never reached, the stream ended first: "
                                      + ", ".join(f"{k.kind}@{k.batch}" for k in pending))
                break
            if life.died_under_fault:  # the broker was down or the disk full: restarted like a killed life
                failed_under_fault_in_a_row += 1
                if failed_under_fault_in_a_row >= MAX_FAULT_FAILED_LIVES:
                    life.notes.append(f"giving up after {failed_under_fault_in_a_row} lives that failed under faults")
                    break
                continue
            failed_in_a_row += 1  # died on its own or hung: restart, the checkpoint must cope
            if failed_in_a_row >= MAX_FAILED_LIVES:
                life.notes.append(f"giving up after {failed_in_a_row} lives that failed on their own")
                break
        if writer is not None:
            writer_outcomes = writer.finish()
        writer_merges = sorted(int(o["index"]) for o in writer_outcomes if o["kind"] == "merge" and o.get("applied"))
        app_id = query_id(soak.checkpoint)
        table = compare(storage, soak.target, {**expected, **expected_writer_rows(writer_merges)})
        dead = compare_dead_letter(storage, soak.dead_letter, malformed)
        tables = (("target", soak.target), ("tombstones", f"{soak.target}_tombstones"),
                  ("dead_letter", soak.dead_letter))
        txns = {name: committed_txns(storage, path) for name, path in tables}
        complete = {name: log_is_complete(storage, path) for name, path in tables if storage.exists(path)}
        twice = {name: sorted(f"{a}@{v}" for (a, v), n in per_txn.items() if n > 1) for name, per_txn in txns.items()}
        offsets_done = final_offsets(soak.checkpoint)
        fault_report = {
            "planned": counts, "plan": [asdict(f) for f in fault_plan],
            "fired": faults.records if faults else [], "notDelivered": faults.not_delivered() if faults else [],
            "writerCommands": writer.sent if writer else 0, "writerOutcomes": writer_outcomes,
            "writerMergesApplied": len(writer_merges), "writerRowsExpected": len(expected_writer_rows(writer_merges)),
            "localDirMb": args.local_dir_mb if disk else None, "broker": args.broker, "storage": args.storage,
            "s3Hits": [{"kind": h.kind, "method": h.method, "path": h.path, "upstreamStatus": h.upstream_status}
                       for h in proxy.hits()] if proxy else []}
    elapsed = time.monotonic() - started
    return summarize(args, keys, records, malformed, plan, executor_plan, lives, table, dead, twice, complete,
                     offsets_done, ends, app_id, elapsed, fault_report)


PHASE_AFTER_EVENT = {
    "started": "start-up (before the SparkSession)", "session": "start-up (query starting)",
    "query_started": "planning the first batch", "batch_start": "batch started, before the Kafka read",
    "read_start": "Kafka read/decode in flight", "read_end": "sink: materialize / tombstones / MERGE",
    "executor_killed": "right after an executor kill", "merge": "after the MERGE commit, before Spark's offset commit",
}


def phase_of(where: dict[str, Any]) -> str:
    """Where a kill landed, in words: the app's own point, or (wall clock) after its last event."""
    kind = where.get("kind")
    if kind == "commit_before":
        return f"right before the {where.get('table')} commit is written"
    if kind == "commit_after":
        return f"right after the {where.get('table')} commit was written"
    if kind == "mid_read":
        return (f"mid Kafka read (a task of {where.get('topic')}:{where.get('partition')}, "
                f"{where.get('rowsFetched')} records fetched)")
    if kind == "mid_merge":
        return "MERGE files written, commit not"
    if kind == "after_merge_commit":
        return "after the MERGE commit, before Spark's offset commit"
    last = where.get("lastEvent")
    if last == "commit_written":
        table = where.get("lastEventTable")
        return ("after the MERGE commit, before Spark's offset commit" if table == "target"
                else f"after the {table} commit, before the MERGE commit")
    return PHASE_AFTER_EVENT.get(str(last), str(last))


def life_line(life: Life) -> str:
    where = life.killed_at or {}
    what = (f"killed {where.get('kind')} in batch {where.get('batchId')} [{phase_of(where)}]"
            if life.exit_code == -signal.SIGKILL else f"exit {life.exit_code}")
    failed = [name for name, ok in life.checks.items() if not ok]
    execs = "".join(f"; executor {e.get('executorId')} killed {e['kind']}@{e['batchId']}: "
                    + (f"batch finished (executors then {e.get('executorsAfterBatch')})"
                       if e["batchFinished"] else "batch NOT FINISHED")
                    for e in life.executor_kills if e["event"] == "executor_killed")
    return (f"life {life.index:2d}: {what}; batches {life.batches_started[:1]}..{life.batches_started[-1:]} "
            f"txn {life.txn_after} spark commit {life.spark_commit_after}; resumed in {life.to_first_batch_s}s"
            f"{', replay skipped' if life.first_batch_skipped else ''}{execs}"
            f"{'; faults ' + ','.join(f['kind'] for f in life.faults) if life.faults else ''}"
            f"{' (failed under a fault, restarted)' if life.died_under_fault else ''}"
            f"{'; conflict retries ' + str(life.conflict_retries) if life.conflict_retries else ''}"
            f"{'; FAILED CHECKS ' + ','.join(failed) if failed else ''} ({life.seconds:.0f}s)")


def summarize(args: argparse.Namespace, keys: int, records: list[cdc_generator.Record],
              malformed: set[tuple[int, int]], plan: list[KillPlan], executor_plan: list[ExecutorPlan],
              lives: list[Life], table: dict[str, Any], dead: dict[str, Any], twice: dict[str, list[str]],
              complete: dict[str, bool], offsets_done: dict[int, int], ends: dict[int, int], app_id: str | None,
              elapsed: float, faults: dict[str, Any]) -> dict[str, Any]:
    killed = [life for life in lives if life.exit_code == -signal.SIGKILL and life.killed_at]
    kinds = Counter(life.killed_at["kind"] for life in killed if life.killed_at)
    executor_kills = [e for life in lives for e in life.executor_kills if e["event"] == "executor_killed"]
    resumed = [life for life in lives[1:] if life.to_first_batch_s is not None]
    failed_checks = [f"life {life.index}: {name}" for life in lives for name, ok in life.checks.items() if not ok]
    died_alone = [life.index for life in lives
                  if life.exit_code not in (0, -signal.SIGKILL) and not life.died_under_fault]
    died_under_fault = [life.index for life in lives if life.died_under_fault]
    batches = (lives[-1].spark_commit_after + 1) if lives and lives[-1].spark_commit_after is not None else 0
    fired = Counter(f["kind"] for f in faults["fired"])
    writer_failed = [o for o in faults["writerOutcomes"] if not o.get("applied")]
    fault_problems = ([f"not delivered: {n}" for n in faults["notDelivered"]]
                      + [f"broker restart {f['index']}: {f['restartError']}" for f in faults["fired"]
                         if "restartError" in f]
                      + [f"Delta writer {o['kind']} {o['index']}: {o.get('error')}" for o in writer_failed]
                      + ([f"Delta writer: {len(faults['writerOutcomes'])} outcomes of {faults['writerCommands']} "
                          "commands"] if len(faults["writerOutcomes"]) != faults["writerCommands"] else []))
    ok = (table["lost"] == 0 and table["duplicated"] == 0 and table["wrong"] == 0
          and dead["lost"] == 0 and dead["duplicated"] == 0 and dead["unexpected"] == 0
          and not any(twice.values()) and all(complete.values()) and offsets_done == ends
          and len(killed) >= args.kills and len(executor_kills) >= args.executor_kills
          and not failed_checks and not died_alone and lives and lives[-1].exit_code == 0
          and not fault_problems)
    kill_records = []
    for number, life in enumerate(killed, 1):
        after = lives[life.index + 1] if life.index + 1 < len(lives) else None
        where = life.killed_at or {}
        kill_records.append({
            "kill": number, "life": life.index, "kind": where.get("kind"), "phase": phase_of(where),
            "plannedBatch": (life.kill or {}).get("batch"), "batch": where.get("batchId"), "detail": where,
            "txnAfterKill": life.txn_after, "sparkCommitAfterKill": life.spark_commit_after,
            "restartedAtBatch": after.first_batch if after else None,
            "replaySkippedByTxn": after.first_batch_skipped if after else None,
            "restartToFirstBatchS": after.to_first_batch_s if after else None,
            "restartToFirstMergeS": after.to_first_merge_s if after else None})
    checks = [ok for life in lives for ok in life.checks.values()]
    return {
        "verdict": "PASS" if ok else "FAIL",
        "config": {"events": args.events, "keys": keys, "partitions": args.partitions, "seed": args.seed,
                   "maxOffsetsPerTrigger": args.max_offsets_per_trigger, "master": args.master,
                   "kills": args.kills, "executorKills": args.executor_kills, "broker": args.broker,
                   "faults": faults["planned"], "localDirMb": faults["localDirMb"], "storage": args.storage},
        "figures": {
            "changeEvents": args.events, "kafkaRecords": len(records), "malformedRecords": len(malformed),
            "batches": batches, "lives": len(lives), "kills": len(killed), "killsPlanned": len(plan),
            "killsNotReached": [n for life in lives for n in life.notes if "never reached" in n],
            "killsByKind": dict(sorted(kinds.items())),
            "executorKills": len(executor_kills),
            "executorKillsSurvived": sum(1 for e in executor_kills if e["batchFinished"]),
            "executorKillsByKind": dict(Counter(e["kind"] for e in executor_kills)),
            "livesThatDiedOnTheirOwn": died_alone,
            "livesThatFailedUnderAFault": died_under_fault,
            "faultsPlanned": faults["planned"], "faultsFired": {k: fired.get(k, 0) for k in faults["planned"]},
            "faultProblems": fault_problems,
            "brokerDownSeconds": [round(f["downForS"] + f.get("restartS", 0), 1) for f in faults["fired"]
                                  if f["kind"] == "broker_restart"],
            "diskFullSeconds": [f.get("releasedAfterS") for f in faults["fired"] if f["kind"] == "disk_full"],
            "s3FaultHits": dict(Counter(f["kind"] for f in faults["fired"] for _ in range(f.get("hitTimes", 0))
                                        if f["kind"] in S3_FAULT_KINDS)),
            "s3RequestsHit": len(faults.get("s3Hits", [])),
            "deltaWriterCommits": sum(1 for o in faults["writerOutcomes"] if o.get("applied")),
            "deltaWriterConflicts": sum(len(o.get("conflicts", [])) for o in faults["writerOutcomes"]),
            "deltaWriterRowsExpected": faults["writerRowsExpected"],
            "sinkConflictRetries": sum(life.conflict_retries for life in lives),
            "sinkRerunsAndRestages": sum(1 for life in lives for n in life.notes
                                         if "staging it again" in n or "rerunning the batch" in n),
            "wallSeconds": round(elapsed, 1),
            "eventsPerSecond": round(args.events / elapsed, 2) if elapsed else None,
            "meanSecondsToResume": round(statistics.mean(r.to_first_batch_s for r in resumed), 2) if resumed else None,
            "meanSecondsToFirstMerge": round(statistics.mean(r.to_first_merge_s for r in resumed
                                                             if r.to_first_merge_s is not None), 2)
            if any(r.to_first_merge_s is not None for r in resumed) else None,
            "replaysSkippedByTxn": sum(1 for life in lives if life.first_batch_skipped),
            "finalRows": table["rows"], "expectedRows": table["expectedRows"],
            "lost": table["lost"], "duplicated": table["duplicated"], "wrong": table["wrong"],
        },
        "faults": faults,
        "table": table, "deadLetter": dead, "txnCommittedTwice": twice, "logsComplete": complete,
        "finalOffsets": offsets_done, "topicEndOffsets": ends, "queryId": app_id,
        "failedChecks": failed_checks,
        "checksBetweenLives": {"passed": sum(checks), "failed": len(checks) - sum(checks)},
        "killRecords": kill_records,
        "executorKillRecords": executor_kills,
        "executorPlan": [asdict(p) for p in executor_plan],
        "lives": [asdict(life) for life in lives],
        "plan": [asdict(k) for k in plan],
    }


def fault_detail(fault: dict[str, Any], writer_outcomes: list[dict[str, Any]]) -> str:
    """One fired fault in words."""
    if fault["kind"] in S3_FAULT_KINDS:
        what = {"s3_error": f"{fault.get('status')} InternalError x{fault.get('times')}",
                "s3_throttle": f"{fault.get('status')} SlowDown x{fault.get('times')}",
                "s3_slow_put": f"held {fault.get('seconds')}s",
                "s3_lost_answer": "landed, answer dropped"}[fault["kind"]]
        hits = [f"{h['path'].removeprefix('/' + BUCKET + '/')}"
                + (f" (server said {h['upstreamStatus']})" if h.get("upstreamStatus") else "")
                for h in fault.get("hits", [])]
        return f"next PUT of a {fault.get('on')}: {what}; hit {fault.get('hitTimes')}x: {', '.join(hits) or '-'}"
    if fault["kind"] == "broker_restart":
        return (f"broker SIGKILLed, down {fault['downForS']}s, restarted in {fault.get('restartS')}s"
                + (f" ERROR {fault['restartError']}" if "restartError" in fault else ""))
    if fault["kind"] == "disk_full":
        return (f"{fault['ballastBytes'] / 2**20:.1f} MiB ballast ({fault['usedBeforeBytes'] / 2**20:.1f} MiB in use), "
                f"removed after {fault.get('releasedAfterS')}s")
    outcome = next((o for o in writer_outcomes if o["index"] == fault["index"]), None)
    if outcome is None:
        return "Delta writer: no outcome"
    if not outcome.get("applied"):
        return f"Delta writer FAILED: {outcome.get('error')}"
    return (f"Delta {outcome['kind']} committed (table then at version {outcome['tableVersionAfter']}) in "
            f"{outcome['seconds']}s after {len(outcome['conflicts'])} conflicts {outcome['metrics']}")


def print_report(result: dict[str, Any]) -> None:
    f = result["figures"]
    print()
    print(f"events: {f['changeEvents']} change events in {f['kafkaRecords']} Kafka records "
          f"({f['malformedRecords']} malformed); batches: {f['batches']}; lives: {f['lives']}")
    print(f"kills: {f['kills']} process-group SIGKILLs of {f['killsPlanned']} planned, by kind {f['killsByKind']}")
    for note in f["killsNotReached"]:
        print(f"  NOT DELIVERED: {note}")
    for k in result["killRecords"]:
        skipped = {True: "replay skipped by txn", False: "replay applied", None: "-"}[k["replaySkippedByTxn"]]
        print(f"  #{k['kill']:2d} {k['kind']:<18} batch {k['batch']!s:>3} (planned >= {k['plannedBatch']!s:>3}): "
              f"{k['phase']}; restart resumed at batch {k['restartedAtBatch']} in {k['restartToFirstBatchS']}s, "
              f"{skipped}")
    print(f"executor kills: {f['executorKills']} ({f['executorKillsByKind']}), job survived "
          f"{f['executorKillsSurvived']}/{f['executorKills']}")
    for e in result["executorKillRecords"]:
        print(f"  executor {e.get('executorId')} (pid {e.get('pid')}) {e['kind']} in batch {e['batchId']}: "
              f"{'batch finished' if e['batchFinished'] else 'batch NOT finished'} in the same life "
              f"({e.get('batchSeconds')}s; sink reruns {e.get('sinkReruns')}, job re-stagings from Kafka "
              f"{e.get('jobRestages')}; executors after: {e.get('executorsAfterBatch')})")
    print(f"restarts: mean {f['meanSecondsToResume']}s to the first batch, {f['meanSecondsToFirstMerge']}s to "
          f"the first merge; {f['replaysSkippedByTxn']} replays skipped by the Delta txn")
    if any(f["faultsPlanned"].values()):  # a run without --faults prints what it always printed
        print(f"faults on {result['config']['broker']}: fired {f['faultsFired']} of planned {f['faultsPlanned']}")
        for fault in result["faults"]["fired"]:
            print(f"  {fault['kind']:<15} life {fault['life']:2d} batch {fault['batchWhenFired']!s:>3} "
                  f"(planned >= {fault['batch']:3d}): {fault_detail(fault, result['faults']['writerOutcomes'])}")
        if result["config"]["storage"] == "s3":
            print(f"  S3 (moto behind the fault proxy): requests the faults acted on {f['s3RequestsHit']}, "
                  f"by kind {f['s3FaultHits']}")
        print(f"  broker outages (s): {f['brokerDownSeconds']}; disk full (s): {f['diskFullSeconds']}; "
              f"lives that failed under a fault and were restarted: {f['livesThatFailedUnderAFault']}")
        print(f"  Delta Lake writer: {f['deltaWriterCommits']} commits, {f['deltaWriterConflicts']} conflicts it "
              f"reran; its {f['deltaWriterRowsExpected']} rows expected in the table; the sink's conflict retries: "
              f"{f['sinkConflictRetries']}; sink reruns / job re-stagings: {f['sinkRerunsAndRestages']}")
        for problem in f["faultProblems"]:
            print(f"  FAULT PROBLEM: {problem}")
    print(f"total wall time: {f['wallSeconds']:.0f}s ({f['wallSeconds'] / 60:.1f} min); "
          f"{f['eventsPerSecond']} change events/s")
    print(f"final rows: {f['finalRows']} (expected {f['expectedRows']})")
    d = result["deadLetter"]
    print(f"dead letter: {d['rows']} rows, expected {d['expected']} (lost {d['lost']}, duplicated "
          f"{d['duplicated']}, unexpected {d['unexpected']})")
    print(f"txns committed twice: {result['txnCommittedTwice']}; Spark's final offsets "
          f"{result['finalOffsets']} vs topic ends {result['topicEndOffsets']}")
    c = result["checksBetweenLives"]
    print(f"checks between lives (monotonic txn and Spark commits, resume point, replay skipped exactly "
          f"when the txn is held, executor kills survived, no process outliving a kill): {c['passed']} passed, "
          f"{c['failed']} failed")
    if result["failedChecks"]:
        print(f"FAILED CHECKS: {result['failedChecks']}")
    if f["livesThatDiedOnTheirOwn"]:
        print(f"lives that died on their own: {f['livesThatDiedOnTheirOwn']}")
    t = result["table"]
    if t["lost"] or t["duplicated"] or t["wrong"]:
        print(f"lost keys {t['lostKeys']} duplicated keys {t['duplicatedKeys']} wrong keys {t['wrongKeys']} "
              f"unexpected keys {t['unexpectedKeysSample']}")
    print(f"{f['lost']} lost, {f['duplicated']} duplicated, {f['wrong']} wrong")
    print(f"VERDICT: {result['verdict']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # The 21+ restarts dominate: each life costs ~25 s to its first batch and ~25 s for that
    # (cold) batch on local-cluster here, a warm batch ~6 s. 1200 events / 40 per trigger
    # (~36 batches) keeps a default run near 20 min on the 2-core machine of record.
    parser.add_argument("--events", type=int, default=1200, help="change events (Kafka records: ~18 %% more)")
    parser.add_argument("--keys", type=int, default=None, help="distinct keys (default events / 10)")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=40, help="Kafka records per batch at most")
    parser.add_argument("--kills", type=int, default=20, help="process-group SIGKILLs (at least)")
    parser.add_argument("--executor-kills", type=int, default=3, help="executor JVM SIGKILLs (local-cluster only)")
    parser.add_argument("--master", default="local-cluster[2,1,1024]",
                        help="Spark master of the job, e.g. 'local[2]' (no executor JVMs to kill)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--broker", choices=("tansu", "apache"), default=None,
                        help="the embedded Tansu broker (default) or Apache Kafka (devtools/kafka_server.py; "
                        "the default with broker restarts)")
    parser.add_argument("--faults", choices=("none", "all"), default="none",
                        help=f"'all': the faults of a real deployment, each {ALL_FAULTS} unless its own flag "
                        "says otherwise, on Apache Kafka")
    parser.add_argument("--broker-restarts", type=int, default=None, help="SIGKILLs and restarts of Apache Kafka")
    parser.add_argument("--delta-merges", type=int, default=None,
                        help="Delta Lake MERGEs of other keys on the target, from another process")
    parser.add_argument("--delta-optimizes", type=int, default=None, help="Delta Lake OPTIMIZEs of the target")
    parser.add_argument("--disk-fills", type=int, default=None,
                        help="times the job's spark.local.dir (a tmpfs, needs root) is filled up")
    parser.add_argument("--local-dir-mb", type=int, default=256, help="size of that tmpfs")
    parser.add_argument("--storage", choices=("local", "s3"), default="local",
                        help="'s3': the target, tombstone and dead-letter tables on s3a:// in moto's S3 "
                        "(devtools/s3_server.py), the job reaching it through the fault proxy (devtools/s3_faults.py); "
                        "--faults all then adds the S3 faults and leaves out Delta Lake's writer")
    parser.add_argument("--s3-errors", type=int, default=None, help="PUTs answered 500 InternalError (1-3 in a row)")
    parser.add_argument("--s3-throttles", type=int, default=None, help="PUTs answered 503 SlowDown (1-3 in a row)")
    parser.add_argument("--s3-slow-puts", type=int, default=None, help="PUTs held 1 s + 0-1.5 median batches")
    parser.add_argument("--s3-lost-answers", type=int, default=None,
                        help="commit PUTs that land while their answer is dropped (the client sees a reset)")
    parser.add_argument("--life-timeout", type=float, default=LIFE_TIMEOUT_S,
                        help="seconds after which a life is deemed hung and killed (a guard)")
    parser.add_argument("--json", default=None, help="write the figures, kills and lives here as JSON")
    parser.add_argument("--workdir", default=None, help="tables, checkpoint and each life's events and log "
                        "(default: a temporary folder, removed after a PASS)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder after a PASS too")
    args = parser.parse_args(argv)
    s3_flags = (args.s3_errors, args.s3_throttles, args.s3_slow_puts, args.s3_lost_answers)
    if args.storage != "s3" and any(flag for flag in s3_flags):
        parser.error("the S3 faults need --storage s3")
    if args.storage == "s3" and (args.delta_merges or args.delta_optimizes):
        # Delta Lake's LogStore for s3a (S3SingleDriverLogStore) checks then writes: safe only when
        # every writer of the table is in one driver, which the soak's two processes are not.
        parser.error("--delta-merges / --delta-optimizes need --storage local: Delta Lake's S3 log store "
                     "(S3SingleDriverLogStore) has no put-if-absent across processes")
    counts = fault_counts(args)
    if args.broker is None:
        args.broker = "apache" if counts["broker_restart"] else "tansu"
    if counts["broker_restart"] and args.broker != "apache":
        parser.error("--broker-restarts needs --broker apache (the embedded broker keeps its log in memory)")
    if args.executor_kills and not args.master.startswith("local-cluster"):
        parser.error(f"--executor-kills needs a local-cluster master (no executor JVMs under {args.master}); "
                     "pass --executor-kills 0")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="soak_"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"workdir {workdir}", flush=True)
    result = run(args, workdir)
    print_report(result)
    if args.workdir is None and result["verdict"] == "PASS" and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"kept {workdir} (tables, checkpoint, each life's events and log)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    return 0 if result["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
