"""Registering a Python data source without Spark's search for installed ones.

The first registration in a JVM makes Spark search for data sources installed as ``pyspark_*``
modules, and it starts a Python process of its own for that, on the critical path of every
start and restart of a job whose source is a Python data source (bench/private_apis.md has the
measured share of a start). When the interpreter Spark would start is the driver's own and
nothing on its path could be such a module, that search can only find nothing, so we give Spark
that answer instead, in the private field where Spark keeps it (``DataSourceManager``'s
``dataSourceBuilders``). In any other case (another interpreter, a remote Python file for the
workers, a ``pyspark_*`` module on the path or in a local Python file or jar) Spark searches as
it always does; so does a Spark that moved the field, and tests/spark/test_private_apis.py then
fails.
"""

from __future__ import annotations

import contextlib
import os
import pkgutil
import shutil
import sys
from typing import Any

from pyspark.sql import SparkSession

from streaming_merge.spark.jvm import jvm_class

_MANAGER = "org.apache.spark.sql.execution.datasources.DataSourceManager$"
_INSTALLED_PREFIX = "pyspark_"  # what Spark's lookup worker imports (pyspark.sql.worker.lookup_data_sources)


def register_data_source(spark: SparkSession, source: type[Any]) -> None:
    """``spark.dataSource.register(source)``, answering Spark's one-off search for installed
    Python data sources from the driver when it provably finds nothing."""
    with contextlib.suppress(Exception):  # a Spark without this internal searches as usual
        _answer_installed_lookup(spark)
    spark.dataSource.register(source)


def _answer_installed_lookup(spark: SparkSession) -> None:
    manager = _manager(spark)
    if manager.dataSourceBuilders().isDefined() or not _lookup_would_find_nothing(spark):
        return
    empty = jvm_class(spark, "java.lang.Class").forName("scala.collection.immutable.Map$") \
        .getField("MODULE$").get(None).empty()
    getattr(manager, "dataSourceBuilders_$eq")(jvm_class(spark, "scala.Some")(empty))


def _manager(spark: SparkSession) -> Any:
    return jvm_class(spark, "java.lang.Class").forName(_MANAGER).getField("MODULE$").get(None)


def _lookup_would_find_nothing(spark: SparkSession) -> bool:
    """True when Spark's lookup would run this interpreter on no more than this process's path,
    and that path holds no ``pyspark_*`` module."""
    conf = spark.sparkContext.getConf()
    if conf.get("spark.pyspark.python"):
        return False
    extra_paths = _local_python_files(conf.get("spark.submit.pyFiles") or "")
    if extra_paths is None:
        return False
    system = jvm_class(spark, "java.lang.System")
    worker_python = system.getenv("PYSPARK_PYTHON") or system.getenv("PYSPARK_DRIVER_PYTHON") or "python3"
    if not _same_interpreter(worker_python):
        return False
    modules = [*pkgutil.iter_modules(), *pkgutil.iter_modules(extra_paths)]
    return not any(module.name.startswith(_INSTALLED_PREFIX) for module in modules)


def _local_python_files(py_files: str) -> list[str] | None:
    """The local paths of ``spark.submit.pyFiles`` (``--packages`` puts its jars there), which
    the lookup's worker would have on its path; None when one is remote or missing, since its
    contents cannot be listed here."""
    paths = []
    for entry in filter(None, (part.strip() for part in py_files.split(","))):
        path = entry.removeprefix("file://")
        if "://" in path or not os.path.exists(path):
            return None
        paths.append(path)
    return paths


def _same_interpreter(command: str) -> bool:
    """Whether ``command`` starts this very interpreter: compared by path, not resolved through
    symlinks, since a virtualenv's python is a link to the system one with another path."""
    found = shutil.which(command)
    return found is not None and os.path.abspath(found) == os.path.abspath(sys.executable)
