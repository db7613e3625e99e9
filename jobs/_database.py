"""A whole database in one job: every Debezium topic matching a pattern → its own Delta table,
in one streaming query, exactly once per table.

    python -m jobs.kafka_cdc_ingest --bootstrap-servers 127.0.0.1:9092 \\
        --subscribe-pattern 'dbserver1\\.inventory\\..*' --target-root /lake/inventory \\
        --checkpoint /chk/inventory --dead-letter /lake/inventory_dead_letter

One foreachBatch, per micro-batch:

1. **Stage** the batch's Kafka records once (a local checkpoint; the only Kafka read),
   with two small per-record columns: the record key's field names and a hash of the
   value's Debezium ``schema`` (NULL for plain envelopes).
2. **Profile**: one aggregation over the copy, grouped by topic × key layout × schema
   hash, collects a handful of rows (counts, the newest record's coordinates, one schema
   text per variant). Every decision below is made on the driver from these rows, so it is
   the same on a replay of the batch (the records are the same).
3. **Plan** each topic (``routing``): its table path; its keys (``--keys``, else the field
   names of the newest record key); its row schema (the table's once it exists, else the
   newest Debezium schema, else inference), evolved by the new fields of the other schema
   variants; the records that cannot be applied (no table, no key, a key of another layout,
   a schema variant whose type change does not fit the table) with their reason.
4. **Decode** each table's records from the copy (``debezium.decode_batch``: one Spark job
   per table, no Kafka read), then **dead-letter** everything that cannot be applied in one
   append (``txn(<query id>:malformed, batch)``).
5. **Merge** table by table, in path order: add the new columns (a commit of its own,
   idempotent: only missing columns are added), then the table's MergeSink commits its
   rows with ``txn(<query id>, batch)``. A crash between two tables' commits replays the
   batch: tables that hold the txn skip it, the others apply it.

Why one decode per table and not one for all: each table's row images have their own
types, and ``from_json`` takes one schema; the per-table jobs read the staged copy only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StringType, StructField, StructType

from jobs._common import (
    ChangeSettings,
    MalformedRecordsError,
    change_options,
    progress_line,
    row_columns,
    staged_again_on_lost_blocks,
    start_query,
)
from jobs._graceful_stop import GracefulStop
from streaming_merge import MergeSink
from streaming_merge.errors import NotADeltaTableError, StreamingMergeError
from streaming_merge.kafka import debezium
from streaming_merge.kafka.routing import (
    DEBEZIUM_TOPIC_REGEX,
    DEFAULT_TABLE_PATH_TEMPLATE,
    TopicRouter,
    UnroutableTopicError,
    connect_row_schema,
    incompatible_columns,
    record_key_fields,
)
from streaming_merge.merge.materialize import (
    release,
    storage_level,
)
from streaming_merge.table.append import append_rows
from streaming_merge.table.commit import add_columns
from streaming_merge.table.follow import FollowedTable
from streaming_merge.table.location import resolve
from streaming_merge.table.schema import evolve

log = logging.getLogger("jobs.kafka_cdc_ingest.database")

__all__ = ["DatabaseBatches", "DatabaseConfig", "TopicPlan", "Variant", "plan_topic", "start_database"]

# Staged per-record columns beside the Kafka ones (prefixed: no row column can collide).
_KEY_FIELDS, _SCHEMA_ID, _REASON = "__db_key_fields", "__db_schema_id", "__db_reason"
_KAFKA = ("key", "value", "topic", "partition", "offset")


@dataclass(frozen=True)
class DatabaseConfig(ChangeSettings):
    """The multi-table job's settings (``python -m jobs.kafka_cdc_ingest --subscribe-pattern``)."""

    bootstrap_servers: str
    subscribe_pattern: str
    target_root: str | None
    checkpoint: str
    # empty: each table's keys are the field names of its Kafka record keys
    keys: list[str] = field(default_factory=list)
    table_path_template: str = DEFAULT_TABLE_PATH_TEMPLATE
    topic_regex: str = DEBEZIUM_TOPIC_REGEX

    def router(self) -> TopicRouter:
        """Raises ValueError for a template/regex that cannot route (checked at job start)."""
        return TopicRouter.of(self.target_root, self.table_path_template, self.topic_regex)


