"""Each private Spark or py4j use the library keeps (bench/private_apis.md) still does what it is
kept for on this Spark and py4j: a test per use that calls the private path itself, never the
fallback the library takes when it breaks, so that an upgrade that breaks one fails here, loudly.

The TCP_NODELAY connections (tests/spark/test_answers_at_once.py), the metrics source
(tests/spark/test_spark_metrics.py) and the class archive's JVM process
(tests/spark/test_class_archive_session.py) have tests of their own."""

from __future__ import annotations

from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F

from streaming_merge.spark import constant_lookup, python_sources, slots
from streaming_merge.spark.observed_longs import long_list, longs, observed_row


def test_the_installed_data_source_search_is_answered_through_sparks_private_field(spark: SparkSession) -> None:
    """``python_sources`` sets ``DataSourceManager.dataSourceBuilders`` (a private var of Spark's
    object) to an empty map; ``register_data_source`` swallows any failure of that, so this
    calls it directly."""
    manager = python_sources._manager(spark)
    getattr(manager, "dataSourceBuilders_$eq")(spark._jvm.scala.Option.empty())  # as in a new JVM
    assert python_sources._lookup_would_find_nothing(spark)
    python_sources._answer_installed_lookup(spark)
    assert manager.dataSourceBuilders().isDefined() and manager.dataSourceBuilders().get().isEmpty()
    # The field is the one Spark's search fills: it still holds the empty answer once a source registers.
    spark.dataSource.register(_probe_source())
    assert manager.dataSourceBuilders().get().isEmpty()


def _probe_source() -> type:
    from pyspark.sql.datasource import DataSource

    class PrivateApisProbe(DataSource):
        @classmethod
        def name(cls) -> str:
            return "private_apis_probe"

        def schema(self) -> str:
            return "id long"

    return PrivateApisProbe


def test_long_array_literals_are_unsafe_array_data(spark: SparkSession) -> None:
    """``long_array`` falls back to a JSON literal without a word when Spark's UnsafeArrayData,
    Platform or Literal change: the literal it builds must be the unsafe one."""
    literal = spark._jsparkSession.expression(constant_lookup.long_array(spark, [3, -1, 2**63 - 1])._jc)
    assert literal.getClass().getSimpleName() == "Literal"
    assert literal.value().getClass().getName() == "org.apache.spark.sql.catalyst.expressions.UnsafeArrayData"
    assert spark.range(1).select(constant_lookup.long_array(spark, [3, -1, 2**63 - 1]).alias("a")).first()["a"] \
        == [3, -1, 2**63 - 1]


def test_the_schedulers_task_slots_are_the_local_masters_cores(spark: SparkSession) -> None:
    """``task_slots`` falls back to the default parallelism (4 in the test session, not 2) when
    ``SparkContext.maxNumConcurrentTasks`` moves; ``scheduler_slots`` is the private call itself."""
    assert spark.sparkContext.master == "local[2]"
    assert slots.scheduler_slots(spark) == 2
    assert slots.task_slots(spark) == 2


def test_an_observation_is_read_field_by_field_through_pysparks_handle(spark: SparkSession) -> None:
    observation = Observation("private_apis_observed")
    spark.range(5).observe(observation, long_list(F.col("id") * 3).alias("ids"), F.count("id").alias("n")) \
        .write.format("noop").mode("overwrite").save()
    row = observed_row(spark, observation, lambda name: name == "ids")
    assert row["n"] == 5
    assert sorted(longs(row["ids"]).tolist()) == [0, 3, 6, 9, 12]
