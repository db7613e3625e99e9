"""The one-pass rewrite for a broadcast source and a large target: no findTouchedFiles scan.

Past ``MergeOptions.broadcast_scan_min_bytes`` of candidates, Delta's two passes stream the
target past the broadcast source twice: findTouchedFiles reads the key columns of every
candidate to learn the touched files and the source rows that matched nothing (the inserts),
then writeAllChanges reads every touched file again and rewrites it map-side. When the
source's keys are unique and it holds enough rows to touch every candidate, one read does:
every candidate is rewritten map-side (target LEFT OUTER JOIN broadcast(source)) while the same
job observes which candidates held a matched row and which source keys matched. The inserts
are then the source rows whose key is not in that set: a broadcast anti join over the
source alone, with the key set built in the JVM from the observed rows (it never reaches
Python; it is at most the source's keys, which the broadcast already holds on the driver).

When a candidate turns out untouched, the files are deleted and the caller rewrites the
touched ones (Delta's files and metrics either way), as with the shuffled one pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from py4j.protocol import Py4JError
from pyspark.serializers import CPickleSerializer
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from streaming_merge.merge.key_presence import outside_candidate_ranges
from streaming_merge.merge.resolve import SOURCE_PRESENT, ResolvedMerge
from streaming_merge.merge.rewrite import (
    FileLayout,
    RewriteResult,
    RowAggregate,
    TouchProbe,
    inserted_rows,
    joined_twice,
    observed,
    rewrite_map_side,
    split_touched,
    touch_observations,
    with_rows_per_key,
    write_frame,
    write_inserts_only,
)
from streaming_merge.merge.touched import scan_with_file_ids
from streaming_merge.table.snapshot import DataFile, Snapshot
from streaming_merge.table.write import delete_written

MATCHED_KEYS = "matchedSourceKeys"


def write_map_side_one_pass(spark: SparkSession, snapshot: Snapshot, candidates: Sequence[DataFile],
                            source: DataFrame, resolved: ResolvedMerge, probe: TouchProbe, layout: FileLayout,
                            inserts_layout: FileLayout) -> RewriteResult:
    """Rewrite every candidate map-side and, when every one was touched and no matched key has
    two source rows (counted on the source when ``probe.count_keys``: a key then names one
    source row), insert the source rows whose key matched nothing. ``inserts_layout`` cuts the
    inserts' own files. Otherwise only the rewrite ran, and its files are already deleted; the
    result's ``touched`` and ``matched_key_shared`` say why (a target row joined twice, see
    rewrite.joined_twice, is reported as a shared key).

    Source rows whose key lies outside every candidate's key range (new keys, in a CDC
    stream) cannot match: they are inserted by the rewrite's own job and only the others are
    broadcast. When every one of those others then matched, no insert pass is left (5M x
    100k, every insert a new key: the pass's Spark jobs 4 -> 2)."""
    outside = (outside_candidate_ranges(snapshot, candidates, list(zip(probe.target_keys, probe.source_keys,
                                                                       strict=True)), source.schema)
               if resolved.not_matched else None)
    maybe_matched = source if outside is None else source.filter(~outside)
    side = with_rows_per_key(maybe_matched, probe.source_keys) if probe.count_keys else maybe_matched
    target = scan_with_file_ids(spark, snapshot, candidates, resolved, probe.file_ids, keep_row_index=False)
    output, src_obs, target_obs = rewrite_map_side(
        target, side, resolved,
        [*touch_observations(resolved, probe, resolved.clauses.is_matched_only), _matched_keys(resolved, probe)])
    outside_obs = Observation()
    sure_inserts = (None if outside is None else
                    inserted_rows(resolved, source.filter(outside), outside_obs, F.count(F.lit(1)).alias("rows")))
    written = write_frame(spark, snapshot, output, resolved, layout, sure_inserts, map_side=True)
    try:
        try:
            counts, touched, shared, matched_keys = _observed(target_obs)
        except Py4JError:  # no metrics row: Spark removed the node over an input it proved empty
            delete_written(spark, snapshot.location, written)
            return RewriteResult([], {}, frozenset(), matched_key_shared=True)  # let findTouchedFiles decide
        broadcast_rows = observed(src_obs).get("rows", 0)
        outside_counts = observed(outside_obs) if outside is not None else {}
        counts["numSourceRowsInSecondScan"] = broadcast_rows + outside_counts.get("rows", 0)
        shared = shared or joined_twice(counts, candidates)
        positions = {probe.file_ids.position(file_id) for file_id in touched}
        if shared or None in positions or len(positions) != len(candidates):
            delete_written(spark, snapshot.location, written)
            return RewriteResult([], counts, frozenset(touched), shared)
        if not resolved.not_matched:
            counts["numTargetRowsInserted"] = 0
            return RewriteResult(written, counts, frozenset(touched))
        inserted = outside_counts.get("numTargetRowsInserted", 0)
        if int(matched_keys.size()) == broadcast_rows:  # every row that could match did (a key names one row)
            counts["numTargetRowsInserted"] = inserted
            return RewriteResult(written, counts, frozenset(touched))
        unmatched = maybe_matched.alias("u").join(
            F.broadcast(_key_frame(spark, matched_keys, source, probe.source_keys).alias("m")),
            _same_keys(probe.source_keys), "left_anti")
        rest = write_inserts_only(spark, snapshot, [], source, resolved, layout=inserts_layout,
                                  source_count_metric="unmatchedSourceRows", unmatched_source=unmatched,
                                  change_rows=resolved.change_data)
    except BaseException:
        delete_written(spark, snapshot.location, written)
        raise
    counts["numTargetRowsInserted"] = inserted + rest.counts.get("numTargetRowsInserted", 0)
    return RewriteResult(written + rest.files, counts, frozenset(touched))


def _matched_keys(resolved: ResolvedMerge, probe: TouchProbe) -> RowAggregate:
    """The source keys of the matched rows, as a set of structs: the observation's last
    aggregate (see _observed)."""
    def build() -> RowAggregate:
        key = F.struct(*[F.col(f"{resolved.source_alias}.`{k}`").alias(k) for k in probe.source_keys])
        return RowAggregate(MATCHED_KEYS, F.when(F.col(SOURCE_PRESENT).isNotNull(), key), F.collect_set)

    return resolved.derive(("map-side-matched-keys", probe.source_keys), build)


def _observed(observation: Observation) -> tuple[dict[str, int], set[int], bool, Any]:
    """The counts, the touched candidates' ids and whether a matched key was shared (see
    split_touched), converted to Python, and the matched keys
    left in the JVM (a Scala sequence of rows): the metrics row is cut there, so only its small
    part is pickled. Raises Py4JError when no metrics row arrived."""
    row = observation._jo.getRow()  # type: ignore[union-attr]
    schema = row.schema()
    keys_at = int(schema.fieldIndex(MATCHED_KEYS))
    assert keys_at == int(row.length()) - 1, "the matched keys are the observation's last aggregate"
    jvm = observation._jvm
    assert jvm is not None
    head = row.toSeq().take(keys_at).toArray(jvm.scala.reflect.ClassTag.Any())
    small = jvm.org.apache.spark.sql.catalyst.expressions.GenericRowWithSchema(
        head, jvm.org.apache.spark.sql.types.StructType(schema.fields()[:keys_at]))
    values = CPickleSerializer().loads(jvm.org.apache.spark.sql.api.python.PythonSQLUtils.toPyRow(small)).asDict()
    return (*split_touched(values), row.getSeq(keys_at))


def _key_frame(spark: SparkSession, keys: Any, source: DataFrame, key_columns: Sequence[str]) -> DataFrame:
    """The matched keys (a Scala sequence of rows) as a local DataFrame, built in the JVM."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    fields = {f.name: f for f in source.schema.fields}
    schema = jvm.org.apache.spark.sql.types.DataType.fromJson(StructType([fields[k] for k in key_columns]).json())
    rows = jvm.scala.jdk.javaapi.CollectionConverters.asJava(keys)
    return DataFrame(spark._jsparkSession.createDataFrame(rows, schema), spark)


def _same_keys(key_columns: Sequence[str]) -> Column:
    """Null-safe key equality: an ON condition with ``<=>`` can match a NULL key."""
    condition: Column | None = None
    for k in key_columns:
        equal = F.col(f"u.`{k}`").eqNullSafe(F.col(f"m.`{k}`"))
        condition = equal if condition is None else condition & equal
    assert condition is not None
    return condition
