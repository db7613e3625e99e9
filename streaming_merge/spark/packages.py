"""Spark packages (``spark.jars.packages``) for a session this project starts: Spark's Kafka
connector, Delta Lake's jar and Hadoop's S3A connector (``hadoop-aws``), resolved by Spark's
Ivy from Maven Central alone with a cache of the project's own (``ivysettings.xml`` beside this
module says why)."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import pyspark

from streaming_merge.errors import InvalidArgumentError

__all__ = ["DELTA_VERSION", "IVY_HOME_ENV", "KAFKA_CONNECTOR", "S3A_CONNECTOR", "delta_package", "hadoop_version",
           "ivy_home", "kafka_connector", "package_conf", "s3a_connector"]

KAFKA_CONNECTOR = "kafka"
DELTA = "delta"
S3A_CONNECTOR = "s3a"
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


def hadoop_version() -> str:
    """The Hadoop client version of the installed PySpark (its ``hadoop-client-api-<v>.jar``):
    hadoop-aws must match it exactly, or S3A fails at run time with missing methods."""
    jar_folders = [Path(pyspark.__file__).parent / "jars"]
    if os.environ.get("SPARK_HOME"):
        jar_folders.append(Path(os.environ["SPARK_HOME"]) / "jars")
    for folder in jar_folders:
        for jar in sorted(folder.glob("hadoop-client-api-*.jar")):
            return jar.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    raise InvalidArgumentError(
        f"No hadoop-client-api-<version>.jar in {', '.join(map(str, jar_folders))}: cannot tell which hadoop-aws "
        "matches this Spark; pass its Maven coordinates (org.apache.hadoop:hadoop-aws:<version>) instead of 's3a'")


def s3a_connector() -> str:
    """Maven coordinates of Hadoop's S3A connector for the installed PySpark's Hadoop (it brings
    the AWS SDK bundle, a ~690 MB jar: fetched once into the Ivy cache)."""
    return f"org.apache.hadoop:hadoop-aws:{hadoop_version()}"


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
    """Session settings that add ``packages`` (``"kafka"``, ``"delta"``, ``"s3a"`` or Maven
    coordinates). Delta also gets its SQL extension and catalog, without which its commands do
    not run."""
    if not packages:
        return {}
    named = {KAFKA_CONNECTOR: kafka_connector, DELTA: delta_package, S3A_CONNECTOR: s3a_connector}
    coordinates = [named[name]() if name in named else name for name in packages]
    settings_file = resources.files("streaming_merge.spark").joinpath(IVY_SETTINGS_FILE)
    conf = {"spark.jars.packages": ",".join(coordinates), "spark.jars.ivySettings": str(settings_file),
            "spark.jars.ivy": str(ivy_home())}
    if DELTA in packages:
        conf["spark.sql.extensions"] = "io.delta.sql.DeltaSparkSessionExtension"
        conf["spark.sql.catalog.spark_catalog"] = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    return conf
