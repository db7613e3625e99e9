"""Delta deletion vectors (DVs): the descriptor, the bitmap format, the DV file and its IO.

A DV marks rows of a data file as deleted without rewriting the file. MERGE needs to read
the DVs other writers left (their rows are gone from the table) and to write its own, so
both directions are implemented here, byte-compatible with Delta Spark and delta-rs:

* ``RoaringBitmapArray``: a little-endian magic number followed by the "portable" 64-bit
  Roaring serialization (bucket count, then per non-empty bucket its high-32-bit key and a
  portable 32-bit Roaring bitmap). pyroaring's ``BitMap64.serialize()`` produces exactly
  that portable 64-bit layout, so the bitmaps are built and parsed by CRoaring, never by
  hand.
* The DV file: a version byte, then per DV a big-endian size, the bitmap bytes and a
  big-endian CRC-32 of them. A descriptor's ``offset`` points at the size field, not at the
  bitmap (Delta Spark writes its first DV at offset 1, right after the version byte).
* Inline DVs live in the log as Z85 text of the bitmap bytes.

Storage is reached through obstore, one store per table root, with the same options
delta-rs gets (their names are translated where obstore spells them differently).
"""

from __future__ import annotations

import base64
import functools
import struct
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import obstore
import pyroaring
from obstore.exceptions import AlreadyExistsError

from streaming_merge.errors import DeltaTableError, InvalidArgumentError
from streaming_merge.table.store import NOT_FOUND, first_line, table_store

__all__ = [
    "DV_FILE_FORMAT_VERSION",
    "MAGIC",
    "DeletionVector",
    "WrittenDeletionVectors",
    "decode_bitmap",
    "delete_dv_file",
    "encode_bitmap",
    "parse_dv_file_entry",
    "read_deleted_rows",
    "read_deleted_rows_of",
    "serialize_dv_file",
    "write_deletion_vectors",
    "z85_decode",
    "z85_encode",
]

MAGIC = 1681511377  # RoaringBitmapArray, portable serialization
DV_FILE_FORMAT_VERSION = 1
_MAX_POSITION = 2**63 - 1  # Delta requires every bucket key's top bit to be 0 (Java reads keys signed)
_ENCODED_UUID_LENGTH = 20

# ---------------------------------------------------------------------------------------------
# Z85
# ---------------------------------------------------------------------------------------------

# ZeroMQ's Z85 alphabet (rfc.zeromq.org/spec/32). The stdlib's b85 (RFC 1924) computes the same
# digits (each big-endian 4-byte block as five base-85 digits, most significant first) with
# another alphabet, so translating between the two gives a C-speed Z85 codec.
_Z85 = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_B85 = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
_B85_TO_Z85 = bytes.maketrans(_B85, _Z85)
_Z85_TO_B85 = bytes.maketrans(_Z85, _B85)
_Z85_CHARS = frozenset(_Z85.decode("ascii"))


def z85_encode(data: bytes) -> str:
    """Z85 text of ``data``, whose length must be a multiple of 4 (Z85 has no padding rule;
    callers with unaligned data pad first, see :func:`_encode_inline`)."""
    if len(data) % 4:
        raise InvalidArgumentError(f"Z85 encodes whole 4-byte blocks; got {len(data)} bytes")
    return base64.b85encode(data).translate(_B85_TO_Z85).decode("ascii")


def z85_decode(text: str) -> bytes:
    """The bytes of Z85 ``text`` (length a multiple of 5); ValueError on anything else, so a
    damaged log entry is reported instead of silently decoding to other bytes."""
    if len(text) % 5:
        raise InvalidArgumentError(f"Z85 text must be whole 5-character blocks; got {len(text)} characters")
    if not _Z85_CHARS.issuperset(text):
        raise InvalidArgumentError("not Z85 text: it contains characters outside the Z85 alphabet")
    return base64.b85decode(text.encode("ascii").translate(_Z85_TO_B85))


