"""TCP_NODELAY on the JVM's end of the py4j connections (streaming_merge.spark.answers_at_once),
read back from the JVM: the main thread's, a new thread's (each has a connection of its own) and a
``foreachBatch`` callback's."""

from __future__ import annotations

import threading
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from streaming_merge.spark import answers_at_once as answers


def _jvm_no_delay(spark: SparkSession) -> bool:
    ours = answers._thread_connection(spark)
    jvm_end = answers._find(answers._python_connections(spark), lambda s: s.getPort(), ours.socket.getsockname()[1])
    return bool(jvm_end.getSocket().getTcpNoDelay())


def test_the_jvm_answers_every_thread_it_serves_at_once(spark: SparkSession) -> None:
    answers.answer_at_once(spark)
    assert _jvm_no_delay(spark)
    seen: list[tuple[bool, bool]] = []

    def in_a_new_thread() -> None:
        before = _jvm_no_delay(spark)  # a connection of its own, as py4j opened it
        answers.answer_at_once(spark)
        seen.append((before, _jvm_no_delay(spark)))

    thread = threading.Thread(target=in_a_new_thread)
    thread.start()
    thread.join()
    assert seen == [(False, True)]


def test_a_foreach_batch_callback_gets_its_answers_at_once(spark: SparkSession, tmp_path: Path) -> None:
    """The connection a callback's thread calls back on was opened by the JVM (its end is the
    callback client's connection for the thread serving the call)."""
    spark.range(3).write.parquet(str(tmp_path / "in"))
    seen: list[tuple[bool, bool]] = []

    def jvm_no_delay() -> bool:
        callback_client = spark.sparkContext._gateway.java_gateway_server.getCallbackClient()
        return bool(callback_client.getPerThreadConnection().getSocket().getTcpNoDelay())

    def batch(frame: DataFrame, batch_id: int) -> None:
        before = jvm_no_delay()
        answers.answer_at_once(spark)
        seen.append((before, jvm_no_delay()))

    query = (spark.readStream.schema("id long").parquet(str(tmp_path / "in")).writeStream.foreachBatch(batch)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination()
    assert seen == [(False, True)]
