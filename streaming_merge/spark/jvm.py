"""JVM classes named in full, without py4j's walk through their packages.

``spark._jvm.org.apache.hadoop.fs.Path`` costs one round trip per dotted segment, and every
segment that is not a class (``org``, ``org.apache``, ...) is first looked for as a class in
each jar of the driver's class path and under each of the gateway's imports, on every use
(bench/private_apis.md has the cost per MERGE). A proxy made from the full name costs nothing until it is
called (a constructor call is then one round trip), and it keeps the methods it was asked
for, which py4j would otherwise look up in the JVM on every call.
"""

from __future__ import annotations

from typing import Any

from py4j.java_gateway import JavaClass, JavaMember
from pyspark.sql import SparkSession

from streaming_merge.spark.per_context import PerContext


def jvm_class(spark: SparkSession, name: str) -> JavaClass:
    """The JVM class ``name`` (fully qualified) of ``spark``'s gateway, the same proxy on every
    call so that its methods are looked up once (see _RememberingClass)."""
    context = spark.sparkContext
    gateway = context._gateway
    assert gateway is not None, "a SparkContext has a py4j gateway"
    return _classes.get(context, name, lambda: _RememberingClass(name, gateway._gateway_client))


# The classes PySpark itself looks up by name on every use: each Column function
# (``org.apache.spark.sql.functions``, then its method), each list of columns
# (``PythonUtils``, a bare name: first searched as a class in every jar, then under the
# gateway's imports), each observation. A 1k-row MERGE makes ~100 such lookups.
_PYSPARK_LOOKUPS = (
    "org.apache.spark.sql.functions",
    "functions",
    "PythonUtils",
    "org.apache.spark.sql.Observation",
    "org.apache.spark.sql.api.python.PythonSQLUtils",
    "org.apache.spark.storage.StorageLevel",
    "org.apache.spark.sql.classic.SparkSession",
)


_REMEMBERED = "_streaming_merge_remembered_"


class _RememberingClass(JavaClass):
    """A JVM class that asks the JVM what a member name is once, not on every access.

    Only methods are remembered: a static field's value may change, so it is read again."""

    def __getattr__(self, name: str) -> Any:
        member = super().__getattr__(name)
        if isinstance(member, JavaMember):
            self.__dict__[name] = member
        return member


_classes: PerContext[JavaClass] = PerContext(limit=256)


def remember_pyspark_lookups(spark: SparkSession) -> None:
    """Let the session's JVM view answer PySpark's own class lookups from Python.

    PySpark's JVM view (py4j's ``JVMView``) sends every ``getattr(jvm, name)`` to the JVM,
    and a class's method names likewise; the answers never change while the JVM lives. Each
    name is looked up once the usual way (so it names the same class, imports included) and
    kept in the view's own attributes, which Python reads before py4j's ``__getattr__``, with
    its methods remembered as they are first used. The view belongs to the SparkContext, so a
    new context starts without them. Idempotent and cheap to repeat. When PySpark looks up other
    names, tests/spark/test_private_apis.py names them.
    """
    view = spark.sparkContext._jvm
    if view is None or _REMEMBERED in vars(view):
        return
    for name in _PYSPARK_LOOKUPS:
        found = getattr(view, name)
        if isinstance(found, JavaClass):
            vars(view)[name] = jvm_class(spark, found._fqn)  # one proxy per class, shared with ours
    vars(view)[_REMEMBERED] = True