def _encode_inline(data: bytes) -> str:
    """Z85 of a bitmap of any length, as Delta Spark writes inline DVs: unaligned data is
    padded with zero bytes to the next multiple of 4. ``sizeInBytes`` keeps the unpadded
    length, and readers cut the decoded bytes back to it (:func:`_decode_inline`)."""
    return z85_encode(data + b"\0" * (-len(data) % 4))


def _decode_inline(text: str, size_in_bytes: int) -> bytes:
    data = z85_decode(text)
    if len(data) < size_in_bytes:
        raise InvalidArgumentError(f"inline data holds {len(data)} bytes, fewer than sizeInBytes={size_in_bytes}")
    return data[:size_in_bytes]


# ---------------------------------------------------------------------------------------------
# The descriptor
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeletionVector:
    """A ``deletionVector`` descriptor of an ``add`` / ``remove`` action.

    ``storage_type``: ``'u'`` (file relative to the table root, named by a UUID), ``'i'``
    (inline Z85 bitmap) or ``'p'`` (absolute path). ``size_in_bytes`` is the bitmap's byte
    length (before Z85 for inline ones); ``cardinality`` the number of deleted rows.
    """

    storage_type: str
    path_or_inline_dv: str
    offset: int | None
    size_in_bytes: int
    cardinality: int

    def __post_init__(self) -> None:
        if self.storage_type not in ("u", "i", "p"):
            raise InvalidArgumentError(f"unknown deletion vector storageType {self.storage_type!r}")

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> DeletionVector:
        """From the log's JSON object (or a checkpoint row as a dict)."""
        offset = d.get("offset")
        return DeletionVector(
            storage_type=str(d["storageType"]),
            path_or_inline_dv=str(d["pathOrInlineDv"]),
            offset=None if offset is None else int(offset),
            size_in_bytes=int(d["sizeInBytes"]),
            cardinality=int(d["cardinality"]),
        )

    def to_json(self) -> dict[str, Any]:
        """The log's JSON object; ``offset`` is left out when None, as the protocol requires
        for inline DVs."""
        out: dict[str, Any] = {"storageType": self.storage_type, "pathOrInlineDv": self.path_or_inline_dv}
        if self.offset is not None:
            out["offset"] = self.offset
        out["sizeInBytes"] = self.size_in_bytes
        out["cardinality"] = self.cardinality
        return out

    @property
    def unique_id(self) -> str:
        """The DV half of a logical file's key ``(path, dvId)`` in log reconciliation."""
        base = self.storage_type + self.path_or_inline_dv
        return base if self.offset is None else f"{base}@{self.offset}"

    @property
    def is_inline(self) -> bool:
        return self.storage_type == "i"

    def relative_path(self) -> str | None:
        """Where the DV file is: for ``'u'`` the path relative to the table root
        (``<prefix>/deletion_vector_<uuid>.bin``, the prefix being whatever precedes the
        20-character Z85 UUID), for ``'p'`` the absolute path as written, None for inline."""
        if self.storage_type == "i":
            return None
        if self.storage_type == "p":
            return self.path_or_inline_dv
        text = self.path_or_inline_dv
        if len(text) < _ENCODED_UUID_LENGTH:
            raise InvalidArgumentError(f"relative DV path {text!r} is shorter than a Z85 UUID")
        prefix, encoded = text[:-_ENCODED_UUID_LENGTH], text[-_ENCODED_UUID_LENGTH:]
        name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
        return f"{prefix}/{name}" if prefix else name

    def describe(self) -> str:
        """How error messages name this DV: its file (and offset) or, inline, its unique id."""
        if self.storage_type == "i":
            return f"inline DV `{self.unique_id}`"
        try:
            where = self.relative_path()
        except ValueError:
            return f"DV `{self.unique_id}`"
        return f"DV file `{where}` (offset {self.offset or 0})"


# ---------------------------------------------------------------------------------------------
# RoaringBitmapArray
# ---------------------------------------------------------------------------------------------


