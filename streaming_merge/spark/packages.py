"""Spark packages (``spark.jars.packages``) for a session this project starts: Spark's Kafka
connector and Delta Lake's jar, resolved by Spark's Ivy from Maven Central alone with a cache
of the project's own (``ivysettings.xml`` beside this module says why)."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import pyspark

__all__ = ["DELTA_VERSION", "IVY_HOME_ENV", "KAFKA_CONNECTOR", "delta_package", "ivy_home", "kafka_connector",
           "package_conf"]

KAFKA_CONNECTOR = "kafka"
DELTA = "delta"
# The newest Delta Lake release whose jar Maven Central serves for Spark 4.2.
DELTA_VERSION = "4.4.0"
IVY_HOME_ENV = "STREAMING_MERGE_IVY_HOME"
IVY_SETTINGS_FILE = "ivysettings.xml"


def spark_version() -> str:
    """``major.minor.patch`` of the installed PySpark (a ``.dev`` suffix dropped)."""
    return ".".join(pyspark.__version__.split(".")[:3]).split(".dev")[0]


def kafka_connector() -> str:
    """Maven coordinates of Spark's Kafka connector for the installed PySpark."""
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version()}"


def delta_package() -> str:
    """Maven coordinates of Delta Lake's jar for the installed PySpark's minor version."""
    major_minor = ".".join(spark_version().split(".")[:2])
    return f"io.delta:delta-spark_{major_minor}_2.13:{DELTA_VERSION}"


def ivy_home() -> Path:
    """Where Spark's Ivy caches and retrieves the packages: ``STREAMING_MERGE_IVY_HOME``, else
    ``~/.cache/streaming_merge/ivy``."""
    configured = os.environ.get(IVY_HOME_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "streaming_merge" / "ivy"


def package_conf(packages: tuple[str, ...]) -> dict[str, str]:
    """Session settings that add ``packages`` (``"kafka"``, ``"delta"`` or Maven coordinates).
    Delta also gets its SQL extension and catalog, without which its commands do not run."""
    if not packages:
        return {}
    coordinates = [kafka_connector() if name == KAFKA_CONNECTOR else delta_package() if name == DELTA else name
                   for name in packages]
    settings_file = resources.files("streaming_merge.spark").joinpath(IVY_SETTINGS_FILE)
    conf = {"spark.jars.packages": ",".join(coordinates), "spark.jars.ivySettings": str(settings_file),
            "spark.jars.ivy": str(ivy_home())}
    if DELTA in packages:
        conf["spark.sql.extensions"] = "io.delta.sql.DeltaSparkSessionExtension"
        conf["spark.sql.catalog.spark_catalog"] = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    return conf
