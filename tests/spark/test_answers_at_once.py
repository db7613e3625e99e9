"""TCP_NODELAY on the JVM's end of the py4j connections (streaming_merge.spark.answers_at_once),
read back from the JVM: the main thread's and a new thread's (each has a connection of its own)."""

from __future__ import annotations

import threading

from pyspark.sql import SparkSession

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