def encode_bitmap(positions: pyroaring.AbstractBitMap64) -> bytes:
    """The RoaringBitmapArray bytes of ``positions`` (row indexes in the data file).

    CRoaring's portable 64-bit serialization writes only non-empty buckets, keys ascending,
    each a portable 32-bit bitmap: the layout Delta defines after its magic number. The copy
    is run-optimized first so runs of deleted rows cost a few bytes, as in Delta Spark.
    """
    if len(positions) and positions.max() > _MAX_POSITION:
        raise InvalidArgumentError(f"row index {positions.max()} exceeds 2**63 - 1, which Delta cannot store")
    compact = pyroaring.BitMap64(positions)
    compact.run_optimize()
    return struct.pack("<i", MAGIC) + compact.serialize()


def decode_bitmap(data: bytes) -> pyroaring.BitMap64:
    """The row indexes in RoaringBitmapArray ``data``; ValueError on a wrong magic number or
    bytes CRoaring cannot parse (its safe deserializer checks every length against the input)."""
    if len(data) < 12:
        raise InvalidArgumentError(f"a RoaringBitmapArray needs at least 12 bytes, got {len(data)}")
    (magic,) = struct.unpack_from("<i", data, 0)
    if magic != MAGIC:
        raise InvalidArgumentError(f"bad magic number {magic} (expected {MAGIC}): not a RoaringBitmapArray")
    try:
        bitmap = pyroaring.BitMap64.deserialize(data[4:])
    except ValueError as exc:
        raise InvalidArgumentError(f"corrupt RoaringBitmapArray: {exc}") from exc
    if len(bitmap) and bitmap.max() > _MAX_POSITION:
        raise InvalidArgumentError("a bucket key has its top bit set, which Delta forbids")
    return bitmap


# ---------------------------------------------------------------------------------------------
# DV files
# ---------------------------------------------------------------------------------------------


def serialize_dv_file(bitmaps: Sequence[bytes]) -> tuple[bytes, list[tuple[int, int]]]:
    """One DV file holding ``bitmaps`` (RoaringBitmapArray bytes each) and, per bitmap, the
    ``(offset, size_in_bytes)`` of its descriptor. ``offset`` is where the bitmap's size field
    starts (the first one is 1, after the version byte): that is what Delta's descriptors
    point at, and what readers seek to before reading the size."""
    parts = [bytes([DV_FILE_FORMAT_VERSION])]
    position = 1
    locations: list[tuple[int, int]] = []
    for data in bitmaps:
        locations.append((position, len(data)))
        parts += [struct.pack(">i", len(data)), data, struct.pack(">I", zlib.crc32(data))]
        position += 4 + len(data) + 4
    return b"".join(parts), locations


def parse_dv_file_entry(entry: bytes, size_in_bytes: int) -> bytes:
    """The bitmap bytes of one DV file entry (size field, bitmap, CRC-32), checked; ValueError
    names what does not match."""
    if len(entry) != 4 + size_in_bytes + 4:
        raise InvalidArgumentError(f"the file ends early: {len(entry)} of {4 + size_in_bytes + 4} bytes read")
    (stored_size,) = struct.unpack_from(">i", entry, 0)
    if stored_size != size_in_bytes:
        raise InvalidArgumentError(f"the file says the DV has {stored_size} bytes, the log says {size_in_bytes}")
    data = entry[4 : 4 + size_in_bytes]
    (stored_crc,) = struct.unpack_from(">I", entry, 4 + size_in_bytes)
    actual_crc = zlib.crc32(data)
    if stored_crc != actual_crc:
        raise InvalidArgumentError(f"CRC-32 mismatch (stored {stored_crc:#010x}, computed {actual_crc:#010x})")
    return data


