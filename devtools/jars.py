"""Fetch and cache every jar the tests and benchmarks run: Apache Kafka's broker and Kafka
Connect (Maven Central, through ``mvn`` with a local repository of our own, so that ``~/.m2``
never gets the POM-only entries that break Spark's Ivy), Debezium's PostgreSQL connector
plugin, and the Spark packages (Spark's Kafka connector, Delta Lake, Hadoop's S3A connector with
the AWS SDK bundle, a ~690 MB jar) through Spark's Ivy.

``python -m devtools.jars`` fetches all of them once (``.ci/run`` does, before the tests); a
jar that cannot be had is an error here, never a skipped test. The cache is
``STREAMING_MERGE_JARS`` (default ``~/.cache/streaming_merge/jars``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

KAFKA_VERSION = "4.4.0"
DEBEZIUM_VERSION = "3.6.1.Final"
LOG4J_VERSION = "2.24.3"
CACHE_ENV = "STREAMING_MERGE_JARS"

_KAFKA_ARTIFACTS = (("org.apache.kafka", "kafka_2.13", KAFKA_VERSION),
                    ("org.apache.kafka", "kafka-tools", KAFKA_VERSION),
                    ("org.apache.kafka", "connect-runtime", KAFKA_VERSION),
                    ("org.apache.kafka", "connect-json", KAFKA_VERSION),
                    ("org.apache.logging.log4j", "log4j-slf4j2-impl", LOG4J_VERSION),
                    ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION))


class JarFetchError(RuntimeError):
    """Raised when an artifact cannot be fetched from Maven Central."""


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "streaming_merge" / "jars"


def _mvn(args: list[str], workdir: Path) -> None:
    if shutil.which("mvn") is None:
        raise JarFetchError("Maven (mvn) is not on PATH: it fetches Kafka's and Debezium's jars")
    command = ["mvn", "-q", "-B", f"-Dmaven.repo.local={cache_root() / 'm2'}", *args]
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise JarFetchError(f"{' '.join(command)} failed (exit {result.returncode}):\n"
                            f"{(result.stdout + result.stderr)[-3000:]}")


def _pom(artifacts: tuple[tuple[str, str, str], ...]) -> str:
    dependencies = "".join(f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
                           f"<version>{v}</version></dependency>" for g, a, v in artifacts)
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
            "<groupId>streaming_merge</groupId><artifactId>devtools-jars</artifactId><version>0</version>"
            f"<dependencies>{dependencies}</dependencies></project>")


def kafka_classpath() -> Path:
    """The folder of Apache Kafka's broker, tools and Kafka Connect jars (fetched once)."""
    folder = cache_root() / f"kafka-{KAFKA_VERSION}"
    if (folder / ".complete").exists():
        return folder
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "pom.xml").write_text(_pom(_KAFKA_ARTIFACTS))
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        _mvn(["dependency:copy-dependencies", f"-DoutputDirectory={partial}", "-DincludeScope=runtime"], Path(work))
    (partial / ".complete").touch()
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


def debezium_plugins() -> Path:
    """A Kafka Connect ``plugin.path`` folder holding Debezium's PostgreSQL connector (its
    published plugin archive, unpacked once)."""
    folder = cache_root() / f"debezium-{DEBEZIUM_VERSION}"
    if (folder / ".complete").exists():
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    artifact = f"io.debezium:debezium-connector-postgres:{DEBEZIUM_VERSION}:tar.gz:plugin"
    with tempfile.TemporaryDirectory() as work:
        _mvn(["dependency:copy", f"-Dartifact={artifact}", f"-DoutputDirectory={work}", "-Dtransitive=false"],
             Path(work))
        archives = list(Path(work).glob("*.tar.gz"))
        if not archives:
            raise JarFetchError(f"mvn dependency:copy of {artifact} left no archive")
        with tarfile.open(archives[0]) as archive:
            archive.extractall(partial, filter="data")
    (partial / ".complete").touch()
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


SPARK_PACKAGES = ("kafka", "delta", "s3a")


def spark_packages(names: tuple[str, ...] = SPARK_PACKAGES) -> None:
    """Resolve the Spark packages into Spark's Ivy cache: one driver JVM that starts with them
    and stops (a fresh cache takes about a minute; Ivy then only checks it, ~1-2 s)."""
    code = ("import sys; from pyspark.sql import SparkSession; "
            "from streaming_merge.spark.packages import package_conf; b = SparkSession.builder.master('local[1]'); "
            "[b.config(k, v) for k, v in package_conf(tuple(sys.argv[1:])).items()]; "
            "b.config('spark.ui.enabled', 'false').getOrCreate().stop()")
    result = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise JarFetchError(f"Spark could not resolve the packages {names}:\n{result.stderr[-3000:]}")


def main() -> None:
    print(f"Kafka {KAFKA_VERSION}: {kafka_classpath()}")
    print(f"Debezium {DEBEZIUM_VERSION}: {debezium_plugins()}")
    spark_packages()
    print("Spark packages: resolved")


if __name__ == "__main__":
    main()