@dataclass(frozen=True)
class Variant:
    """One group of a topic's records in a batch: same key layout, same Debezium schema."""

    key_fields: tuple[str, ...] | None  # the record key's field names; None: not a JSON object
    schema_id: int | None  # hash of the value's Debezium schema; None: plain envelope (or tombstone)
    records: int  # Kafka records, tombstones included
    values: int  # records with a value (tombstones excluded)
    newest: tuple[Any, ...]  # (timestamp, partition, offset) of its newest record
    row_schema: StructType | None  # from the Debezium schema, when it has one



@dataclass(frozen=True)
class TopicPlan:
    """What one batch does with one topic; see :func:`plan_topic`."""

    topic: str
    variants: tuple[Variant, ...]
    path: str | None  # None: the topic has no table
    keys: tuple[str, ...]
    row_schema: StructType | None  # None: to be inferred (a new table of plain envelopes)
    new_columns: tuple[StructField, ...]  # to add to the existing table before the MERGE
    rejected: dict[Variant, str]  # variants whose records go to the dead letter, and why

    @property
    def num_rejected(self) -> int:
        return sum(v.values for v in self.rejected)

    @property
    def num_accepted(self) -> int:
        return sum(v.values for v in self.variants if v not in self.rejected)

    def reject_all(self, reason: str) -> TopicPlan:
        return dataclasses.replace(self, rejected={v: self.rejected.get(v, reason) for v in self.variants})


def plan_topic(topic: str, variants: Sequence[Variant], router: TopicRouter, keys: Sequence[str],
               table_schema: StructType | None, known_keys: Sequence[str] = ()) -> TopicPlan:
    """The batch's decisions for one topic, from its variants only (so a replay decides the
    same). ``table_schema``: the existing table's row columns, or None for a new table.
    ``known_keys``: the keys the table was merged by earlier in this process, for a batch
    whose records of the topic carry no key (e.g. only a truncate)."""
    plan = TopicPlan(topic, tuple(variants), None, (), table_schema, (), {})
    try:
        plan = dataclasses.replace(plan, path=router.route(topic))
    except UnroutableTopicError as exc:
        return plan.reject_all(str(exc))
    by_recency = sorted(variants, key=lambda v: _order(v.newest), reverse=True)
    rejected: dict[Variant, str] = {}
    if not keys:
        layout = next((v.key_fields for v in by_recency if v.key_fields), None) or (tuple(known_keys) or None)
        if layout is None:
            return plan.reject_all(f"topic '{topic}' has no key columns: its Kafka record keys are not JSON objects "
                                   "(a table without a primary key?); give --keys")
        keys = layout
        for v in variants:
            if v.key_fields and sorted(v.key_fields) != sorted(layout):
                rejected[v] = (f"Kafka record key fields {list(v.key_fields)} differ from the keys {list(layout)} "
                               f"of `{plan.path}` (the newest record key of topic '{topic}' in this batch)")
    row_schema = table_schema
    for v in by_recency:  # the newest schema decides the type of a column two variants add
        if v.row_schema is None or v in rejected:
            continue
        if row_schema is None:
            row_schema = v.row_schema
            continue
        reasons = incompatible_columns(row_schema, v.row_schema, plan.path or "")
        if reasons:
            rejected[v] = "; ".join(reasons)
        else:
            row_schema = evolve(row_schema, v.row_schema)
    if row_schema is not None:
        row_schema = _with_encodings(row_schema, [v.row_schema for v in by_recency
                                                  if v.row_schema is not None and v not in rejected])
    new_columns: tuple[StructField, ...] = ()
    if table_schema is not None and row_schema is not None:
        known = {f.name.lower() for f in table_schema.fields}
        new_columns = tuple(f for f in row_schema.fields if f.name.lower() not in known)
    plan = dataclasses.replace(plan, keys=tuple(keys), row_schema=row_schema, new_columns=new_columns,
                               rejected=rejected)
    return plan if row_schema is None else checked_keys(plan)


def _with_encodings(row_schema: StructType, newest_first: Sequence[StructType]) -> StructType:
    """The row schema with each column's wire encoding (``logical.LOGICAL`` metadata) from the
    newest Debezium schema that has the column with the same type: a table's schema does not
    say whether its timestamp_ntz came as ms or µs, the record's schema does."""
    def annotated(field: StructField) -> StructField:
        for schema in newest_first:
            match = next((f for f in schema.fields if f.name.lower() == field.name.lower()), None)
            if match is not None and match.dataType == field.dataType:
                return StructField(field.name, field.dataType, field.nullable, match.metadata)
        return field
    return StructType([annotated(f) for f in row_schema.fields])


