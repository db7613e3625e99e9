"""JVM classes named in full, without py4j's walk through their packages.

``spark._jvm.org.apache.hadoop.fs.Path`` costs one round trip per dotted segment, and every
segment that is not a class (``org``, ``org.apache``, ...) is first looked for as a class in
each jar of the driver's class path and under each of the gateway's imports, on every use. A
proxy made from the full name (py4j's ``JavaClass``) costs nothing until it is called (a
constructor call is then one round trip).
"""

from __future__ import annotations

from py4j.java_gateway import JavaClass
from pyspark.sql import SparkSession

from streaming_merge.spark.per_context import PerContext


def jvm_class(spark: SparkSession, name: str) -> JavaClass:
    """The JVM class ``name`` (fully qualified) of ``spark``'s gateway, one proxy per name and
    SparkContext."""
    context = spark.sparkContext
    gateway = context._gateway
    assert gateway is not None, "a SparkContext has a py4j gateway"
    return _classes.get(context, name, lambda: JavaClass(name, gateway._gateway_client))


_classes: PerContext[JavaClass] = PerContext(limit=256)
