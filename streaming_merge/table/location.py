"""Where a table lives, in the two spellings its two planes need.

Users name a table the way they name any Spark path: ``/lake/t``, ``lake/t``,
``file:///lake/t``, ``s3a://bucket/t``, ``abfss://c@acct.dfs.core.windows.net/t``. Such a
string is a Hadoop path string (not URL-encoded, exactly as ``spark.read.parquet`` takes
it), and Spark's Hadoop FileSystem qualifies it against the session's default file system:
on a cluster whose ``fs.defaultFS`` is HDFS, ``/lake/t`` is an HDFS table. The data files
are written there by Spark, so the log must be read and committed at the same place:
:class:`TableLocation` keeps the Hadoop-qualified form for Spark and the equivalent URL
(percent-encoded, ``file:///`` for local files) for delta-rs, plus the delta-rs storage
options (derived from the session's Hadoop configuration, overridden by explicit ones).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote

from pyspark.sql import SparkSession

from streaming_merge.errors import InvalidArgumentError
from streaming_merge.spark.jvm import jvm_class
from streaming_merge.table.option_check import checked_storage_options
from streaming_merge.table.storage_options import hadoop_getter, storage_options_for

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")
_ESCAPE_LIKE = re.compile(r"%[0-9A-Fa-f]{2}")


@dataclass(frozen=True)
class TableLocation:
    """A table's root, resolved once; equal locations are the same table."""

    uri: str  # Hadoop-qualified path string: "file:/lake/t", "s3a://bucket/t" (not URL-encoded)
    log_uri: str  # the same place as a URL for delta-rs: "file:///lake/t", "s3a://bucket/t"
    storage_options: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return self.uri

    @property
    def options(self) -> dict[str, str] | None:
        """delta-rs ``storage_options`` (None when there are none, delta-rs' own default)."""
        return dict(self.storage_options) or None

    def join(self, relative: str) -> str:
        """The Hadoop path string of a file or folder inside the table."""
        return f"{self.uri}/{relative}"


TableRef = str | TableLocation


def resolve(location: TableRef, spark: SparkSession | None = None,
            storage_options: Mapping[str, str] | None = None) -> TableLocation:
    """Qualify ``location`` with Spark's Hadoop FileSystem (the active session's when
    ``spark`` is None) and attach the delta-rs storage options for it.

    Without any SparkSession (a driver-side utility reading a table), a path without a
    scheme is a local path, as it is for delta-rs.
    """
    if isinstance(location, TableLocation):
        if not storage_options:
            return location
        merged = {**dict(location.storage_options), **checked_storage_options(location.uri, storage_options)}
        return TableLocation(location.uri, location.log_uri, tuple(sorted(merged.items())))
    if not isinstance(location, str) or not location.strip():
        raise InvalidArgumentError(f"A table location must be a non-empty path or URI, got {location!r}")
    spark = spark or SparkSession.getActiveSession()
    if spark is None:
        uri, log_uri = _qualify_locally(location)
        derived: dict[str, str] = {}
    else:
        uri, log_uri = _qualify_with_hadoop(spark, location)
        derived = storage_options_for(uri, hadoop_getter(spark))
    escape = _ESCAPE_LIKE.search(uri)
    if escape:
        raise InvalidArgumentError(
            f"The table location `{uri}` contains `{escape.group()}`, a percent sign followed by two hex "
            "digits: delta-rs (1.x) decodes it a second time and would look for the table's files elsewhere. "
            "Rename the folder (a `%` followed by anything else is fine)."
        )
    options = {**derived, **checked_storage_options(uri, storage_options or {})}
    return TableLocation(uri, log_uri, tuple(sorted(options.items())))


def _qualify_with_hadoop(spark: SparkSession, location: str) -> tuple[str, str]:
    path = jvm_class(spark, "org.apache.hadoop.fs.Path")(location)
    try:
        filesystem = path.getFileSystem(spark._jsc.hadoopConfiguration())
    except Exception as exc:  # py4j wraps e.g. UnsupportedFileSystemException: No FileSystem for scheme "s3a"
        raise InvalidArgumentError(
            f"Spark cannot reach the table location `{location}`: {str(exc).splitlines()[0]} "
            "(is the file system's connector, e.g. hadoop-aws for s3a://, on the classpath?)"
        ) from exc
    qualified = filesystem.makeQualified(path)
    return qualified.toString(), _delta_rs_url(qualified.toUri().toString())


def _delta_rs_url(hadoop_uri: str) -> str:
    """Hadoop prints local URIs as ``file:/x``; delta-rs (the ``url`` crate) wants ``file:///x``."""
    if hadoop_uri.startswith("file:/") and not hadoop_uri.startswith("file://"):
        return "file://" + hadoop_uri[len("file:"):]
    return hadoop_uri


def _qualify_locally(location: str) -> tuple[str, str]:
    if _SCHEME.match(location) and not location.lower().startswith("file:"):
        uri = location.rstrip("/")
        return uri, uri
    if location.lower().startswith("file:"):
        location = re.sub(r"^file:(//)?", "", location, flags=re.IGNORECASE)
    path = os.path.normpath(os.path.abspath(location))
    return f"file:{path}", "file://" + quote(path)


@dataclass(frozen=True)
class TableHandle:
    """What a builder (``merge()``, ``optimize()``) needs of a DeltaTable: its session, where
    the table is and its alias; a plain value, so the builders do not import DeltaTable, which
    imports them."""

    spark: SparkSession
    location: TableLocation
    alias_name: str