def checked_keys(plan: TopicPlan) -> TopicPlan:
    """Keys that are not row columns cannot be merged by (and the decode could not test them
    for NULL): the topic's records go to the dead letter."""
    assert plan.row_schema is not None
    names = {f.name.lower() for f in plan.row_schema.fields}
    missing = [k for k in plan.keys if k.lower() not in names]
    if not missing:
        return plan
    return plan.reject_all(f"key column(s) {missing} of topic '{plan.topic}' are not in the row schema "
                           f"{plan.row_schema.fieldNames()} of `{plan.path}`")


def _order(newest: tuple[Any, ...]) -> tuple[Any, ...]:
    """Sort key of (timestamp, partition, offset) with NULLs first, like Spark's max."""
    return tuple((value is not None, value) for value in newest)


def _schema_id(value: Column) -> Column:
    """A hash of the value's Debezium ``schema`` (NULL for plain envelopes and tombstones):
    records of one schema variant share it, so the profile groups by it."""
    schema = F.get_json_object(value.cast("string"), "$.schema")
    return F.when(schema.isNotNull(), F.xxhash64(schema))


def _profile(staged: DataFrame) -> dict[str, list[Variant]]:
    """The batch's variants per topic: one aggregation over the staged copy; a few rows
    (topics × key layouts × schemas), each with one schema text, come to the driver."""
    sample = F.first(F.when(F.col(_SCHEMA_ID).isNotNull(), F.col("value")), ignorenulls=True)
    rows = (staged.groupBy("topic", _KEY_FIELDS, _SCHEMA_ID)
            .agg(F.count(F.lit(1)).alias("records"), F.count("value").alias("values"),
                 F.max(F.struct("timestamp", "partition", "offset")).alias("newest"), sample.alias("sample"))
            .select("topic", _KEY_FIELDS, _SCHEMA_ID, "records", "values", "newest",
                    F.get_json_object(F.col("sample").cast("string"), "$.schema").alias("schema"))
            .collect())
    variants: dict[str, list[Variant]] = {}
    for row in rows:
        fields = row[_KEY_FIELDS]
        variants.setdefault(row["topic"], []).append(Variant(
            key_fields=tuple(fields) if fields else None, schema_id=row[_SCHEMA_ID], records=int(row["records"]),
            values=int(row["values"]), newest=tuple(row["newest"]),
            row_schema=connect_row_schema(row["schema"]) if row["schema"] else None))
    return variants


def _same(column: str, value: Any) -> Column:
    if value is None:
        return F.col(column).isNull()
    literal = F.array(*[F.lit(v) for v in value]) if isinstance(value, tuple) else F.lit(value)
    return F.col(column) == literal


def _scored(staged: DataFrame, plans: Sequence[TopicPlan]) -> DataFrame:
    """The staged records with the reason each cannot be applied (NULL: decode it), from
    the plans' rejected variants; tombstones are never dead letters."""
    reason: Any = F.when(F.col("value").isNull(), F.lit(None).cast("string"))
    rejects = 0
    for plan in plans:
        everything = len(plan.rejected) == len(plan.variants) and len(set(plan.rejected.values())) == 1
        for variant, text in plan.rejected.items():
            condition = F.col("topic") == plan.topic
            if not everything:
                condition = condition & _same(_KEY_FIELDS, variant.key_fields) & _same(_SCHEMA_ID, variant.schema_id)
            reason = reason.when(condition, F.lit(text))
            rejects += 1
            if everything:
                break
    if not rejects:
        reason = F.lit(None).cast("string")
    return staged.select(*_KAFKA, _KEY_FIELDS, _SCHEMA_ID, reason.alias(_REASON))


@dataclass
class _Table:
    plan: TopicPlan
    decoded: debezium.DecodedBatch | None = None


