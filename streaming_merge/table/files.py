"""Data-file IO on Spark's Hadoop FileSystem: list, delete, read Parquet footers.

Whatever file system connector and credentials the cluster's Spark has (s3a, abfss, gs,
hdfs, local) serve the table's data files here too; nothing in the table layer touches a
table path through the local file system. Only metadata crosses to the driver: a listing
and each written file's footer bytes (its tail), never the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from streaming_merge.errors import InvalidArgumentError
from streaming_merge.spark.jvm import jvm_class

_PARQUET_MAGIC = b"PAR1"
# A py4j answer longer than the gateway's 8 KiB write buffer leaves the JVM in two TCP
# segments, and the second waits ~40 ms for Python's delayed ACK (Nagle): a 64 KiB tail read
# took 48-52 ms, a 4 KiB one 3 ms. Bytes travel base64-encoded (4/3 longer), so every read
# stays under 6 KiB; a MERGE's footers (a few columns, one row group) fit in the first.
_READ_CHUNK = 4 * 1024


@dataclass(frozen=True)
class FileStatus:
    path: str  # Hadoop path string (not URL-encoded)
    size: int
    modification_time: int  # ms since the epoch, as the file system reports it


class HadoopFiles:
    """The session's Hadoop FileSystem for one root (a table or a folder in it)."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        self._hadoop_path = jvm_class(spark, "org.apache.hadoop.fs.Path")
        self._root = self._hadoop_path(root)
        self._fs = self._root.getFileSystem(spark._jsc.hadoopConfiguration())

    def _path(self, path: str) -> Any:
        return self._hadoop_path(path)

    def list_files(self, folder: str) -> list[FileStatus]:
        """Every file under ``folder`` (recursively); empty when it does not exist."""
        target = self._path(folder)
        if not self._fs.exists(target):
            return []
        found: list[FileStatus] = []
        pending = [target]
        # listStatus, not listFiles: listFiles builds a LocatedFileStatus per file, which reads
        # the file's permissions, and without Hadoop's native library the local file system
        # forks ``ls -ld`` from the driver JVM for each file to learn them.
        while pending:
            for status in self._fs.listStatus(pending.pop()):
                if status.isDirectory():
                    pending.append(status.getPath())
                else:
                    found.append(FileStatus(status.getPath().toString(), status.getLen(),
                                            status.getModificationTime()))
        return found

    def delete(self, path: str, recursive: bool = False) -> bool:
        return bool(self._fs.delete(self._path(path), recursive))

    def rename(self, source: str, destination: str) -> None:
        """Move a file (its destination's folders are made first, as a local file system needs);
        raises OSError when the file system refuses."""
        target = self._path(destination)
        self._fs.mkdirs(target.getParent())
        if not self._fs.rename(self._path(source), target):
            raise OSError(f"Could not move `{source}` to `{destination}`")

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self._path(path)))

    def read_footer(self, path: str, size: int) -> pq.FileMetaData:
        """The Parquet footer of ``path`` (``size`` bytes long), read from its tail.

        pyarrow parses a footer from a buffer that ends like the file does; the data pages
        are never fetched."""
        stream = self._fs.open(self._path(path))
        try:
            tail = self._read(stream, max(0, size - _READ_CHUNK), size)
            if tail[-4:] != _PARQUET_MAGIC:
                raise InvalidArgumentError(f"`{path}` is not a Parquet file (no PAR1 magic at its end)")
            footer_length = int.from_bytes(tail[-8:-4], "little")
            if footer_length + 8 > len(tail):  # a bigger footer: read what is missing
                tail = self._read(stream, size - footer_length - 8, size - len(tail)) + tail
        finally:
            stream.close()
        return pq.read_metadata(pa.BufferReader(_PARQUET_MAGIC + tail[-(footer_length + 8):]))

    @staticmethod
    def _read(stream: Any, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` of an open Hadoop stream, in small answers (see _READ_CHUNK)."""
        stream.seek(start)
        parts = []
        for offset in range(start, end, _READ_CHUNK):
            parts.append(bytes(stream.readNBytes(min(_READ_CHUNK, end - offset))))
        return b"".join(parts)
