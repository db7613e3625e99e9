"""The rows each file's deletion vector deletes, kept in memory once known.

Every scan of a file with a vector needs its deleted rows, and a stream merging into a table
with deletion vectors gives most files a new vector every batch. Read back from the store,
that is a request per vector per batch (a round trip each on an object store, and more every
batch as the table's files all come to carry one). So the positions are kept per vector, and
vectors are immutable (a change is a new vector with a new id), so an entry is never stale:

* what a commit of this process wrote is put here as it commits, so a writer never reads its
  own vectors back;
* what must be read is read in one call for all the vectors a scan needs, a ranged read per
  DV file (streaming_merge.table.deletion_vectors.read_deleted_rows_of).

The cache is bounded by bytes (least recently used out first) and shared by every table of
the process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np
import pyroaring

from streaming_merge.table.deletion_vectors import DeletionVector, read_deleted_rows_of
from streaming_merge.table.snapshot import DataFile, Snapshot

_CACHE_BYTES = 256 * 1024 * 1024
_cache: OrderedDict[tuple[str, str, str], np.ndarray] = OrderedDict()
_cache_bytes = 0
_lock = threading.Lock()


def deleted_positions(snapshot: Snapshot, file: DataFile) -> np.ndarray:
    """The row indexes of ``file`` that its deletion vector deletes, ascending (int64)."""
    return deleted_positions_of(snapshot, [file])[0]


def deleted_positions_of(snapshot: Snapshot, files: Sequence[DataFile]) -> list[np.ndarray]:
    """:func:`deleted_positions` of each of ``files`` (every one has a vector), the vectors not
    in memory read in one call."""
    table_url = snapshot.location.log_uri
    keys = [_key(table_url, f.path, _vector(f)) for f in files]
    found: list[np.ndarray | None] = []
    with _lock:
        for key in keys:
            positions = _cache.get(key)
            if positions is not None:
                _cache.move_to_end(key)
            found.append(positions)
    missing = [i for i, positions in enumerate(found) if positions is None]
    if missing:
        bitmaps = read_deleted_rows_of(table_url, snapshot.location.options,
                                       [(files[i].path, _vector(files[i])) for i in missing])
        read = [_as_positions(bitmap) for bitmap in bitmaps]
        _keep((keys[i], positions) for i, positions in zip(missing, read, strict=True))
        for i, positions in zip(missing, read, strict=True):
            found[i] = positions
    return [positions for positions in found if positions is not None]


def remember(table_url: str, vectors: Iterable[tuple[str, DeletionVector, pyroaring.AbstractBitMap64]]) -> None:
    """Keep the deleted rows of vectors just written (``(data file path, descriptor, rows)``)."""
    _keep((_key(table_url, path, vector), _as_positions(bitmap)) for path, vector, bitmap in vectors)


def _key(table_url: str, path: str, vector: DeletionVector) -> tuple[str, str, str]:
    return table_url, path, vector.unique_id


def _vector(file: DataFile) -> DeletionVector:
    assert file.deletion_vector is not None, f"{file.path} has no deletion vector"
    return file.deletion_vector


def _as_positions(bitmap: pyroaring.AbstractBitMap64) -> np.ndarray:
    return np.asarray(bitmap.to_array(), dtype=np.int64)


def _keep(entries: Iterable[tuple[tuple[str, str, str], np.ndarray]]) -> None:
    global _cache_bytes
    with _lock:
        for key, positions in entries:
            previous = _cache.pop(key, None)
            if previous is not None:
                _cache_bytes -= previous.nbytes
            _cache[key] = positions
            _cache_bytes += positions.nbytes
        while _cache_bytes > _CACHE_BYTES and len(_cache) > 1:
            _, evicted = _cache.popitem(last=False)
            _cache_bytes -= evicted.nbytes