class DatabaseBatches:
    """The foreachBatch callable of the multi-table job; keeps one MergeSink per table
    across batches (created when its topic first appears, re-created if its keys change).

    ``on_progress``: one record per batch (counts and every table's MergeSink progress);
    ``on_table_progress``: each table's progress right after its commit, before the next
    table's MERGE starts (the CLI prints it; tests kill the process there)."""

    def __init__(self, config: DatabaseConfig, on_progress: Callable[[dict[str, Any]], None],
                 on_table_progress: Callable[[dict[str, Any]], None] | None = None,
                 on_phase: Callable[[str], None] | None = None) -> None:
        self.config = config
        self._on_phase = on_phase
        self.router = config.router()
        self._on_progress = on_progress
        self._on_table_progress = on_table_progress
        self.sinks: dict[str, MergeSink] = {}
        self.table_keys: dict[str, tuple[str, ...]] = {}  # table path → the keys its sink merges by
        self._owners: dict[str, str] = {}  # table path → the topic routed there in this process
        # table path → its log, followed from batch to batch (each batch reads only the commits since)
        self._followed: dict[str, FollowedTable] = {}

    def __call__(self, records: DataFrame, batch_id: int) -> None:
        self._on_progress(staged_again_on_lost_blocks(self._run_once, records, batch_id))

    def _run_once(self, records: DataFrame, batch_id: int, level: str) -> dict[str, Any]:
        spark = records.sparkSession
        staged = records.select(
            *_KAFKA, "timestamp",
            F.when(F.size(record_key_fields(F.col("key"))) > 0, record_key_fields(F.col("key"))).alias(_KEY_FIELDS),
            _schema_id(F.col("value")).alias(_SCHEMA_ID),
        ).localCheckpoint(eager=True, storageLevel=storage_level(level))
        tables: list[_Table] = []
        try:
            variants = _profile(staged)
            plans = [self._with_row_schema(staged, self._plan(spark, topic, topic_variants))
                     for topic, topic_variants in sorted(variants.items())]
            scored = _scored(staged, plans)
            for plan in plans:
                if plan.path is None or plan.row_schema is None or not plan.num_accepted:
                    tables.append(_Table(plan))
                    continue
                topic_records = scored.filter(F.col("topic") == plan.topic)
                if plan.rejected:
                    topic_records = topic_records.filter(F.col(_REASON).isNull())
                tables.append(_Table(plan, debezium.decode_batch(topic_records.select(*_KAFKA), plan.row_schema,
                                                                 keys=plan.keys, storage_level_name=level,
                                                                 truncates=self.config.apply_truncates)))
            rejected = sum(p.num_rejected for p in plans)
            malformed = rejected + sum(t.decoded.num_malformed for t in tables if t.decoded)
            if malformed:
                self._dead_letter(spark, scored, tables, rejected, malformed, batch_id)
            table_progress = [self._merge(spark, table, batch_id)
                              for table in sorted(tables, key=lambda t: t.plan.path or "")
                              if table.decoded is not None and table.decoded.num_events]
        finally:
            for table in tables:
                if table.decoded is not None:
                    table.decoded.release()
            release(staged)
        records_count = sum(v.records for vs in variants.values() for v in vs)
        values_count = sum(v.values for vs in variants.values() for v in vs)
        return {"batchId": batch_id, "kafkaRecords": records_count, "tombstones": records_count - values_count,
                "malformedRecords": malformed, "tables": table_progress}

    def _table(self, spark: SparkSession, path: str) -> FollowedTable:
        if path not in self._followed:
            self._followed[path] = FollowedTable(resolve(path, spark, self.config.storage_options))
        return self._followed[path]

    def _plan(self, spark: SparkSession, topic: str, variants: list[Variant]) -> TopicPlan:
        """Route the topic, read its table's schema (the commits since the last batch), plan it."""
        table_schema = None
        try:
            path = self.router.route(topic)
        except UnroutableTopicError:
            path = None
        if path is not None:
            owner = self._owners.setdefault(path, topic)
            if owner != topic:
                raise StreamingMergeError(
                    f"Topics '{owner}' and '{topic}' both route to `{path}`; give a --table-path-template (and "
                    "--topic-regex) that tells their tables apart. Nothing of this batch was written.")
            snapshot = self._table(spark, path).latest()
            if snapshot is not None:
                table_schema = row_columns(snapshot.schema)
        return plan_topic(topic, variants, self.router, self.config.keys, table_schema,
                          known_keys=self.table_keys.get(path or "", ()))

    def _with_row_schema(self, staged: DataFrame, plan: TopicPlan) -> TopicPlan:
        """A new table of plain envelopes (no Debezium schema): infer its row schema from
        the topic's row images (its first batch only; a pass over the staged copy)."""
        if plan.row_schema is not None or plan.path is None or not plan.num_accepted:
            return plan
        inferred = debezium.infer_row_schema(staged.filter(F.col("topic") == plan.topic))
        # No row image at all: the keys alone (as strings) let the decode name each record's fault.
        row_schema = inferred if inferred.fields else StructType([StructField(k, StringType()) for k in plan.keys])
        return checked_keys(dataclasses.replace(plan, row_schema=row_schema))

    def _dead_letter(self, spark: SparkSession, scored: DataFrame, tables: list[_Table], rejected: int,
                     malformed: int, batch_id: int) -> None:
        """All of the batch's records that cannot be applied, in one append with the
        batch's txn (a replay skips it), before any table's MERGE."""
        if self.config.on_malformed == "fail" or not self.config.dead_letter:
            reasons = sorted({r for t in tables for r in t.plan.rejected.values()})[:3]
            raise MalformedRecordsError(
                f"Batch {batch_id}: {malformed} Kafka record(s) cannot be applied ({rejected} before decoding, e.g. "
                f"{reasons}); configure --dead-letter (on_malformed=dead_letter) to divert them.")
        frames = [t.decoded.malformed for t in tables if t.decoded is not None and t.decoded.num_malformed]
        if rejected:
            frames.append(scored.filter(F.col(_REASON).isNotNull()).select(
                "key", "value", F.col(_REASON).alias("error"), "topic", "partition", "offset",
                F.current_timestamp().alias("recorded_at")))
        union = frames[0]
        for frame in frames[1:]:
            union = union.unionByName(frame)
        app_id = spark.sparkContext.getLocalProperty("sql.streaming.queryId") or "kafka_cdc_ingest"
        append_rows(spark, union, resolve(self.config.dead_letter, spark, self.config.storage_options),
                    f"{app_id}:malformed", batch_id)

    def _sink(self, path: str, keys: tuple[str, ...]) -> MergeSink:
        if self.table_keys.get(path) != keys:
            if path in self.table_keys:
                log.warning("Table %s: keys change from %s to %s (the topic's record keys changed)", path,
                            list(self.table_keys[path]), list(keys))
            config = self.config
            on_phase = self._on_phase
            self.sinks[path] = MergeSink(path, keys=list(keys), **change_options(config),
                                         phase_hook=(lambda phase, _: on_phase(phase)) if on_phase else None)
            self.table_keys[path] = keys
        return self.sinks[path]

    def _merge(self, spark: SparkSession, table: _Table, batch_id: int) -> dict[str, Any]:
        """Add the table's new columns (idempotent), then its MERGE with the batch's txn."""
        plan, decoded = table.plan, table.decoded
        assert plan.path is not None and decoded is not None
        if plan.new_columns:
            snapshot = self._table(spark, plan.path).latest()
            if snapshot is None:  # it existed when the batch was planned
                raise NotADeltaTableError(f"`{plan.path}` is no longer a Delta table; nothing of this batch was "
                                          "written to it.")
            evolved = evolve(snapshot.schema, StructType(list(plan.new_columns)))
            if len(evolved.fields) > len(snapshot.schema.fields):
                log.info("Table %s: adding column(s) %s", plan.path,
                         [f.name for f in evolved.fields[len(snapshot.schema.fields):]])
                add_columns(snapshot, evolved)
        sink = self._sink(plan.path, plan.keys)
        sink(decoded.events, batch_id)
        progress = {**(sink.lastProgress or {}), "topic": plan.topic, "malformedRecords": decoded.num_malformed,
                    "addedColumns": [f.name for f in plan.new_columns]}
        if self._on_table_progress is not None:
            self._on_table_progress(progress)
        return progress


def start_database(spark: SparkSession, config: DatabaseConfig,
                   on_progress: Callable[[dict[str, Any]], None] | None = None,
                   on_table_progress: Callable[[dict[str, Any]], None] | None = None,
                   stopping: GracefulStop | None = None) -> StreamingQuery:
    """Start the multi-table ingestion query (does not wait). Without callbacks it prints
    one line per table and batch, as the single-table job prints one per batch; ``stopping``
    lets a batch finish on SIGTERM."""
    if on_progress is None and on_table_progress is None:
        on_table_progress = lambda p: print(progress_line(p), flush=True)  # noqa: E731
    function = DatabaseBatches(config, on_progress or _log_batch, on_table_progress,
                               on_phase=stopping.phase_hook if stopping else None)
    return start_query(spark, config, ("subscribePattern", config.subscribe_pattern),
                       stopping.wrap(function) if stopping else function, config.bootstrap_servers, config.checkpoint)


def _log_batch(progress: dict[str, Any]) -> None:
    log.info("Batch %s: %s", progress["batchId"],
             json.dumps({k: v for k, v in progress.items() if k != "tables"}, default=str))
