"""TCP_NODELAY on the JVM's end of the py4j connections (streaming_merge.spark.answers_at_once):
the main thread's and a new thread's (each has a connection of its own), read back from the JVM."""

from __future__ import annotations

import threading

from pyspark.sql import SparkSession

from streaming_merge.spark import answers_at_once


def _jvm_no_delay(spark: SparkSession) -> bool:
    ours = answers_at_once._thread_connection(spark)
    return bool(answers_at_once.jvm_connection(spark, ours).getSocket().getTcpNoDelay())


def test_the_jvm_answers_every_thread_it_serves_at_once(spark: SparkSession) -> None:
    answers_at_once.answer_at_once(spark)
    assert _jvm_no_delay(spark)
    seen: list[tuple[bool, bool]] = []

    def in_a_new_thread() -> None:
        before = _jvm_no_delay(spark)  # a connection of its own, as py4j opened it
        answers_at_once.answer_at_once(spark)
        seen.append((before, _jvm_no_delay(spark)))

    thread = threading.Thread(target=in_a_new_thread)
    thread.start()
    thread.join()
    assert seen == [(False, True)]
