"""py4j answers from the JVM sent at once, not 40 ms late.

The JVM writes a py4j answer through an 8 KB buffer, so an answer past 8 KB leaves in several
writes on a socket with Nagle's algorithm on: the last write waits for the acknowledgement of
the first, which the Python side, only reading, delays by up to 40 ms. Every answer over 8 KB
paid that here: 41-47 ms for a 24 KB observed value against under 1 ms with TCP_NODELAY (a
MERGE reads its observed row positions as one text; plans, schemas and progress are others).
py4j does not set TCP_NODELAY, so we set it on the JVM's end of each connection we use.

PySpark pins a py4j connection to each Python thread (and a callback's thread uses the
connection the JVM called it on); py4j's ``PythonClient.getPerThreadConnection()``, called from
Python, runs in the JVM thread serving that connection and returns it. The Python side's
connection object is marked once done, so the check costs an attribute read afterwards.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pyspark.sql import SparkSession

from streaming_merge.spark.jvm import jvm_class
from streaming_merge.spark.per_context import PerContext

_MARK = "_streaming_merge_no_delay"
_python_clients: PerContext[Any] = PerContext(limit=8)


def answer_at_once(spark: SparkSession) -> None:
    """Set TCP_NODELAY on the JVM's end of this thread's py4j connection (once per connection;
    silently nothing where py4j or the JVM differ from what this expects)."""
    gateway = spark.sparkContext._gateway
    thread_connection = getattr(getattr(gateway, "_gateway_client", None), "get_thread_connection", None)
    if thread_connection is None:  # not py4j's ClientServer (pinned threads off)
        return
    ours = thread_connection()
    if ours is not None and getattr(ours, _MARK, False):
        return
    with contextlib.suppress(Exception):
        client = _python_clients.get(spark.sparkContext, "client", lambda: _python_client(spark))
        if client is not None:
            connection = client.getPerThreadConnection()
            if connection is not None:
                connection.getSocket().setTcpNoDelay(True)
        ours = thread_connection()
        if ours is not None:
            setattr(ours, _MARK, True)


def _python_client(spark: SparkSession) -> Any:
    """py4j's PythonClient of the gateway, reached from a connection thread of the JVM (this
    thread's, or any other's)."""
    classes = jvm_class(spark, "java.lang.Class")
    target = classes.forName("java.lang.Thread").getDeclaredField("target")
    target.setAccessible(True)
    connection_class = classes.forName("py4j.ClientServerConnection")
    python_client = connection_class.getDeclaredField("pythonClient")
    python_client.setAccessible(True)
    threads = jvm_class(spark, "java.lang.Thread")
    current = target.get(threads.currentThread())
    candidates = [current] if current is not None and connection_class.isInstance(current) else [
        target.get(thread) for thread in threads.getAllStackTraces().keySet()]
    for runnable in candidates:
        if runnable is not None and connection_class.isInstance(runnable):
            return python_client.get(runnable)
    return None
