"""py4j answers from the JVM sent at once, not 40 ms late.

The JVM writes a py4j answer through an 8 KB buffer, so an answer past 8 KB leaves in several
writes on a socket with Nagle's algorithm on: the last write waits for the acknowledgement of
the first, which the Python side, only reading, delays by up to 40 ms. A MERGE with deletion
vectors reads its observed row positions as texts of that size, the sink its observed id lists;
plans, schemas and progress are others. py4j has no setting for TCP_NODELAY, so we set it on the
JVM's end of each connection we use, through py4j's private fields (the gateway's list of
connections); bench/private_apis.md has the measured gain, tests/spark/test_answers_at_once.py
fails when a py4j upgrade moves them.

PySpark pins a py4j connection to each Python thread; the JVM's end of it is the one of the
gateway's connections whose peer port is the Python end's own. The Python end is marked once,
so the check costs an attribute read afterwards. A ``foreachBatch`` callback's thread calls
back on the connection the JVM opened for its own thread: the JVM's end of that one is the
callback client's connection for the thread serving the call (``getPerThreadConnection``),
checked by its local port, the Python end's peer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession

from streaming_merge.spark.jvm import jvm_class
from streaming_merge.spark.per_context import PerContext

_MARK = "_streaming_merge_no_delay"
_connections: PerContext[Any] = PerContext(limit=8)


def ready_driver_thread(spark: SparkSession) -> None:
    """What an entry point (a MERGE, a sink batch) does first on the thread it runs on: the JVM's
    py4j answers sent at once. Cheap to repeat."""
    answer_at_once(spark)


def answer_at_once(spark: SparkSession) -> None:
    """Set TCP_NODELAY on the JVM's end of this thread's py4j connection (once per connection;
    silently nothing where py4j or the JVM differ from what this expects)."""
    ours = _thread_connection(spark)
    if ours is None or getattr(ours, _MARK, False):
        return
    with contextlib.suppress(Exception):
        gateway = spark.sparkContext._gateway
        client = gateway._gateway_client  # type: ignore[union-attr]
        jvm_port = ours.socket.getpeername()[1]
        if jvm_port != client.java_parameters.port:  # the JVM opened it: a callback's
            setattr(ours, _MARK, True)  # whatever happens below, look once
            jvm_end = gateway.java_gateway_server.getCallbackClient().getPerThreadConnection()  # type: ignore[union-attr]
            if jvm_end is not None and jvm_end.getSocket().getLocalPort() == jvm_port:
                jvm_end.getSocket().setTcpNoDelay(True)
            return
        jvm_end = _find(_python_connections(spark), lambda socket: socket.getPort(), ours.socket.getsockname()[1])
        if jvm_end is not None:
            jvm_end.getSocket().setTcpNoDelay(True)
            setattr(ours, _MARK, True)


def _find(connections: Any, port_of: Callable[[Any], int], port: int) -> Any:
    for connection in connections.toArray():
        if port_of(connection.getSocket()) == port:
            return connection
    return None


def _thread_connection(spark: SparkSession) -> Any:
    """This thread's py4j connection (Python's end), opened if it has none yet."""
    client = getattr(spark.sparkContext._gateway, "_gateway_client", None)
    if client is None or not hasattr(client, "get_thread_connection"):  # not py4j's ClientServer
        return None
    if client.get_thread_connection() is None:
        jvm_class(spark, "java.lang.System").currentTimeMillis()  # any call opens it
    return client.get_thread_connection()


def _python_connections(spark: SparkSession) -> Any:
    """The gateway's list of the connections Python opened, one per Python thread (py4j's
    GatewayServer.connections), reached once per SparkContext through the connection serving
    this call's JVM thread, which must be one Python opened."""
    def find() -> Any:
        classes = jvm_class(spark, "java.lang.Class")

        def field(class_name: str, name: str) -> Any:
            found = classes.forName(class_name).getDeclaredField(name)
            found.setAccessible(True)
            return found

        current = field("java.lang.Thread", "target").get(jvm_class(spark, "java.lang.Thread").currentThread())
        server = field("py4j.ClientServerConnection", "javaServer").get(current)
        return field("py4j.GatewayServer", "connections").get(server)
    return _connections.get(spark.sparkContext, "connections", find)
