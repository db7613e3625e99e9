"""py4j answers from the JVM sent at once, not 40 ms late.

The JVM writes a py4j answer through an 8 KB buffer, so an answer past 8 KB leaves in several
writes on a socket with Nagle's algorithm on: the last write waits for the acknowledgement of
the first, which the Python side, only reading, delays by up to 40 ms. Every answer over 8 KB
paid that here: 41-47 ms for a 24 KB observed value against under 1 ms with TCP_NODELAY (a
MERGE reads its observed row positions as one text; plans, schemas and progress are others).
py4j does not set TCP_NODELAY, so we set it on the JVM's end of each connection we use.

PySpark pins a py4j connection to each Python thread; the JVM's end of it is the one of the
gateway's connections whose peer port is the Python end's own. The Python end is marked once
done, so the check costs an attribute read afterwards. Not reached: the connection a ``foreachBatch``
callback's thread calls back on, which the JVM opened and keeps in a pool of its own, not as
the thread's (py4j offers no way to it); those answers still wait.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pyspark.sql import SparkSession

from streaming_merge.spark.jvm import jvm_class, remember_pyspark_lookups
from streaming_merge.spark.per_context import PerContext

_MARK = "_streaming_merge_no_delay"
_connections: PerContext[Any] = PerContext(limit=8)


def ready_driver_thread(spark: SparkSession) -> None:
    """What an entry point (a MERGE, a sink batch) does first on the thread it runs on: PySpark's
    class lookups answered from Python (``jvm.remember_pyspark_lookups``) and the JVM's py4j
    answers sent at once. Cheap to repeat."""
    remember_pyspark_lookups(spark)
    answer_at_once(spark)


def answer_at_once(spark: SparkSession) -> None:
    """Set TCP_NODELAY on the JVM's end of this thread's py4j connection (once per connection;
    silently nothing where py4j or the JVM differ from what this expects)."""
    ours = _thread_connection(spark)
    if ours is None or getattr(ours, _MARK, False):
        return
    with contextlib.suppress(Exception):
        jvm_end = jvm_connection(spark, ours)
        if jvm_end is None:  # a callback's connection (see above)
            return
        jvm_end.getSocket().setTcpNoDelay(True)
        setattr(ours, _MARK, True)


def _thread_connection(spark: SparkSession) -> Any:
    """This thread's py4j connection (Python's end), opened if it has none yet."""
    client = getattr(spark.sparkContext._gateway, "_gateway_client", None)
    if client is None or not hasattr(client, "get_thread_connection"):  # not py4j's ClientServer
        return None
    if client.get_thread_connection() is None:
        jvm_class(spark, "java.lang.System").currentTimeMillis()  # any call opens it
    return client.get_thread_connection()


def jvm_connection(spark: SparkSession, ours: Any) -> Any:
    """The JVM's end of the connection Python opened as ``ours``: the one of the gateway's
    connections whose peer port is ours; None for a connection the JVM opened (a callback's)."""
    port = ours.socket.getsockname()[1]
    for connection in _server_connections(spark).toArray():
        if connection.getSocket().getPort() == port:
            return connection
    return None


def _server_connections(spark: SparkSession) -> Any:
    """The gateway's list of the connections Python opened (py4j's GatewayServer.connections),
    reached through the connection serving this call's JVM thread."""
    def find() -> Any:
        classes = jvm_class(spark, "java.lang.Class")
        target = classes.forName("java.lang.Thread").getDeclaredField("target")
        target.setAccessible(True)
        server_field = classes.forName("py4j.ClientServerConnection").getDeclaredField("javaServer")
        server_field.setAccessible(True)
        connections = classes.forName("py4j.GatewayServer").getDeclaredField("connections")
        connections.setAccessible(True)
        current = target.get(jvm_class(spark, "java.lang.Thread").currentThread())
        return connections.get(server_field.get(current))
    return _connections.get(spark.sparkContext, "connections", find)
