"""JVM classes named in full, without py4j's walk through their packages.

``spark._jvm.org.apache.hadoop.fs.Path`` costs one round trip per dotted segment, and every
segment that is not a class (``org``, ``org.apache``, ...) is first looked for as a class in
each jar of the driver's class path and under each of the gateway's imports: about 1 ms per
name here, paid on every use. A proxy made from the full name costs nothing until it is
called (a constructor call is then one round trip).
"""

from __future__ import annotations

from py4j.java_gateway import JavaClass
from pyspark.sql import SparkSession


def jvm_class(spark: SparkSession, name: str) -> JavaClass:
    """The JVM class ``name`` (fully qualified) of ``spark``'s gateway."""
    return JavaClass(name, spark.sparkContext._gateway._gateway_client)