def _dv_location(table_url: str, storage_options: Mapping[str, str] | None, dv: DeletionVector) -> tuple[Any, str]:
    """The store and object path of an on-disk DV. Absolute (``'p'``) paths inside the table
    use the table's store; others get a store of their own directory."""
    relative = dv.relative_path()
    assert relative is not None
    if dv.storage_type == "u":
        return table_store(table_url, storage_options), relative
    root = table_url.rstrip("/") + "/"
    if relative.startswith(root):
        return table_store(table_url, storage_options), unquote(relative[len(root) :])
    parent, _, name = relative.rpartition("/")
    return table_store(parent or "/", storage_options), unquote(name)


# ---------------------------------------------------------------------------------------------
# Reading and writing
# ---------------------------------------------------------------------------------------------


def read_deleted_rows(
    table_url: str, storage_options: Mapping[str, str] | None, data_file: str, dv: DeletionVector
) -> pyroaring.BitMap64:
    """The deleted row indexes of ``data_file`` under ``dv``, verified (see
    :func:`read_deleted_rows_of`)."""
    return read_deleted_rows_of(table_url, storage_options, [(data_file, dv)])[0]


# DV files read at once: each read is a round trip on an object store.
_CONCURRENT_FILE_READS = 8


def read_deleted_rows_of(
    table_url: str, storage_options: Mapping[str, str] | None, vectors: Sequence[tuple[str, DeletionVector]]
) -> list[pyroaring.BitMap64]:
    """The deleted row indexes of each ``(data file, dv)`` of ``vectors``, verified, in order.

    A commit's on-disk DVs share one DV file, so the entries are read per DV file: one ranged
    read each (obstore merges nearby ranges into one request), the DV files concurrently, where
    one GET per DV made a scan of a table whose every file has a vector pay a round trip per
    file. The size, checksum, magic number and cardinality are all checked against the
    descriptor: a wrong set of deleted rows would silently resurrect or lose rows. Every failure
    raises :class:`DeltaTableError` naming the table, the data file and the DV.
    """
    results: list[pyroaring.BitMap64 | None] = [None] * len(vectors)
    by_file: dict[tuple[int, str], list[int]] = {}
    stores: dict[int, Any] = {}
    for index, (data_file, dv) in enumerate(vectors):
        if dv.is_inline:
            results[index] = _verified(table_url, data_file, dv,
                                       functools.partial(_decode_inline, dv.path_or_inline_dv, dv.size_in_bytes))
            continue
        try:
            store, path = _dv_location(table_url, storage_options, dv)
        except Exception as exc:
            raise _unreadable(table_url, data_file, dv, first_line(exc)) from exc
        stores[id(store)] = store
        by_file.setdefault((id(store), path), []).append(index)

    def read_file(key: tuple[int, str]) -> None:
        store, path = stores[key[0]], key[1]
        indexes = by_file[key]
        starts = [vectors[i][1].offset or 0 for i in indexes]
        lengths = [4 + vectors[i][1].size_in_bytes + 4 for i in indexes]
        try:
            entries = obstore.get_ranges(store, path, starts=starts, lengths=lengths)
        except NOT_FOUND as exc:
            data_file, dv = vectors[indexes[0]]
            raise _unreadable(table_url, data_file, dv, "the DV file does not exist") from exc
        except Exception as exc:
            data_file, dv = vectors[indexes[0]]
            raise _unreadable(table_url, data_file, dv, first_line(exc)) from exc
        for i, entry in zip(indexes, entries, strict=True):
            data_file, dv = vectors[i]
            results[i] = _verified(table_url, data_file, dv,
                                   functools.partial(parse_dv_file_entry, bytes(entry), dv.size_in_bytes))

    files = list(by_file)
    if len(files) == 1:
        read_file(files[0])
    elif files:
        with ThreadPoolExecutor(min(_CONCURRENT_FILE_READS, len(files)), thread_name_prefix="dv-read") as pool:
            for done in [pool.submit(read_file, key) for key in files]:
                done.result()
    return [r for r in results if r is not None]


def _verified(table_url: str, data_file: str, dv: DeletionVector, bitmap_bytes: Callable[[], bytes]
              ) -> pyroaring.BitMap64:
    """The bitmap of ``bitmap_bytes()``, checked against the descriptor's cardinality."""
    try:
        bitmap = decode_bitmap(bitmap_bytes())
    except Exception as exc:
        raise _unreadable(table_url, data_file, dv, first_line(exc)) from exc
    if len(bitmap) != dv.cardinality:
        raise _unreadable(table_url, data_file, dv,
                          f"it holds {len(bitmap)} row indexes, the log says cardinality {dv.cardinality}")
    return bitmap


def _unreadable(table_url: str, data_file: str, dv: DeletionVector, reason: str) -> DeltaTableError:
    return DeltaTableError(
        f"Cannot read the {dv.describe()} of data file `{data_file}` in table `{table_url}`: {reason}")


@dataclass(frozen=True)
class WrittenDeletionVectors:
    """What :func:`write_deletion_vectors` wrote: one descriptor per input bitmap, in order,
    and the new DV file relative to the table root (None when every DV went inline), which
    the caller deletes if its commit fails, since no log entry will ever reference it."""

    descriptors: list[DeletionVector]
    file: str | None


def write_deletion_vectors(
    table_url: str,
    storage_options: Mapping[str, str] | None,
    bitmaps: Sequence[pyroaring.AbstractBitMap64],
    inline_max_bytes: int = 0,
) -> WrittenDeletionVectors:
    """Store DVs for ``bitmaps`` (deleted row indexes, one per data file).

    A bitmap whose RoaringBitmapArray has at most ``inline_max_bytes`` bytes goes inline into
    its descriptor; the others share ONE new file ``deletion_vector_<uuid4>.bin`` at the table
    root, written put-if-absent so nothing of another writer can be replaced. Empty bitmaps
    are refused: a file without deleted rows carries no DV.
    """
    encoded = []
    for i, bitmap in enumerate(bitmaps):
        if not len(bitmap):
            raise InvalidArgumentError(f"bitmap {i} is empty: a data file without deleted rows must not get a DV")
        encoded.append(encode_bitmap(bitmap))
    on_disk = [i for i, data in enumerate(encoded) if len(data) > inline_max_bytes]
    descriptors: list[DeletionVector | None] = [None] * len(encoded)
    for i, data in enumerate(encoded):
        if len(data) <= inline_max_bytes:
            descriptors[i] = DeletionVector("i", _encode_inline(data), None, len(data), len(bitmaps[i]))
    written: str | None = None
    if on_disk:
        file_id = uuid.uuid4()
        written = f"deletion_vector_{file_id}.bin"
        content, locations = serialize_dv_file([encoded[i] for i in on_disk])
        store = table_store(table_url, storage_options)
        try:
            obstore.put(store, written, content, mode="create")
        except AlreadyExistsError as exc:  # a UUID4 collision: practically impossible, never overwrite
            raise DeltaTableError(f"DV file `{written}` already exists in table `{table_url}`") from exc
        except Exception as exc:
            raise DeltaTableError(
                f"Cannot write DV file `{written}` in table `{table_url}`: {first_line(exc)}"
            ) from exc
        encoded_id = z85_encode(file_id.bytes)
        for i, (offset, size) in zip(on_disk, locations, strict=True):
            descriptors[i] = DeletionVector("u", encoded_id, offset, size, len(bitmaps[i]))
    return WrittenDeletionVectors([d for d in descriptors if d is not None], written)


def delete_dv_file(table_url: str, storage_options: Mapping[str, str] | None, relative_path: str) -> None:
    """Delete a DV file this process wrote but never committed; a missing file is fine
    (the cleanup may run twice)."""
    try:
        obstore.delete(table_store(table_url, storage_options), relative_path)
    except NOT_FOUND:
        pass
    except Exception as exc:
        raise DeltaTableError(
            f"Cannot delete DV file `{relative_path}` of table `{table_url}`: {first_line(exc)}"
        ) from exc
